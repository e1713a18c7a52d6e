#include "hetpar/planner/deepep.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "hetpar/core/check.h"

namespace hetpar::planner {
namespace {

// DeepEP's get_dispatch_config and get_combine_config for one group size, by the token
// counts that size its buffers (deep_ep/buffer.py, deepseek-ai/DeepEP dcfd954). Both
// configurations of a size buffer as many tokens; they differ in the RDMA chunks they send.
struct DeepEpConfigs {
  int ranks;
  int nvl_recv_tokens;      // num_max_nvl_chunked_recv_tokens
  int rdma_recv_tokens;     // num_max_rdma_chunked_recv_tokens, before alignment
  int rdma_send_tokens[2];  // num_max_rdma_chunked_send_tokens: dispatch, combine
};

constexpr std::array<DeepEpConfigs, 10> kConfigs{{{2, 256, 128, {6, 6}},
                                                  {4, 256, 128, {6, 6}},
                                                  {8, 256, 128, {6, 6}},
                                                  {16, 288, 128, {20, 12}},
                                                  {24, 288, 128, {32, 8}},
                                                  {32, 288, 128, {32, 8}},
                                                  {64, 288, 128, {28, 20}},
                                                  {128, 560, 128, {32, 12}},
                                                  {144, 720, 128, {12, 8}},
                                                  {160, 720, 128, {12, 8}}}};

const DeepEpConfigs* find(int ranks) {
  for (const DeepEpConfigs& c : kConfigs)
    if (c.ranks == ranks) return &c;
  return nullptr;
}

int64_t align(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}

// Per buffered token beside its hidden bytes (config.hpp): the source metadata (SourceMeta,
// two ints), 128 top-k indices (int64), 128 top-k weights and 128 scales (float).
constexpr int64_t kSourceMeta = 8;
constexpr int64_t kTopK = 128, kScales = 128;
constexpr int64_t kPerToken = kSourceMeta + kTopK * 8 + kTopK * 4 + kScales * 4;

// Config::get_nvl_buffer_size_hint.
int64_t nvl_bytes(const DeepEpConfigs& c, int64_t hidden_bytes) {
  const int64_t channels = kDeepEpSms / 2;
  const int64_t rdma = std::max(c.ranks / kDeepEpNvlPeers, 1);
  const int64_t nvl = std::min(c.ranks, kDeepEpNvlPeers);
  const int64_t b = channels * nvl * (2 * rdma + 3) * 4 +
                    channels * nvl * c.nvl_recv_tokens * (hidden_bytes + kPerToken);
  return align(b, 128);
}

// Config::get_rdma_buffer_size_hint of the configuration sending `send` tokens a chunk
// (Config aligns the receive count to it): send and receive halves; none inside one node.
int64_t rdma_bytes(const DeepEpConfigs& c, int send, int64_t hidden_bytes) {
  if (c.ranks <= kDeepEpNvlPeers) return 0;
  const int64_t channels = kDeepEpSms / 2;
  const int64_t rdma = c.ranks / kDeepEpNvlPeers;
  const int64_t recv = align(c.rdma_recv_tokens, send);
  const int64_t b = channels * rdma * (kDeepEpNvlPeers * 2 + 2) * 2 * 4 +
                    channels * rdma * recv * 2 * (hidden_bytes + kPerToken + 16) +
                    (int64_t{1} << 20);
  return align(b, 128);
}

}  // namespace

double deepep_rail_share(const models::MoeSpec& moe, int64_t nodes) {
  if (nodes <= 1) return 0;
  const int64_t experts = moe.experts, top_k = moe.top_k;
  HETPAR_CHECK(experts % nodes == 0 && top_k >= 1, "{} experts over {} nodes", experts, nodes);
  const int64_t groups = moe.groups > 0 ? moe.groups : 1;
  const int64_t chosen = moe.groups > 0 ? moe.group_topk : 1;
  const int64_t per_group = experts / groups, per_node = experts / nodes;
  const int64_t pool = chosen * per_group;  // the experts a token's groups hold
  // C(pool - s, k) / C(pool, k): none of the token's top_k experts among s of the pool.
  auto none_of = [&](int64_t s) {
    double p = 1.0;
    for (int64_t i = 0; i < top_k; ++i)
      p *= std::max(0.0, static_cast<double>(pool - s - i)) / static_cast<double>(pool - i);
    return p;
  };
  auto log_choose = [](int64_t n, int64_t k) {
    return std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0);
  };
  // Groups aligned with nodes (or none): every node alike, node 0 stands for all; it runs on
  // the search's path, once per layout.
  const bool alike = per_node % per_group == 0 || per_group % per_node == 0;
  std::vector<double> misses;
  for (int64_t node = 0; node < (alike ? 1 : nodes); ++node) {
    // The node's experts in each group it overlaps.
    const int64_t lo = node * per_node, hi = lo + per_node;
    std::vector<int64_t> overlap;
    for (int64_t g = lo / per_group; g * per_group < hi; ++g)
      overlap.push_back(std::min(hi, (g + 1) * per_group) - std::max(lo, g * per_group));
    const auto n = static_cast<int64_t>(overlap.size());
    // ways[m][s]: subsets of the overlapping groups, m of them holding s of the node's experts.
    std::vector<std::vector<double>> ways(n + 1, std::vector<double>(per_node + 1, 0.0));
    ways[0][0] = 1;
    for (int64_t c : overlap)
      for (int64_t m = n - 1; m >= 0; --m)
        for (int64_t s = per_node - c; s >= 0; --s) ways[m + 1][s + c] += ways[m][s];
    double miss = 0;
    for (int64_t m = 0; m <= std::min(n, chosen); ++m) {
      if (chosen - m > groups - n) continue;
      // P(exactly these m of the overlapping groups among the chosen ones)
      const double pick = std::exp(log_choose(groups - n, chosen - m) - log_choose(groups, chosen));
      for (int64_t s = 0; s <= per_node; ++s)
        if (ways[m][s] > 0) miss += ways[m][s] * pick * none_of(s);
    }
    misses.push_back(miss);
  }
  // Nodes alike: node 0's miss; otherwise the mean over the nodes.
  double miss = misses.front();
  if (!alike) {
    miss = 0;
    for (double x : misses) miss += x / static_cast<double>(nodes);
  }
  return (1.0 - miss) / static_cast<double>(top_k) * static_cast<double>(nodes);
}

