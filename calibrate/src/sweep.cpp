#include "hetpar/calibrate/sweep.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>

namespace hetpar::calibrate {

using hardware::Collective;
using hardware::CollectiveScope;
using runtime::Backend;
using runtime::Buffer;
using runtime::DType;
using runtime::Group;
using runtime::kComputeStream;

namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;

std::vector<int64_t> geometric(int64_t from, int64_t to, int64_t factor) {
  std::vector<int64_t> v;
  for (int64_t s = from; s <= to; s *= factor) v.push_back(s);
  return v;
}

runtime::AttentionDesc attention(int64_t batch, int64_t heads, int64_t seq, int64_t head_dim,
                                 DType t, bool causal = true) {
  runtime::AttentionDesc d;
  d.batch = batch;
  d.heads = heads;
  d.kv_heads = heads;
  d.seq_q = d.seq_kv = seq;
  d.head_dim = head_dim;
  d.causal = causal;
  d.dtype = t;
  return d;
}

}  // namespace

SweepPlan default_plan(std::string_view backend, bool quick) {
  SweepPlan p;
  const bool cpu = backend == "cpu";
  // The cpu backend computes every dtype in fp32 (backend.h): measure what it runs.
  p.gemm_dtypes = {cpu ? DType::kF32 : DType::kBf16};
  const DType att = p.gemm_dtypes.front();
  p.compute_on_every_rank = !cpu;
  if (quick) {
    p.gemms = {{64, 64, 64},   {128, 128, 128}, {256, 256, 256},  {512, 512, 512}, {16, 512, 512},
               {512, 16, 512}, {512, 512, 16},  {512, 128, 1024}, {1024, 512, 128}};
    if (!cpu)
      p.gemms = {{4096, 4096, 4096},
                 {16, 4096, 4096},
                 {4096, 512, 4096},
                 {8192, 8192, 8192},
                 {2048, 14336, 4096}};
    // Several key lengths: the shorter ones give the profile's seq-scale curve.
    // Each length causal (a decoder's call) and unmasked (an encoder's, a CP ring's steps off
    // the diagonal): their ratio is the profile's noncausal_scale.
    // And causal at half the head dim: the two give the time per score element (the
    // softmax), which weighs more the smaller the head.
    for (int64_t seq : cpu ? std::vector<int64_t>{32, 64, 128, 256}
                           : std::vector<int64_t>{512, 1024, 2048, 4096}) {
      const int64_t d = cpu ? 64 : 128;
      for (bool causal : {true, false})
        p.attention.push_back(attention(1, cpu ? 4 : 16, seq, d, att, causal));
      p.attention.push_back(attention(1, cpu ? 4 : 16, seq, d / 2, att, true));
    }
    // Copies larger than the last-level cache (32 MiB on the CI machine's EPYC), so the
    // fit sees memory, not cache, bandwidth.
    p.copy_bytes = cpu ? std::vector<int64_t>{64 * kMiB, 128 * kMiB, 256 * kMiB}
                       : std::vector<int64_t>{64 * kMiB, 256 * kMiB, kGiB};
    p.host_copy_bytes = cpu ? 64 * kMiB : 256 * kMiB;
    p.p2p_bytes = geometric(kKiB, cpu ? 4 * kMiB : 64 * kMiB, 16);
    p.collective_bytes = geometric(kKiB, cpu ? 4 * kMiB : 64 * kMiB, 8);
    p.warmup = 1;
    p.reps = 5;
    p.min_rep_s = cpu ? 2e-4 : 1e-3;
    p.max_inner = 20;
  } else {
    p.gemms = zoo_gemm_grid(cpu ? 1024 : 0);
    for (int64_t seq : cpu ? std::vector<int64_t>{32, 64, 128, 256, 512, 1024}
                           : std::vector<int64_t>{512, 1024, 2048, 4096, 8192})
      for (int64_t d : {64, 128})
        for (bool causal : {true, false})
          p.attention.push_back(attention(1, cpu ? 4 : 16, seq, d, att, causal));
    p.copy_bytes = cpu ? geometric(64 * kMiB, kGiB, 2) : geometric(64 * kMiB, 4 * kGiB, 2);
    p.host_copy_bytes = cpu ? 64 * kMiB : kGiB;
    p.p2p_bytes = geometric(kKiB, cpu ? 64 * kMiB : kGiB, 4);
    p.collective_bytes = geometric(kKiB, cpu ? 64 * kMiB : kGiB, 4);
    p.warmup = cpu ? 2 : 5;
    p.reps = cpu ? 7 : 20;
  }
  // A tiny GEMM first: its time is the per-call overhead (the profile's launch time).
  p.gemms.insert(p.gemms.begin(), GemmDims{8, 8, 8});
  return p;
}

