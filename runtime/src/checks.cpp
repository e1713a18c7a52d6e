#include "checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace hetpar::runtime {

Status check_buffer(std::string_view what, const Buffer& b, int64_t elements, DType t) {
  const int64_t need = elements * dtype_bytes(t);
  if (elements < 0) return Status::invalid_argument(fmt::format("{}: negative size", what));
  if (need > 0 && b.empty()) return Status::invalid_argument(fmt::format("{}: no buffer", what));
  if (b.size().count() < need) {
    return Status::invalid_argument(fmt::format("{}: buffer of {} bytes, needs {} ({} x {})", what,
                                                b.size().count(), need, elements, to_string(t)));
  }
  return Status::ok();
}

Status check_gemm(const GemmDesc& d, const Buffer& a, const Buffer& b, const Buffer& c) {
  if (d.m <= 0 || d.n <= 0 || d.k <= 0 || d.batch <= 0) {
    return Status::invalid_argument(fmt::format(
        "gemm: m, n, k and batch must be positive, got {}x{}x{} batch {}", d.m, d.n, d.k, d.batch));
  }
  HETPAR_RETURN_IF_ERROR(check_buffer("gemm A", a, d.m * d.k * d.batch, d.dtype));
  HETPAR_RETURN_IF_ERROR(check_buffer("gemm B", b, d.k * d.n * d.batch, d.dtype));
  return check_buffer("gemm C", c, d.m * d.n * d.batch, d.c_dtype());
}

int64_t attention_q_elements(const AttentionDesc& d) {
  return d.batch * d.seq_q * d.heads * d.head_dim;
}
int64_t attention_kv_elements(const AttentionDesc& d) {
  return d.batch * d.seq_kv * d.kv_heads * d.head_dim;
}
int64_t attention_stats_elements(const AttentionDesc& d) {
  return d.batch * d.heads * d.seq_q;
}

namespace {
Status check_attention_shape(const AttentionDesc& d) {
  if (d.batch <= 0 || d.heads <= 0 || d.kv_heads <= 0 || d.seq_q <= 0 || d.seq_kv <= 0 ||
      d.head_dim <= 0) {
    return Status::invalid_argument(
        fmt::format("attention: batch, heads, kv_heads, seq_q, seq_kv and head_dim must be "
                    "positive, got {}, {}, {}, {}, {}, {}",
                    d.batch, d.heads, d.kv_heads, d.seq_q, d.seq_kv, d.head_dim));
  }
  if (d.heads % d.kv_heads != 0) {
    return Status::invalid_argument(
        fmt::format("attention: kv_heads {} must divide heads {}", d.kv_heads, d.heads));
  }
  if (d.dtype == DType::kF8E4M3) {
    return Status::invalid_argument("attention: fp8 is not supported (use bf16 or fp16)");
  }
  return Status::ok();
}

Status check_sinks(const char* what, const AttentionDesc& d, const Buffer* sinks) {
  if (!d.sinks) {
    if (sinks != nullptr)
      return Status::invalid_argument(
          fmt::format("attention: {} given for a desc without sinks", what));
    return Status::ok();
  }
  if (sinks == nullptr)
    return Status::invalid_argument(fmt::format("attention: sinks set but {} is null", what));
  return check_buffer(fmt::format("attention {}", what), *sinks, d.heads, DType::kF32);
}
}  // namespace

Status check_attention(const AttentionDesc& d, const Buffer& q, const Buffer& k, const Buffer& v,
                       const Buffer* sinks, const Buffer& out, const Buffer& stats) {
  HETPAR_RETURN_IF_ERROR(check_attention_shape(d));
  HETPAR_RETURN_IF_ERROR(check_sinks("sinks", d, sinks));
  HETPAR_RETURN_IF_ERROR(check_buffer("attention q", q, attention_q_elements(d), d.dtype));
  HETPAR_RETURN_IF_ERROR(check_buffer("attention k", k, attention_kv_elements(d), d.dtype));
  HETPAR_RETURN_IF_ERROR(check_buffer("attention v", v, attention_kv_elements(d), d.dtype));
  HETPAR_RETURN_IF_ERROR(check_buffer("attention out", out, attention_q_elements(d), d.dtype));
  return check_buffer("attention softmax_stats", stats, attention_stats_elements(d), DType::kF32);
}

Status check_attention_backward(const AttentionDesc& d, const Buffer& q, const Buffer& k,
                                const Buffer& v, const Buffer* sinks, const Buffer& out,
                                const Buffer& d_out, const Buffer& stats, const Buffer& d_q,
                                const Buffer& d_k, const Buffer& d_v, const Buffer* d_sinks) {
  HETPAR_RETURN_IF_ERROR(check_attention(d, q, k, v, sinks, out, stats));
  HETPAR_RETURN_IF_ERROR(check_sinks("d_sinks", d, d_sinks));
  HETPAR_RETURN_IF_ERROR(check_buffer("attention d_out", d_out, attention_q_elements(d), d.dtype));
  HETPAR_RETURN_IF_ERROR(check_buffer("attention d_q", d_q, attention_q_elements(d), d.dtype));
  HETPAR_RETURN_IF_ERROR(check_buffer("attention d_k", d_k, attention_kv_elements(d), d.dtype));
  return check_buffer("attention d_v", d_v, attention_kv_elements(d), d.dtype);
}

