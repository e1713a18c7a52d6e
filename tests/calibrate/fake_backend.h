// A Backend double for calibrate's tests: one process playing rank 0 of a world of
// `world` ranks on one host, whose operations take no real time but advance a virtual
// clock by known cost models (GEMM rate per shape, alpha + S / beta per collective and
// group size, copy bandwidth). Sweeping it must recover exactly those models.
// all_gather replicates this rank's contribution into every slot, as if every rank had
// measured the same.
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "hetpar/hardware/system_profile.h"
#include "hetpar/runtime/backend.h"

namespace hetpar::calibrate::testing {

struct FakeModel {
  double gemm_peak = 200e9;      // FLOP/s of a large GEMM
  double gemm_launch = 2e-6;     // s per call
  double attention_rate = 50e9;  // FLOP/s at key length >= 256, slower below
  double copy_Bps = 20e9;        // memory traffic (read + write)
  double copy_alpha = 1e-6;
  double host_Bps = 8e9;
  double p2p_alpha = 3e-6;
  double p2p_Bps = 6e9;
  // Collectives: alpha(op) = coll_alpha * (1 + index(op)) * (n - 1); algbw = coll_Bps / n.
  double coll_alpha = 1e-6;
  double coll_Bps = 16e9;
  double fp32_c_slowdown = 1.0;  // a GEMM adding into an fp32 C takes this much longer

  double gemm_s(int64_t m, int64_t n, int64_t k) const {
    // Skinny dims lose speed linearly below 64.
    const double shape = std::min<double>(1.0, std::min({m, n, k}) / 64.0);
    return gemm_launch + 2.0 * m * n * k / (gemm_peak * shape);
  }
  double short_seq_factor = 0.5;  // attention rate at key length 0 / attention_rate
  // One attention call: the launch (the 8x8x8 GEMM's time) plus its FLOPs at a rate that
  // goes linearly from short_seq_factor x attention_rate at length 0 to attention_rate at 256.
  double attention_rate_at(int64_t seq_kv) const {
    const double x = std::min(1.0, static_cast<double>(seq_kv) / 256);
    return attention_rate * (short_seq_factor + (1 - short_seq_factor) * x);
  }
  // An unmasked call runs this much faster per model FLOP than a causal one (below 256:
  // faster still, as a short causal call spends more of its time on the diagonal).
  double unmasked_speedup = 1.25;
  double unmasked_speedup_at(int64_t seq_kv) const {
    return seq_kv < 256 ? unmasked_speedup * 1.1 : unmasked_speedup;
  }
  // And each element of the score matrix (the softmax) costs this much beyond the FLOPs,
  // forward; the backward the multiple below.
  double element_s = 1e-10;
  double backward_element_factor = 1.5;
  double attention_s(double flops, int64_t seq_kv, bool causal = true, int64_t head_dim = 64,
                     bool backward = false) const {
    const double rate = attention_rate_at(seq_kv) * (causal ? 1.0 : unmasked_speedup_at(seq_kv));
    const double elements = flops / ((backward ? 8.0 : 4.0) * static_cast<double>(head_dim));
    return gemm_s(8, 8, 8) + flops / rate +
           elements * element_s * (backward ? backward_element_factor : 1.0);
  }
  double coll_alpha_s(hardware::Collective op, int n) const {
    return coll_alpha * (1 + static_cast<int>(op)) * (n - 1);
  }
  double coll_beta(int n) const { return coll_Bps / n; }
};

class FakeBackend : public runtime::Backend {
 public:
  /// `host_of_rank` (optional): the host each rank claims in the run's first all_gather,
  /// which is run_sweeps' hostname exchange.
  explicit FakeBackend(int world, FakeModel model = {}, std::vector<int> host_of_rank = {})
      : model_(model), host_of_rank_(std::move(host_of_rank)) {
    info_.backend = "fake";
    info_.name = "Fake Device";
    info_.memory = Bytes::GiB(16);
    info_.versions = "fake 1.0";
    info_.world = world;
    info_.host_cores = 1;  // its ranks share one core, as cpu ranks oversubscribed
  }

  const runtime::DeviceInfo& info() const override { return info_; }
  int flushes = 0;