int RankTopology::hosts() const {
  return host_of_rank.empty() ? 1 : *std::max_element(host_of_rank.begin(), host_of_rank.end()) + 1;
}

std::vector<int> RankTopology::ranks_on_host(int h) const {
  std::vector<int> r;
  for (int i = 0; i < static_cast<int>(host_of_rank.size()); ++i)
    if (host_of_rank[i] == h) r.push_back(i);
  return r;
}

int RankTopology::min_ranks_per_host() const {
  int m = world;
  for (int h = 0; h < hosts(); ++h) m = std::min(m, static_cast<int>(ranks_on_host(h).size()));
  return m;
}

namespace {

// Elements of `t` per rank buffer for a collective of nccl-tests size `bytes` over n ranks.
int64_t collective_count(Collective op, int64_t bytes, int n, DType t) {
  const int64_t e = runtime::dtype_bytes(t);
  const bool per_member = op == Collective::kAllGather || op == Collective::kReduceScatter ||
                          op == Collective::kAllToAll;
  return std::max<int64_t>(1, bytes / (e * (per_member ? n : 1)));
}
int64_t collective_bytes(Collective op, int64_t count, int n, DType t) {
  const bool per_member = op == Collective::kAllGather || op == Collective::kReduceScatter ||
                          op == Collective::kAllToAll;
  return count * runtime::dtype_bytes(t) * (per_member ? n : 1);
}

class Runner {
 public:
  Runner(Backend& b, const SweepPlan& plan, const Progress& progress)
      : b_(b), plan_(plan), progress_(progress), rank_(b.info().rank), world_n_(b.info().world) {}

  Result<Samples> run() {
    const auto start = std::chrono::steady_clock::now();
    std::vector<int> all(world_n_);
    std::iota(all.begin(), all.end(), 0);
    HETPAR_ASSIGN_OR_RETURN(world_, b_.make_group(all));
    HETPAR_ASSIGN_OR_RETURN(s_.topology, exchange_topology());
    s_.device = b_.info();
    s_.warmup = plan_.warmup;
    s_.reps = plan_.reps;
    s_.gemm_sustain_s = plan_.gemm_sustain_s;
    plan_groups();
    total_ = count_samples();

    const bool computes = plan_.compute_on_every_rank || rank_ == 0;
    if (computes) {
      HETPAR_RETURN_IF_ERROR(gemms());
      HETPAR_RETURN_IF_ERROR(attention_sweep());
      HETPAR_RETURN_IF_ERROR(copies());
    } else {
      done_ += static_cast<int>(plan_.gemms.size() * plan_.gemm_dtypes.size() +
                                plan_.accumulate_gemms.size() + 2 * plan_.attention.size() +
                                plan_.copy_bytes.size() + (plan_.host_copy_bytes > 0 ? 2 : 0));
    }
    HETPAR_RETURN_IF_ERROR(b_.barrier());
    HETPAR_RETURN_IF_ERROR(p2p());
    HETPAR_RETURN_IF_ERROR(collectives());
    HETPAR_RETURN_IF_ERROR(b_.barrier());
    s_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::move(s_);
  }

 private:
  struct GroupPlan {
    CollectiveScope scope;
    std::vector<int> ranks;
    int nodes;
  };

  void tick(std::string_view phase) {
    if (rank_ == 0 && progress_) progress_(phase, done_, total_);
    ++done_;
  }