Status check_elementwise(const ElementwiseDesc& d, std::span<const Buffer* const> inputs,
                         const Buffer& out) {
  const int want = elementwise_inputs(d.op);
  if (static_cast<int>(inputs.size()) != want) {
    return Status::invalid_argument(
        fmt::format("elementwise: op takes {} inputs, got {}", want, inputs.size()));
  }
  if (d.elements < 0) return Status::invalid_argument("elementwise: negative element count");
  if (d.op == ElementwiseOp::kRmsNorm || d.op == ElementwiseOp::kRmsNormBackward) {
    if (d.row_size <= 0 || d.elements % d.row_size != 0) {
      return Status::invalid_argument(
          fmt::format("elementwise: row_size {} must be positive and divide elements {}",
                      d.row_size, d.elements));
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == nullptr) {
      return Status::invalid_argument(fmt::format("elementwise: input {} is null", i));
    }
    HETPAR_RETURN_IF_ERROR(
        check_buffer(fmt::format("elementwise input {}", i), *inputs[i], d.elements, d.dtype));
  }
  return check_buffer("elementwise out", out, d.elements, d.dtype);
}

Status check_group_ranks(std::span<const int> ranks, int world) {
  if (ranks.empty()) return Status::invalid_argument("make_group: no ranks");
  std::vector<int> sorted(ranks.begin(), ranks.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= world) {
      return Status::invalid_argument(
          fmt::format("make_group: rank {} outside the world of {}", sorted[i], world));
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return Status::invalid_argument(fmt::format("make_group: rank {} listed twice", sorted[i]));
    }
  }
  return Status::ok();
}

Result<Group> new_group(std::span<const int> ranks, int world, int64_t id, int me) {
  HETPAR_RETURN_IF_ERROR(check_group_ranks(ranks, world));
  Group g;
  g.id = id;
  g.ranks.assign(ranks.begin(), ranks.end());
  auto it = std::find(ranks.begin(), ranks.end(), me);
  g.rank = it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
  return g;
}

Status check_root(std::string_view op, const Group& g, int root) {
  if (root < 0 || root >= g.size()) {
    return Status::invalid_argument(
        fmt::format("{}: root {} is not a position in a group of {}", op, root, g.size()));
  }
  return Status::ok();
}

Status check_peer(std::string_view op, int peer, int world, int me, int64_t count,
                  int64_t max_count) {
  HETPAR_RETURN_IF_ERROR(check_count(op, count));
  if (count > max_count) {
    return Status::invalid_argument(
        fmt::format("{}: {} elements exceed the backend's limit of {}", op, count, max_count));
  }
  if (peer < 0 || peer >= world || peer == me) {
    return Status::invalid_argument(
        fmt::format("{}: peer {} must be another rank of the world of {}", op, peer, world));
  }
  return Status::ok();
}

Status check_member(std::string_view op, const Group& g, int64_t groups) {
  if (g.id < 0 || g.id >= groups) {
    return Status::invalid_argument(
        fmt::format("{}: group {} was not made by this backend", op, g.id));
  }
  if (g.rank < 0) {
    return Status::invalid_argument(
        fmt::format("{}: this rank is not a member of group {}", op, g.id));
  }
  return Status::ok();
}

Status check_count(std::string_view op, int64_t count) {
  if (count < 0) return Status::invalid_argument(fmt::format("{}: negative count", op));
  return Status::ok();
}

Result<bool> check_collective(std::string_view op, Collective c, const Group& g, const Buffer& send,
                              const Buffer& recv, int64_t count, DType t) {
  HETPAR_RETURN_IF_ERROR(check_count(op, count));
  const int64_t n = g.size();
  const bool gathers = c == Collective::kAllGather, scatters = c == Collective::kReduceScatter;
  const int64_t send_count = (scatters || c == Collective::kAllToAll) ? count * n : count;
  const int64_t recv_count = (gathers || c == Collective::kAllToAll) ? count * n : count;
  HETPAR_RETURN_IF_ERROR(check_buffer(fmt::format("{} send", op), send, send_count, t));
  HETPAR_RETURN_IF_ERROR(check_buffer(fmt::format("{} recv", op), recv, recv_count, t));
  const int64_t es = dtype_bytes(t), slot = g.rank * count * es;
  const auto* s = static_cast<const std::byte*>(send.data());
  const auto* r = static_cast<const std::byte*>(recv.data());
  const bool in_place = (c == Collective::kAllReduce && s == r) || (gathers && s == r + slot) ||
                        (scatters && r == s + slot);
  if (in_place || s >= r + recv_count * es || r >= s + send_count * es) return in_place;
  return Status::invalid_argument(fmt::format("{}: send and recv overlap other than in place", op));
}

Status check_stream(Stream s) {
  if (s.index < 0 || s.index > 64) {
    return Status::invalid_argument(fmt::format("stream {}: index must be in 0..64", s.index));
  }
  return Status::ok();
}

}  // namespace hetpar::runtime