double deepep_nvlink_share(const models::MoeSpec& moe, int64_t ep) {
  return ep <= 1 ? 1.0 : deepep_rail_share(moe, ep);
}

bool deepep_supports(int ranks) {
  return find(ranks) != nullptr;
}

Bytes deepep_buffer_bytes(int ranks, int64_t hidden) {
  const DeepEpConfigs* c = find(ranks);
  HETPAR_CHECK(c && hidden >= 1, "DeepEP has no configuration for {} ranks", ranks);
  const int64_t hidden_bytes = hidden * 2;  // bf16 activations (fp8 ones count 2 bytes too)
  constexpr int64_t kWorkspace = int64_t{32} << 20;  // NUM_WORKSPACE_BYTES
  return Bytes(nvl_bytes(*c, hidden_bytes) +
               std::max(rdma_bytes(*c, c->rdma_send_tokens[0], hidden_bytes),
                        rdma_bytes(*c, c->rdma_send_tokens[1], hidden_bytes)) +
               kWorkspace);
}

Bytes hybridep_buffer_bytes(int64_t tokens, int64_t hidden, int64_t local_experts,
                            int64_t ranks_per_node, int64_t nodes) {
  HETPAR_CHECK(
      tokens >= 1 && hidden >= 1 && local_experts >= 1 && ranks_per_node >= 1 && nodes >= 1,
      "hybridep_buffer_bytes({}, {}, {}, {}, {})", tokens, hidden, local_experts, ranks_per_node,
      nodes);
  const int64_t t = std::max<int64_t>(tokens, 512);  // HybridEPBuffer's floor
  const int64_t r = ranks_per_node, n = nodes, e = local_experts;
  const int64_t token = 2 * hidden;                   // BF16
  const int64_t probs = 4 * e * r;                    // fp32, the node's experts
  const int64_t scales = 4 * ((hidden + 127) / 128);  // fp32, one per 128 elements
  const int64_t m = t * r * n;                        // the group's tokens, all to one rank
  int64_t bytes = m * (token + probs + scales)        // NVLink: combine = dispatch buffers
                  + (e * r * n) * (t * r * n);        // the routing map, all-gathered
  if (n > 1)                                          // RDMA: dispatch and combine staging
    bytes += t * (token + 4 * e * r * n + scales) + (n - 1) * t * (token + probs + scales) +
             2 * (n - 1) * t * (token + probs);
  return Bytes(bytes);
}

}  // namespace hetpar::planner