  // Hostnames are exchanged as 16-bit halves of an FNV-1a hash carried in floats (exact
  // integers), through the backend's own all_gather: no MPI calls outside runtime/.
  Result<RankTopology> exchange_topology() {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    uint32_t h = 2166136261u;
    for (const char* c = name; *c != 0; ++c) h = (h ^ static_cast<uint8_t>(*c)) * 16777619u;
    HETPAR_ASSIGN_OR_RETURN(
        auto all, gather({static_cast<double>(h >> 16), static_cast<double>(h & 0xffff)}));
    RankTopology t;
    t.world = world_n_;
    std::map<std::pair<double, double>, int> index;
    for (const std::vector<double>& v : all) {
      auto [it, fresh] = index.emplace(std::pair(v[0], v[1]), static_cast<int>(index.size()));
      t.host_of_rank.push_back(it->second);
    }
    return t;
  }

  // Every rank's `values` (same length everywhere), on every rank.
  Result<std::vector<std::vector<double>>> gather(const std::vector<double>& values) {
    const int64_t n = static_cast<int64_t>(values.size());
    std::vector<float> mine(values.begin(), values.end());
    std::vector<float> all(static_cast<size_t>(n * world_n_));
    HETPAR_ASSIGN_OR_RETURN(Buffer send, b_.allocate(Bytes(n * 4)));
    HETPAR_ASSIGN_OR_RETURN(Buffer recv, b_.allocate(Bytes(n * 4 * world_n_)));
    HETPAR_RETURN_IF_ERROR(b_.copy_from_host(kComputeStream, std::as_bytes(std::span(mine)), send));
    HETPAR_RETURN_IF_ERROR(b_.all_gather(kComputeStream, world_, send, recv, n, DType::kF32));
    HETPAR_RETURN_IF_ERROR(
        b_.copy_to_host(kComputeStream, recv, std::as_writable_bytes(std::span(all))));
    std::vector<std::vector<double>> out(world_n_);
    for (int r = 0; r < world_n_; ++r)
      out[r].assign(all.begin() + r * n, all.begin() + (r + 1) * n);
    return out;
  }

  template <class Fn>
  Result<double> time_region(Fn&& fn, int inner) {
    HETPAR_ASSIGN_OR_RETURN(runtime::Event e0, b_.record(kComputeStream));
    for (int i = 0; i < inner; ++i) HETPAR_RETURN_IF_ERROR(fn());
    HETPAR_ASSIGN_OR_RETURN(runtime::Event e1, b_.record(kComputeStream));
    HETPAR_RETURN_IF_ERROR(b_.synchronize());
    HETPAR_ASSIGN_OR_RETURN(Time t, b_.elapsed(e0, e1));
    return t.to_seconds() / inner;
  }

  int inner_for(double once_s) const {
    if (!(once_s > 0)) return plan_.max_inner;
    return static_cast<int>(
        std::clamp(std::ceil(plan_.min_rep_s / once_s), 1.0, static_cast<double>(plan_.max_inner)));
  }

  // Rank-local timing of a compute kernel: warm-up, then reps (cache flushed before each
  // when `flush`, else `inner` calls per repetition chosen from one probe call).
  template <class Fn>
  Result<std::vector<double>> time_local(Fn&& fn, bool flush) {
    for (int w = 0; w < plan_.warmup; ++w) HETPAR_RETURN_IF_ERROR(fn());
    int inner = 1;
    if (!flush) {
      HETPAR_ASSIGN_OR_RETURN(double once, time_region(fn, 1));
      inner = inner_for(once);
    }
    std::vector<double> reps;
    for (int r = 0; r < plan_.reps; ++r) {
      if (flush) HETPAR_RETURN_IF_ERROR(b_.flush_cache(kComputeStream));
      HETPAR_ASSIGN_OR_RETURN(double t, time_region(fn, inner));
      reps.push_back(t);
    }
    return reps;
  }

  // Rank-local timing at the power-limited steady state: the kernel back to back for
  // plan_.gemm_sustain_s (in groups of >= 20 ms between synchronisations), then the
  // repetitions back to back, no flush.
  template <class Fn>
  Result<std::vector<double>> time_sustained(Fn&& fn) {
    HETPAR_ASSIGN_OR_RETURN(double once, time_region(fn, 1));
    const int inner = std::max(
        inner_for(once), once > 0 ? static_cast<int>(std::min(1e6, std::ceil(0.02 / once))) : 1);
    for (double spent = 0; spent < plan_.gemm_sustain_s;) {
      HETPAR_ASSIGN_OR_RETURN(double t, time_region(fn, inner));
      spent += t * inner;
    }
    std::vector<double> reps;
    for (int r = 0; r < plan_.reps; ++r) {
      HETPAR_ASSIGN_OR_RETURN(double t, time_region(fn, inner));
      reps.push_back(t);
    }
    return reps;
  }