  Result<runtime::Buffer> allocate(Bytes size) override {
    void* p = ::operator new(static_cast<size_t>(std::max<int64_t>(size.count(), 1)));
    return runtime::Buffer(
        p, size, [](void*, void* d) { ::operator delete(d); }, nullptr);
  }
  Status fill_random(runtime::Stream, runtime::Buffer&, runtime::DType, int64_t, uint64_t,
                     float) override {
    return Status::ok();
  }
  Status copy_to_host(runtime::Stream, const runtime::Buffer& b,
                      std::span<std::byte> host) override {
    std::memcpy(host.data(), b.data(), host.size());
    advance(static_cast<double>(host.size()) / model_.host_Bps);
    return Status::ok();
  }
  Status copy_from_host(runtime::Stream, std::span<const std::byte> host,
                        runtime::Buffer& b) override {
    std::memcpy(b.data(), host.data(), host.size());
    advance(static_cast<double>(host.size()) / model_.host_Bps);
    return Status::ok();
  }
  Status gemm(runtime::Stream, const runtime::GemmDesc& d, const runtime::Buffer&,
              const runtime::Buffer&, runtime::Buffer&) override {
    advance(model_.gemm_s(d.m, d.n, d.k) * (d.fp32_c ? model_.fp32_c_slowdown : 1.0));
    return Status::ok();
  }
  Status attention_forward(runtime::Stream, const runtime::AttentionDesc& d, const runtime::Buffer&,
                           const runtime::Buffer&, const runtime::Buffer&, const runtime::Buffer*,
                           runtime::Buffer&, runtime::Buffer&) override {
    advance(model_.attention_s(d.forward_flops(), d.seq_kv, d.causal, d.head_dim));
    return Status::ok();
  }
  Status attention_backward(runtime::Stream, const runtime::AttentionDesc& d,
                            const runtime::Buffer&, const runtime::Buffer&, const runtime::Buffer&,
                            const runtime::Buffer*, const runtime::Buffer&, const runtime::Buffer&,
                            const runtime::Buffer&, runtime::Buffer&, runtime::Buffer&,
                            runtime::Buffer&, runtime::Buffer*) override {
    advance(model_.attention_s(2 * d.forward_flops(), d.seq_kv, d.causal, d.head_dim, true));
    return Status::ok();
  }
  Status elementwise(runtime::Stream, const runtime::ElementwiseDesc& d,
                     std::span<const runtime::Buffer* const>, runtime::Buffer&) override {
    advance(model_.copy_alpha + 2.0 * d.elements * runtime::dtype_bytes(d.dtype) / model_.copy_Bps);
    return Status::ok();
  }
  Status flush_cache(runtime::Stream) override {
    ++flushes;
    return Status::ok();
  }

  Result<runtime::Group> make_group(std::span<const int> ranks) override {
    runtime::Group g;
    g.id = next_group_++;
    g.ranks.assign(ranks.begin(), ranks.end());
    for (size_t i = 0; i < g.ranks.size(); ++i)
      if (g.ranks[i] == info_.rank) g.rank = static_cast<int>(i);
    return g;
  }
  Status all_reduce(runtime::Stream, const runtime::Group& g, const runtime::Buffer&,
                    runtime::Buffer&, int64_t count, runtime::DType t) override {
    return collective(hardware::Collective::kAllReduce, g, count * runtime::dtype_bytes(t));
  }
  Status all_gather(runtime::Stream, const runtime::Group& g, const runtime::Buffer& send,
                    runtime::Buffer& recv, int64_t count, runtime::DType t) override {
    const int64_t bytes = count * runtime::dtype_bytes(t);
    for (int r = 0; r < g.size(); ++r)
      std::memcpy(static_cast<char*>(recv.data()) + r * bytes, send.data(), bytes);
    if (gathers_++ == 0 && !host_of_rank_.empty())
      for (int r = 0; r < g.size(); ++r)
        static_cast<float*>(recv.data())[r * count] = host_of_rank_[r];
    return collective(hardware::Collective::kAllGather, g, bytes * g.size());
  }
  Status reduce_scatter(runtime::Stream, const runtime::Group& g, const runtime::Buffer&,
                        runtime::Buffer&, int64_t count, runtime::DType t) override {
    return collective(hardware::Collective::kReduceScatter, g,
                      count * runtime::dtype_bytes(t) * g.size());
  }
  Status all_to_all(runtime::Stream, const runtime::Group& g, const runtime::Buffer&,
                    runtime::Buffer&, int64_t count, runtime::DType t) override {
    return collective(hardware::Collective::kAllToAll, g,
                      count * runtime::dtype_bytes(t) * g.size());
  }
  Status broadcast(runtime::Stream, const runtime::Group& g, runtime::Buffer&, int64_t count,
                   runtime::DType t, int) override {
    return collective(hardware::Collective::kBroadcast, g, count * runtime::dtype_bytes(t));
  }
  Status send(runtime::Stream, const runtime::Buffer&, int64_t count, runtime::DType t,
              int) override {
    advance(model_.p2p_alpha + count * runtime::dtype_bytes(t) / model_.p2p_Bps);
    return Status::ok();
  }
  Status recv(runtime::Stream, runtime::Buffer&, int64_t count, runtime::DType t, int) override {
    advance(model_.p2p_alpha + count * runtime::dtype_bytes(t) / model_.p2p_Bps);
    return Status::ok();
  }
  Status group_start() override { return Status::ok(); }
  Status group_end() override { return Status::ok(); }

  Result<runtime::Event> record(runtime::Stream) override {
    events_.push_back(clock_);
    return runtime::Event{static_cast<int64_t>(events_.size() - 1)};
  }
  Status wait(runtime::Stream, runtime::Event) override { return Status::ok(); }
  Status synchronize() override { return Status::ok(); }
  Result<Time> elapsed(runtime::Event from, runtime::Event to) override {
    return Time::seconds(events_[to.id] - events_[from.id]);
  }
  Status barrier() override { return Status::ok(); }

 private:
  void advance(double s) { clock_ += s; }
  Status collective(hardware::Collective op, const runtime::Group& g, int64_t bytes) {
    const int n = g.size();
    advance(model_.coll_alpha_s(op, n) + static_cast<double>(bytes) / model_.coll_beta(n));
    return Status::ok();
  }

  FakeModel model_;
  runtime::DeviceInfo info_;
  double clock_ = 0;
  std::vector<double> events_;
  int64_t next_group_ = 0;
  std::vector<int> host_of_rank_;
  int gathers_ = 0;
};

}  // namespace hetpar::calibrate::testing