  // Pools the repetitions of every computing rank (all of them, or rank 0 alone).
  // `rank_medians` (optional): each rank's own median, where every rank computes.
  Result<TimingStats> pooled(const std::vector<double>& reps,
                             std::vector<double>* rank_medians = nullptr) {
    if (!plan_.compute_on_every_rank) return summarize(reps);
    HETPAR_ASSIGN_OR_RETURN(auto all, gather(reps));
    std::vector<double> flat;
    for (const auto& v : all) {
      flat.insert(flat.end(), v.begin(), v.end());
      if (rank_medians && world_n_ > 1) rank_medians->push_back(summarize(v).median_s);
    }
    return summarize(flat);
  }

  Result<Buffer> random_buffer(int64_t elements, DType t, uint64_t seed) {
    HETPAR_ASSIGN_OR_RETURN(
        Buffer buf, b_.allocate(Bytes(std::max<int64_t>(1, elements) * runtime::dtype_bytes(t))));
    HETPAR_RETURN_IF_ERROR(b_.fill_random(kComputeStream, buf, t, elements, seed, 1.0f));
    return buf;
  }

  // Times one GEMM, pooled over the computing ranks; nullopt when the backend has no kernel
  // for it (cuBLASLt's FP8 needs 16-byte-aligned leading dimensions): left out with a note,
  // every rank alike (the same GPU, the same answer), rather than ending the calibration.
  Result<std::optional<GemmSample>> time_gemm(const runtime::GemmDesc& g, bool flush) {
    HETPAR_ASSIGN_OR_RETURN(Buffer a, random_buffer(g.m * g.k, g.dtype, 1));
    HETPAR_ASSIGN_OR_RETURN(Buffer bm, random_buffer(g.k * g.n, g.dtype, 2));
    HETPAR_ASSIGN_OR_RETURN(Buffer c, random_buffer(g.m * g.n, g.c_dtype(), 3));
    if (Status probe = b_.gemm(kComputeStream, g, a, bm, c);
        probe.code() == Status::Code::kUnavailable) {
      if (b_.info().rank == 0)
        fmt::print(stderr, "calibrate: {} GEMM {}x{}x{}{} left out: {}\n",
                   runtime::to_string(g.dtype), g.m, g.n, g.k, g.fp32_c ? " into fp32" : "",
                   probe.message());
      return std::optional<GemmSample>();
    } else {
      HETPAR_RETURN_IF_ERROR(probe);
    }
    const auto run = [&] { return b_.gemm(kComputeStream, g, a, bm, c); };
    const bool sustain = flush && plan_.gemm_sustain_s > 0;  // not the call-overhead probe
    HETPAR_ASSIGN_OR_RETURN(auto reps, sustain ? time_sustained(run) : time_local(run, flush));
    GemmSample sample;
    sample.dims = {g.m, g.n, g.k};
    sample.dtype = g.dtype;
    sample.accumulate_fp32 = g.fp32_c;
    HETPAR_ASSIGN_OR_RETURN(sample.t, pooled(reps, &sample.rank_median_s));
    return std::optional<GemmSample>(std::move(sample));
  }

  Status gemms() {
    for (DType t : plan_.gemm_dtypes) {
      for (const GemmDims& d : plan_.gemms) {
        tick("gemm");
        // FP8 runs in the one layout cuBLASLt has for it on Hopper, A transposed (TN), into
        // bf16: how Transformer Engine and torch._scaled_mm run every FP8 GEMM.
        const runtime::GemmDesc g{
            .m = d.m, .n = d.n, .k = d.k, .trans_a = t == DType::kF8E4M3, .dtype = t};
        // Cold (cache flushed) like the large kernels of a training step, except GEMMs whose
        // operands fit in 64 KiB: their time is the per-call overhead (the profile's launch
        // time), which a flush would inflate with cold code and TLB misses.
        const bool tiny = (d.m * d.k + d.k * d.n + d.m * d.n) * runtime::dtype_bytes(t) < 64 * 1024;
        HETPAR_ASSIGN_OR_RETURN(std::optional<GemmSample> st, time_gemm(g, !tiny));
        if (st) s_.gemms.push_back(*std::move(st));
      }
    }
    for (const AccumulateGemm& ag : plan_.accumulate_gemms) {
      tick("gemm");
      const GemmDims& d = ag.dims;
      const runtime::GemmDesc g{.m = d.m,
                                .n = d.n,
                                .k = d.k,
                                .trans_a = ag.dtype == DType::kF8E4M3,
                                .dtype = ag.dtype,
                                .beta = 1.0f,
                                .fp32_c = true};
      HETPAR_ASSIGN_OR_RETURN(std::optional<GemmSample> st, time_gemm(g, true));
      if (st) s_.gemms.push_back(*std::move(st));
    }
    return Status::ok();
  }

  Status attention_sweep() {
    for (const runtime::AttentionDesc& d : plan_.attention) {
      const int64_t q_el = d.batch * d.seq_q * d.heads * d.head_dim;
      const int64_t kv_el = d.batch * d.seq_kv * d.kv_heads * d.head_dim;
      HETPAR_ASSIGN_OR_RETURN(Buffer q, random_buffer(q_el, d.dtype, 4));
      HETPAR_ASSIGN_OR_RETURN(Buffer k, random_buffer(kv_el, d.dtype, 5));
      HETPAR_ASSIGN_OR_RETURN(Buffer v, random_buffer(kv_el, d.dtype, 6));
      HETPAR_ASSIGN_OR_RETURN(Buffer out, random_buffer(q_el, d.dtype, 7));
      HETPAR_ASSIGN_OR_RETURN(Buffer d_out, random_buffer(q_el, d.dtype, 8));
      HETPAR_ASSIGN_OR_RETURN(Buffer stats,
                              random_buffer(d.batch * d.heads * d.seq_q, DType::kF32, 9));
      HETPAR_ASSIGN_OR_RETURN(Buffer dq, random_buffer(q_el, d.dtype, 10));
      HETPAR_ASSIGN_OR_RETURN(Buffer dk, random_buffer(kv_el, d.dtype, 11));
      HETPAR_ASSIGN_OR_RETURN(Buffer dv, random_buffer(kv_el, d.dtype, 12));
      tick("attention");
      HETPAR_ASSIGN_OR_RETURN(
          auto fwd,
          time_local(
              [&] { return b_.attention_forward(kComputeStream, d, q, k, v, nullptr, out, stats); },
              true));
      HETPAR_ASSIGN_OR_RETURN(TimingStats fs, pooled(fwd));
      s_.attention.push_back({d, false, fs});
      tick("attention");
      HETPAR_ASSIGN_OR_RETURN(auto bwd, time_local(
                                            [&] {
                                              return b_.attention_backward(
                                                  kComputeStream, d, q, k, v, nullptr, out, d_out,
                                                  stats, dq, dk, dv, nullptr);
                                            },
                                            true));
      HETPAR_ASSIGN_OR_RETURN(TimingStats bs, pooled(bwd));
      s_.attention.push_back({d, true, bs});
    }
    return Status::ok();
  }

  Status copies() {
    for (int64_t bytes : plan_.copy_bytes) {
      tick("memory");
      HETPAR_ASSIGN_OR_RETURN(Buffer in, random_buffer(bytes / 4, DType::kF32, 13));
      HETPAR_ASSIGN_OR_RETURN(Buffer out, b_.allocate(Bytes(bytes)));
      runtime::ElementwiseDesc d;
      d.op = runtime::ElementwiseOp::kCopy;
      d.elements = bytes / 4;
      d.dtype = DType::kF32;
      const Buffer* inputs[] = {&in};
      HETPAR_ASSIGN_OR_RETURN(
          auto reps,
          time_local([&] { return b_.elementwise(kComputeStream, d, inputs, out); }, false));
      HETPAR_ASSIGN_OR_RETURN(TimingStats st, pooled(reps));
      s_.copies.push_back({false, false, bytes, st});
    }
    if (plan_.host_copy_bytes > 0) {
      const int64_t bytes = plan_.host_copy_bytes;
      HETPAR_ASSIGN_OR_RETURN(Buffer dev, random_buffer(bytes / 4, DType::kF32, 14));
      std::vector<std::byte> host(static_cast<size_t>(bytes));
      for (bool to_host : {false, true}) {
        tick("host link");
        auto fn = [&] {
          return to_host ? b_.copy_to_host(kComputeStream, dev, host)
                         : b_.copy_from_host(kComputeStream, host, dev);
        };
        HETPAR_ASSIGN_OR_RETURN(auto reps, time_local(fn, false));
        HETPAR_ASSIGN_OR_RETURN(TimingStats st, pooled(reps));
        s_.copies.push_back({true, to_host, bytes, st});
      }
    }
    return Status::ok();
  }

  // Warm-up, an agreed inner count, then reps timed by the slowest member each.
  template <class Fn>
  Result<TimingStats> time_comm(bool member, Fn&& fn) {
    for (int w = 0; w < plan_.warmup; ++w)
      if (member) HETPAR_RETURN_IF_ERROR(fn());
    HETPAR_RETURN_IF_ERROR(b_.barrier());
    double once = 0;
    if (member) {
      HETPAR_ASSIGN_OR_RETURN(once, time_region(fn, 1));
    }
    HETPAR_ASSIGN_OR_RETURN(auto probes, gather({once}));
    double slowest = 0;
    for (const auto& p : probes) slowest = std::max(slowest, p[0]);
    const int inner = inner_for(slowest);
    std::vector<double> reps;
    for (int r = 0; r < plan_.reps; ++r) {
      HETPAR_RETURN_IF_ERROR(b_.barrier());
      double t = 0;
      if (member) {
        HETPAR_ASSIGN_OR_RETURN(t, time_region(fn, inner));
      }
      reps.push_back(t);
    }
    HETPAR_ASSIGN_OR_RETURN(auto all, gather(reps));
    std::vector<double> slow(reps.size(), 0.0);
    for (const auto& v : all)
      for (size_t i = 0; i < v.size(); ++i) slow[i] = std::max(slow[i], v[i]);
    return summarize(slow);
  }

  Status p2p() {
    if (world_n_ < 2 || plan_.p2p_bytes.empty()) return Status::ok();
    const int64_t max_bytes = *std::max_element(plan_.p2p_bytes.begin(), plan_.p2p_bytes.end());
    HETPAR_ASSIGN_OR_RETURN(Buffer buf, random_buffer(max_bytes / 4, DType::kF32, 15));
    const DType t = plan_.comm_dtype;
    for (int src = 0; src < world_n_; ++src) {
      for (int dst = src + 1; dst < world_n_; ++dst) {
        const CollectiveScope scope = s_.topology.host_of_rank[src] == s_.topology.host_of_rank[dst]
                                          ? CollectiveScope::kIntraNode
                                          : CollectiveScope::kInterNode;
        for (int64_t bytes : plan_.p2p_bytes) {
          tick("p2p");
          const int64_t count = std::max<int64_t>(1, bytes / runtime::dtype_bytes(t));
          auto fn = [&]() -> Status {
            if (rank_ == src) return b_.send(kComputeStream, buf, count, t, dst);
            return b_.recv(kComputeStream, buf, count, t, src);
          };
          HETPAR_ASSIGN_OR_RETURN(TimingStats st, time_comm(rank_ == src || rank_ == dst, fn));
          s_.p2p.push_back({src, dst, scope, count * runtime::dtype_bytes(t), st});
        }
      }
    }
    return Status::ok();
  }

  void plan_groups() {
    const RankTopology& topo = s_.topology;
    if (topo.hosts() == 1) {
      for (int g = 2; g <= world_n_; ++g) {
        std::vector<int> r(g);
        std::iota(r.begin(), r.end(), 0);
        groups_.push_back({CollectiveScope::kIntraNode, r, 1});
      }
      return;
    }
    const std::vector<int> host0 = topo.ranks_on_host(0);
    for (int g = 2; g <= topo.min_ranks_per_host(); ++g)
      groups_.push_back(
          {CollectiveScope::kIntraNode, std::vector<int>(host0.begin(), host0.begin() + g), 1});
    std::vector<int> ranks = host0;
    for (int k = 2; k <= topo.hosts(); ++k) {
      for (int r : topo.ranks_on_host(k - 1)) ranks.push_back(r);
      std::vector<int> sorted = ranks;
      std::sort(sorted.begin(), sorted.end());
      groups_.push_back({CollectiveScope::kInterNode, sorted, k});
    }
  }

  int count_samples() const {
    int n = static_cast<int>(plan_.gemms.size() * plan_.gemm_dtypes.size() +
                             plan_.accumulate_gemms.size() + 2 * plan_.attention.size() +
                             plan_.copy_bytes.size() + (plan_.host_copy_bytes > 0 ? 2 : 0));
    n += world_n_ * (world_n_ - 1) / 2 * static_cast<int>(plan_.p2p_bytes.size());
    n +=
        static_cast<int>(groups_.size() * plan_.collectives.size() * plan_.collective_bytes.size());
    return n;
  }

  Status run_collective(Collective op, const Group& g, Buffer& send, Buffer& recv, int64_t count) {
    const DType t = plan_.comm_dtype;
    switch (op) {
      case Collective::kAllReduce:
        return b_.all_reduce(kComputeStream, g, send, recv, count, t);
      case Collective::kAllGather:
        return b_.all_gather(kComputeStream, g, send, recv, count, t);
      case Collective::kReduceScatter:
        return b_.reduce_scatter(kComputeStream, g, send, recv, count, t);
      case Collective::kAllToAll:
        return b_.all_to_all(kComputeStream, g, send, recv, count, t);
      case Collective::kBroadcast:
        return b_.broadcast(kComputeStream, g, send, count, t, 0);
      case Collective::kSendRecv:
        break;
    }
    return Status::invalid_argument(
        fmt::format("collective sweep: {} is measured by the P2P sweep", to_string(op)));
  }

  Status collectives() {
    if (plan_.collective_bytes.empty()) return Status::ok();
    const int64_t max_bytes =
        *std::max_element(plan_.collective_bytes.begin(), plan_.collective_bytes.end());
    const DType t = plan_.comm_dtype;
    for (const GroupPlan& gp : groups_) {
      HETPAR_ASSIGN_OR_RETURN(Group g, b_.make_group(gp.ranks));
      const bool member = g.rank >= 0;
      const int n = static_cast<int>(gp.ranks.size());
      Buffer send, recv;
      if (member) {
        HETPAR_ASSIGN_OR_RETURN(send, random_buffer(max_bytes / 4 + n, DType::kF32, 16));
        HETPAR_ASSIGN_OR_RETURN(recv, random_buffer(max_bytes / 4 + n, DType::kF32, 17));
      }
      for (Collective op : plan_.collectives) {
        for (int64_t bytes : plan_.collective_bytes) {
          tick(to_string(op));
          const int64_t count = collective_count(op, bytes, n, t);
          HETPAR_ASSIGN_OR_RETURN(TimingStats st, time_comm(member, [&] {
                                    return run_collective(op, g, send, recv, count);
                                  }));
          s_.collectives.push_back(
              {op, gp.scope, n, gp.nodes, collective_bytes(op, count, n, t), st});
        }
      }
    }
    return Status::ok();
  }

  Backend& b_;
  const SweepPlan& plan_;
  const Progress& progress_;
  const int rank_;
  const int world_n_;
  Group world_;
  std::vector<GroupPlan> groups_;
  Samples s_;
  int done_ = 0;
  int total_ = 0;
};

}  // namespace

Result<Samples> run_sweeps(Backend& backend, const SweepPlan& plan, const Progress& progress) {
  if (plan.reps < 1 || plan.warmup < 0)
    return Status::invalid_argument(fmt::format(
        "sweep plan: reps must be >= 1 and warmup >= 0, got {} and {}", plan.reps, plan.warmup));
  if (plan.gemm_dtypes.empty() && !plan.gemms.empty())
    return Status::invalid_argument("sweep plan: gemms listed but no gemm dtype");
  return Runner(backend, plan, progress).run();
}

}  // namespace hetpar::calibrate
