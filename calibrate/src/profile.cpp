#include "hetpar/calibrate/profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace hetpar::calibrate {

using hardware::Collective;
using hardware::CollectiveFigure;
using hardware::CollectiveScope;
using hardware::Precision;
using hardware::SystemProfile;
using runtime::DType;

double bus_factor(Collective op, int n) {
  const double nd = static_cast<double>(n);
  switch (op) {
    case Collective::kAllReduce:
      return 2.0 * (nd - 1) / nd;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return (nd - 1) / nd;
    case Collective::kBroadcast:
    case Collective::kSendRecv:
      return 1.0;
  }
  return 1.0;
}

namespace {

Precision precision_of(DType t) {
  switch (t) {
    case DType::kF32:
      return Precision::kFp32;
    case DType::kBf16:
      return Precision::kBf16;
    case DType::kF16:
      return Precision::kFp16;
    case DType::kF8E4M3:
      return Precision::kFp8;
  }
  return Precision::kBf16;
}

std::vector<SizeTime> points(const std::vector<std::pair<int64_t, TimingStats>>& v) {
  std::vector<SizeTime> out;
  for (const auto& [bytes, t] : v) out.push_back({static_cast<double>(bytes), t.median_s});
  return out;
}

}  // namespace

Result<Fits> fit_samples(const Samples& s) {
  Fits f;
  // Per dtype, plain GEMMs and those adding into fp32 apart; the launch overhead from the
  // smallest plain one.
  std::map<std::pair<bool, DType>, std::vector<const GemmSample*>> by_dtype;
  for (const GemmSample& g : s.gemms) by_dtype[{g.accumulate_fp32, g.dtype}].push_back(&g);
  double smallest = -1;
  for (const auto& [key, list] : by_dtype) {
    const auto [accumulate, dtype] = key;
    GemmFit gf;
    gf.dtype = dtype;
    gf.shapes = static_cast<int>(list.size());
    std::vector<double> rates;
    for (const GemmSample* g : list) {
      rates.push_back(g->flops_per_s());
      if (g->flops_per_s() > gf.max_flops_per_s) {
        gf.max_flops_per_s = g->flops_per_s();
        gf.best = g->dims;
      }
      if (!accumulate && (smallest < 0 || g->dims.flops() < smallest)) {
        smallest = g->dims.flops();
        f.launch_s = g->t.median_s;
      }
    }
    gf.median_flops_per_s = quantile(rates, 0.5);
    gf.min_flops_per_s = *std::min_element(rates.begin(), rates.end());
    (accumulate ? f.gemm_accumulate : f.gemm).push_back(gf);
  }

  // The time per score element: at one key length, two head dims d1 > d2 of causal calls
  // give u_i = (t_i - launch) / F_i = 1 / rate + e · E_i / F_i per FLOP, E_i / F_i the
  // elements per FLOP (hardware::attention_score_elements: 1 / (4·d_i) forward, 1 / (8·d_i)
  // backward), two equations for the rate and e; the median over the lengths is the
  // profile's (at least 0: a smaller head measured faster per FLOP is noise).
  for (int backward = 0; backward < 2; ++backward) {
    std::map<int64_t, std::map<int64_t, double>> u;  // seq_kv -> head_dim -> (t - launch) / F
    for (const AttentionSample& a : s.attention)
      if (a.desc.causal && a.backward == (backward == 1) && a.flops() > 0)
        u[a.desc.seq_kv][a.desc.head_dim] = (a.t.median_s - f.launch_s) / a.flops();
    std::vector<double> per_length;
    for (const auto& [seq, by_dim] : u) {
      if (by_dim.size() < 2) continue;
      const auto& [d2, u2] = *by_dim.begin();
      const auto& [d1, u1] = *by_dim.rbegin();
      const auto per_flop = [&](int64_t d) {
        return hardware::attention_score_elements(1.0, backward == 1, d);
      };
      per_length.push_back(std::max((u2 - u1) / (per_flop(d2) - per_flop(d1)), 0.0));
    }
    if (per_length.empty()) continue;
    (backward ? f.attention_bwd_element_s : f.attention_fwd_element_s) = quantile(per_length, 0.5);
    f.attention_elements_fitted = true;
  }
  // attention_time() adds the launch overhead and the score elements' time to flops / rate,
  // so the rate is fitted on the time without them (at most 90% of a call is taken for
  // overhead).
  // [causal][backward]: seq_kv -> (flops, seconds)
  std::map<int64_t, std::pair<double, double>> by_seq[2][2];
  for (const AttentionSample& a : s.attention) {
    auto& [flops, secs] = by_seq[a.desc.causal][a.backward][a.desc.seq_kv];
    flops += a.flops();
    const double softmax =
        hardware::attention_score_elements(a.flops(), a.backward, a.desc.head_dim) *
        (a.backward ? f.attention_bwd_element_s : f.attention_fwd_element_s);
    secs += std::max(a.t.median_s - f.launch_s - softmax, 0.1 * a.t.median_s);
  }
  for (int backward = 0; backward < 2; ++backward) {
    auto& out = backward ? f.attention_bwd_by_seq : f.attention_fwd_by_seq;
    for (const auto& [seq, fs] : by_seq[true][backward])
      if (fs.second > 0) out.emplace_back(seq, fs.first / fs.second);
    if (!out.empty())
      (backward ? f.attention_bwd_flops_per_s : f.attention_fwd_flops_per_s) = out.back().second;
  }
  // The unmasked factor of a key length: the one that makes its unmasked forward + backward,
  // timed at that length's causal rates, take their measured time (the profile applies one
  // factor to both passes).
  for (const auto& [seq, fwd] : by_seq[false][false]) {
    const auto bwd = by_seq[false][true].find(seq);
    const auto causal_fwd = by_seq[true][false].find(seq);
    const auto causal_bwd = by_seq[true][true].find(seq);
    if (bwd == by_seq[false][true].end() || causal_fwd == by_seq[true][false].end() ||
        causal_bwd == by_seq[true][true].end())
      continue;
    const auto rate = [](const std::pair<double, double>& fs) { return fs.first / fs.second; };
    const double at_causal_rates =
        fwd.first / rate(causal_fwd->second) + bwd->second.first / rate(causal_bwd->second);
    f.attention_unmasked_by_seq.emplace_back(seq,
                                             at_causal_rates / (fwd.second + bwd->second.second));
  }

  std::vector<std::pair<int64_t, TimingStats>> copies;
  for (const CopySample& c : s.copies) {
    if (!c.host) {
      copies.emplace_back(2 * c.bytes, c.t);  // memory traffic: read + write
    } else {
      const double bw = static_cast<double>(c.bytes) / c.t.median_s;
      (c.to_host ? f.device_to_host_Bps : f.host_to_device_Bps) = bw;
    }
  }
  if (!copies.empty()) {
    f.memory = fit_alpha_beta_or_bounds(points(copies));
    std::vector<double> rates;
    for (const auto& [bytes, t] : copies) rates.push_back(static_cast<double>(bytes) / t.median_s);
    f.memory_Bps = quantile(rates, 0.5);
  }

  using Key = std::tuple<CollectiveScope, Collective, int, int>;
  std::map<Key, std::vector<std::pair<int64_t, TimingStats>>> groups;
  for (const CollectiveSample& c : s.collectives)
    groups[{c.scope, c.op, c.ranks, c.nodes}].emplace_back(c.bytes, c.t);
  std::map<std::tuple<int, int, CollectiveScope>, std::vector<std::pair<int64_t, TimingStats>>>
      pairs;
  for (const P2PSample& p : s.p2p) {
    pairs[{p.src, p.dst, p.scope}].emplace_back(p.bytes, p.t);
    const int nodes = p.scope == CollectiveScope::kInterNode ? 2 : 1;
    groups[{p.scope, Collective::kSendRecv, 2, nodes}].emplace_back(p.bytes, p.t);
  }
  for (const auto& [key, v] : groups) {
    const auto& [scope, op, ranks, nodes] = key;
    CollectiveFit cf{op, scope, ranks, nodes, fit_alpha_beta_or_bounds(points(v)), 0};
    cf.busbw_Bps = cf.fit.beta_Bps * bus_factor(op, ranks);
    f.collectives.push_back(cf);
  }
  for (const auto& [key, v] : pairs) {
    const auto& [src, dst, scope] = key;
    f.pairs.push_back({src, dst, scope, fit_alpha_beta_or_bounds(points(v))});
  }
  return f;
}

namespace {

class Builder {
 public:
  Builder(const Samples& s, const Fits& f, const ProfileOptions& o) : s_(s), f_(f), o_(o) {}

  Result<SystemProfile> build() {
    const runtime::DeviceInfo& dev = s_.device;
    const int hosts = s_.topology.hosts();
    const int per_host = s_.topology.min_ranks_per_host();
    measured_ = fmt::format(
        "measured by hetpar calibrate --backend {} on {} ({} rank{} on {} host{}, {})", dev.backend,
        dev.name, dev.world, dev.world == 1 ? "" : "s", hosts, hosts == 1 ? "" : "s", o_.date);
    SystemProfile p;
    if (o_.base) p = *o_.base;
    p.provenance.clear();
    p.name = o_.name.empty() ? fmt::format("calibrated-{}", dev.backend) : o_.name;
    p.description = fmt::format("{}; {}", measured_, dev.versions);
    p.gpus_per_node = per_host;
    // A cpu host's ranks share its cores (the simulator slows them when they outnumber
    // them: system_profile.h); GPUs are a device each.
    p.shared_compute_units = dev.host_cores;
    if (dev.host_cores > 0)
      mark(p, "shared_compute_units",
           fmt::format("{}: the cores rank 0 may run on (its affinity mask), shared by the "
                       "host's ranks",
                       measured_));
    // The host's time per issued call is not measured (the sweeps time the device).
    if (p.host_op > Time::zero())
      mark(p, "host.op_us", from_base("the host's time per issued kernel or call"));
    HETPAR_RETURN_IF_ERROR(device(p));
    intra(p);
    inter(p, hosts);
    HETPAR_RETURN_IF_ERROR(collectives(p, hosts));
    HETPAR_RETURN_IF_ERROR(hardware::validate_profile(p));
    return p;
  }

 private:
  // How the GEMM samples were timed (SweepPlan::gemm_sustain_s), for their provenance.
  std::string gemm_timing() const {
    if (s_.gemm_sustain_s > 0)
      return fmt::format(
          "each shape run back to back for {:g} s first (the power-limited steady state), then "
          "the median of {} back-to-back repetitions (calls under 64 KiB of operands: warm, "
          "after {} warm-up)",
          s_.gemm_sustain_s, s_.reps, s_.warmup);
    return fmt::format(
        "median of {} repetitions per shape after {} warm-up, cache flushed before "
        "each",
        s_.reps, s_.warmup);
  }

  // The profile precisions a measured dtype stands for: its own, and bf16 too for the cpu
  // backend's fp32 (it computes every dtype in fp32).
  std::vector<Precision> precisions_of(DType t) const {
    std::vector<Precision> out = {precision_of(t)};
    if (t == DType::kF32 && fp32_stands_for_bf16()) out.push_back(Precision::kBf16);
    return out;
  }

  // The measured rates of the dtype's plain GEMMs, or of those adding into fp32.
  std::vector<hardware::GemmMeasurement> table(DType t, bool accumulate_fp32) const {
    std::vector<hardware::GemmMeasurement> out;
    for (const GemmSample& gs : s_.gemms)
      if (gs.dtype == t && gs.accumulate_fp32 == accumulate_fp32)
        out.push_back(
            {gs.dims.m, gs.dims.n, gs.dims.k, FlopRate::per_second(std::round(gs.flops_per_s()))});
    return out;
  }

  void mark(SystemProfile& p, const std::string& field, const std::string& how) {
    p.provenance[field] = how;
  }
  std::string from_base(const std::string& what) const {
    return fmt::format("[not measured] {} from the base profile {}", what, o_.base_ref);
  }

  Status device(SystemProfile& p) {
    hardware::DeviceProfile& g = p.gpu;
    const bool base = o_.base.has_value();
    g.model = s_.device.name;
    mark(p, "gpu.model", measured_);
    g.memory_capacity = s_.device.memory;
    mark(p, "gpu.memory_GiB", measured_ + ": device memory the backend reports");
    if (!base) {
      // A device without a datasheet in hetpar: one compute unit whose peak is the best
      // measured GEMM; the measured GEMM table then decides every shape's time.
      g.sm_count = 1;
      g.l2 = Bytes::MiB(1);
      g.gemm_tiles = {{64, 64, 1.0}};
      g.gemm_split_k = false;
      for (const char* field : {"gpu.sm_count", "gpu.l2_MiB", "gpu.gemm.tiles"})
        mark(p, field,
             "[not measured] neutral placeholder for a device without a datasheet (one unit, "
             "one 64x64 tile): gpu.gemm.measured sets the GEMM times");
    } else {
      for (const char* field : {"gpu.sm_count", "gpu.l2_MiB", "gpu.gemm.tiles"})
        mark(p, field, from_base(field));
    }

    // Memory: the copy sweep's traffic / time (Fits::memory_Bps).
    if (f_.memory && f_.memory_Bps > 0) {
      const double bw = f_.memory_Bps;
      const std::string how = fmt::format(
          "{}: device copy sweep, median of read+write traffic / time over {} sizes: {:.1f} GB/s "
          "(alpha-beta fit: {:.1f} GB/s, alpha {:.1f} us, R^2 {:.4f})",
          measured_, f_.memory->points, bw / 1e9, f_.memory->beta_Bps / 1e9,
          f_.memory->alpha_s * 1e6, f_.memory->r2);
      if (base && o_.base->gpu.memory_bandwidth.bytes_per_s() >= bw) {
        g.memory_efficiency = bw / g.memory_bandwidth.bytes_per_s();
        mark(p, "gpu.memory_GBps", from_base("datasheet peak"));
        mark(p, "gpu.memory_efficiency", how + " / datasheet peak");
      } else {
        g.memory_bandwidth = Bandwidth::bytes_per_s(std::round(bw));
        g.memory_efficiency = 1.0;
        mark(p, "gpu.memory_GBps", how);
        mark(p, "gpu.memory_efficiency", "the measured bandwidth is the achievable one");
      }
    } else if (base) {
      mark(p, "gpu.memory_GBps", from_base("memory bandwidth"));
      mark(p, "gpu.memory_efficiency", from_base("memory efficiency"));
    } else {
      return Status::invalid_argument("calibration: no memory copy samples and no base profile");
    }

    const double host = std::min(f_.host_to_device_Bps, f_.device_to_host_Bps);
    if (host > 0) {
      g.host_link = Bandwidth::bytes_per_s(std::round(host));
      mark(p, "gpu.host_link_GBps",
           fmt::format("{}: slower of host->device {:.2f} and device->host {:.2f} GB/s", measured_,
                       f_.host_to_device_Bps / 1e9, f_.device_to_host_Bps / 1e9));
    } else if (base) {
      mark(p, "gpu.host_link_GBps", from_base("host link"));
    } else {
      g.host_link = g.memory_bandwidth;
      mark(p, "gpu.host_link_GBps", "[not measured] host memory is device memory");
    }

    // Compute slowed by overlapped collectives: not measured by the sweeps (they time
    // kernels alone); the base profile's figure, else none.
    if (g.collective_overlap_slowdown > 0)
      mark(p, "gpu.collective_overlap_slowdown", from_base("collective overlap slowdown"));
    clock_spread(p);

    // GEMM: measured precisions get the table and eta_max; a cpu fp32 measurement also
    // stands for bf16 (the cpu backend computes every dtype in fp32).
    for (const GemmFit& gf : f_.gemm) {
      for (Precision prec : precisions_of(gf.dtype)) {
        const size_t i = hardware::precision_index(prec);
        const std::string key = fmt::format("gpu.compute.{}", hardware::to_string(prec));
        const std::string how =
            fmt::format("{}: best of {} GEMM shapes {:.1f} GFLOP/s at {}x{}x{} ({})", measured_,
                        gf.shapes, gf.max_flops_per_s / 1e9, gf.best.m, gf.best.n, gf.best.k,
                        runtime::to_string(gf.dtype));
        if (base && g.compute[i]) {
          g.compute[i]->eta_max =
              std::min(1.0, gf.max_flops_per_s / g.compute[i]->peak.per_second());
          mark(p, key + ".peak_tflops", from_base("datasheet peak"));
          mark(p, key + ".eta_max", how + " / datasheet peak");
        } else {
          g.compute[i] =
              hardware::PrecisionRate{FlopRate::per_second(std::round(gf.max_flops_per_s)), 1.0};
          mark(p, key + ".peak_tflops", how + " (no datasheet peak: the best measured rate)");
          mark(p, key + ".eta_max", "peak is the best measured rate");
        }
        g.gemm_measured[i] = table(gf.dtype, false);
        g.gemm_k_scale[i].clear();  // the measured shapes carry their own K dependence
        mark(p, fmt::format("gpu.gemm.measured.{}", hardware::to_string(prec)),
             fmt::format("{}: {}; shapes from the model zoo under TP 1..8 (gemm_grid.h){}",
                         measured_, gemm_timing(),
                         o_.plan_shapes.empty() ? "" : fmt::format(" and {}", o_.plan_shapes)) +
                 (prec != precision_of(gf.dtype)
                      ? " (fp32 runs, which the cpu backend uses for bf16)"
                      : ""));
      }
    }
    for (Precision prec : hardware::kAllPrecisions)  // unmeasured precisions keep the base's
      if (!g.gemm_k_scale[hardware::precision_index(prec)].empty())
        mark(p, fmt::format("gpu.gemm.k_scale.{}", hardware::to_string(prec)),
             from_base("sustained GEMM rate against K"));
    // GEMMs adding into an fp32 output (the wgrad GEMMs of Megatron's fused gradient
    // accumulation): their own table, read for such GEMMs only; the rest keep the base's.
    for (const GemmFit& gf : f_.gemm_accumulate) {
      for (Precision prec : precisions_of(gf.dtype)) {
        g.gemm_accumulate_measured[hardware::precision_index(prec)] = table(gf.dtype, true);
        mark(p, fmt::format("gpu.gemm.measured_accumulate.{}", hardware::to_string(prec)),
             fmt::format("{}: {} GEMMs (the weight gradients of {}) adding into an fp32 "
                         "output (beta 1, fp32 C), {}",
                         measured_, runtime::to_string(gf.dtype),
                         o_.plan_shapes.empty() ? "the plan" : o_.plan_shapes, gemm_timing()));
      }
    }
    accumulate_exposed(p);
    for (Precision prec : hardware::kAllPrecisions)
      if (!g.gemm_accumulate_measured[hardware::precision_index(prec)].empty() &&
          !p.provenance.contains(
              fmt::format("gpu.gemm.measured_accumulate.{}", hardware::to_string(prec))))
        mark(p, fmt::format("gpu.gemm.measured_accumulate.{}", hardware::to_string(prec)),
             from_base("GEMMs adding into fp32"));
    if (!g.supports(Precision::kBf16))
      return Status::invalid_argument(
          "calibration: no bf16 (or cpu fp32) GEMM samples and no base profile to supply bf16");
    if (f_.launch_s > 0) {
      g.gemm_launch_overhead = Time::seconds(f_.launch_s);
      mark(p, "gpu.gemm.launch_us", measured_ + ": median time of the smallest GEMM (8x8x8)");
    } else {
      mark(p, "gpu.gemm.launch_us", from_base("launch overhead"));
    }

    attention(p, f_.attention_fwd_flops_per_s, false);
    attention(p, f_.attention_bwd_flops_per_s, true);
    unmasked_attention(p);
    attention_elements(p);
    for (const auto& [k, rates] : g.attention_alternatives)  // not measured: the base's
      mark(p, fmt::format("gpu.attention.alternatives.{}", hardware::to_string(k)),
           from_base(fmt::format("{} attention rates", hardware::to_string(k))));
    // Attention is timed in bursts of back-to-back calls, as the base's figures were: the
    // base's sustained fraction of them still applies.
    if (g.attention_sustain != 1.0)
      mark(p, "gpu.attention.sustain", from_base("sustained fraction of burst attention rates"));
    for (Precision prec : hardware::kAllPrecisions) {
      const std::string key = fmt::format("gpu.compute.{}", hardware::to_string(prec));
      if (g.supports(prec) && !p.provenance.count(key + ".peak_tflops")) {
        mark(p, key, from_base("precision not measured"));
      }
    }
    return Status::ok();
  }

  // gpu.clock_spread: where every rank timed its own GPU through sustained GEMMs, the
  // spread of their rates, as the median over the largest quarter of the plain GEMMs (by
  // FLOPs: the compute-bound ones, whose rate is the clock's) of the ranks' relative
  // standard deviation (n - 1), clamped to 0.2; else the base's figure. Burst timings do
  // not count: a GPU spreads at its power limit, where a training step holds it.
  void clock_spread(SystemProfile& p) {
    std::vector<const GemmSample*> spread;
    for (const GemmSample& gs : s_.gemms)
      if (!gs.accumulate_fp32 && gs.rank_median_s.size() >= 2) spread.push_back(&gs);
    if (s_.gemm_sustain_s <= 0 || spread.empty()) {
      if (p.gpu.clock_spread > 0)
        mark(p, "gpu.clock_spread", from_base("clock spread across GPUs"));
      return;
    }
    std::sort(spread.begin(), spread.end(), [](const GemmSample* a, const GemmSample* b) {
      return a->dims.flops() > b->dims.flops();
    });
    spread.resize((spread.size() + 3) / 4);
    std::vector<double> rel;
    for (const GemmSample* gs : spread) {
      std::vector<double> rates;
      for (double t : gs->rank_median_s) rates.push_back(1.0 / t);
      const double n = static_cast<double>(rates.size());
      double mean = 0, var = 0;
      for (double r : rates) mean += r / n;
      for (double r : rates) var += (r - mean) * (r - mean) / (n - 1);
      rel.push_back(std::sqrt(var) / mean);
    }
    p.gpu.clock_spread = std::min(quantile(rel, 0.5), 0.2);
    mark(p, "gpu.clock_spread",
         fmt::format("{}: the relative standard deviation of {} ranks' sustained GEMM rates "
                     "(each rank its own GPU), the median over the {} largest GEMMs, {:.4f} to "
                     "{:.4f}",
                     measured_, spread.front()->rank_median_s.size(), rel.size(),
                     *std::min_element(rel.begin(), rel.end()),
                     *std::max_element(rel.begin(), rel.end())));
  }

  // gpu.gemm.accumulate_exposed: the median over the GEMMs measured both ways of
  // (time adding into fp32 - plain time) / (the fp32 output's 8 bytes per element at the
  // streaming bandwidth), clamped to [0, 1]; without such pairs, the base's figure.
  void accumulate_exposed(SystemProfile& p) {
    hardware::DeviceProfile& g = p.gpu;
    const double bps = g.memory_bandwidth.bytes_per_s() * g.memory_efficiency;
    std::vector<double> f;
    for (const GemmSample& a : s_.gemms) {
      if (!a.accumulate_fp32) continue;
      for (const GemmSample& plain : s_.gemms)
        if (!plain.accumulate_fp32 && plain.dtype == a.dtype && plain.dims == a.dims && bps > 0)
          f.push_back((a.t.median_s - plain.t.median_s) /
                      (8.0 * static_cast<double>(a.dims.m) * static_cast<double>(a.dims.n) / bps));
    }
    if (f.empty()) {
      if (g.gemm_accumulate_exposed != 0)
        mark(p, "gpu.gemm.accumulate_exposed",
             from_base("exposed fraction of an fp32-accumulating GEMM's output traffic"));
      return;
    }
    std::sort(f.begin(), f.end());
    const double median =
        f.size() % 2 ? f[f.size() / 2] : (f[f.size() / 2 - 1] + f[f.size() / 2]) / 2;
    g.gemm_accumulate_exposed = std::clamp(median, 0.0, 1.0);
    mark(p, "gpu.gemm.accumulate_exposed",
         fmt::format("{}: median over {} GEMMs measured plain and adding into fp32 of (the "
                     "difference in time) / (8 bytes x m x n at {:.1f} GB/s), {:.3f} to {:.3f}, "
                     "clamped to [0, 1]",
                     measured_, f.size(), bps / 1e9, f.front(), f.back()));
  }

  void attention(SystemProfile& p, double rate, bool backward) {
    double& eff = backward ? p.gpu.attention_bwd_efficiency : p.gpu.attention_fwd_efficiency;
    const std::string field =
        backward ? "gpu.attention.bwd_efficiency" : "gpu.attention.fwd_efficiency";
    if (rate <= 0 || s_.attention.empty()) {
      if (!o_.base) eff = 0.5;
      mark(p, field,
           o_.base ? from_base("attention efficiency")
                   : "[not measured] placeholder 0.5 (no attention samples)");
      if (!p.gpu.attention_head_dim_scale.empty())
        mark(p, "gpu.attention.head_dim_scale", from_base("attention rates against the head dim"));
      return;
    }
    // The backend's own attention kernel is what was measured, not the base's named one;
    // the base's unmasked-call factor is that kernel's, so it goes too (unmasked calls then
    // run at the measured rate).
    p.gpu.attention_kernel = hardware::AttentionKernel::kDefault;
    if (!p.gpu.attention_noncausal_scale.empty()) {
      p.gpu.attention_noncausal_scale.clear();
      p.provenance.erase("gpu.attention.noncausal_scale");
    }
    // Likewise its head-dim curve: the measured kernel's is its time per score element.
    p.gpu.attention_head_dim_scale.clear();
    p.provenance.erase("gpu.attention.head_dim_scale");
    const Precision prec = precision_of(s_.attention.front().desc.dtype);
    Precision use = p.gpu.supports(prec) ? prec : Precision::kBf16;
    if (fp32_stands_for_bf16()) use = Precision::kBf16;
    // attention_time() counts backward work as kFlashBackwardWork x the model FLOPs
    // (FlashAttention's benchmark convention): the efficiency is quoted the same way.
    const double work = backward ? hardware::kFlashBackwardWork : 1.0;
    eff = std::clamp(rate * work / p.gpu.peak(use).per_second(), 1e-6, 1.0);
    const auto& by_seq = backward ? f_.attention_bwd_by_seq : f_.attention_fwd_by_seq;
    mark(p, field,
         fmt::format("{}: {} model FLOPs / (time - launch) at seq {} = {:.1f} GFLOP/s{} / {} "
                     "peak",
                     measured_, backward ? "backward (2x forward)" : "forward", by_seq.back().first,
                     rate / 1e9,
                     backward ? " x 2.5/2 (FlashAttention's backward work convention)" : "",
                     hardware::to_string(use)));
    // Shorter sequences run slower: with two or more lengths measured, their rates relative
    // to the longest are the seq-scale curve (device_profile.h).
    if (by_seq.size() < 2) return;
    std::vector<hardware::CurvePoint>& curve =
        backward ? p.gpu.attention_bwd_seq_scale : p.gpu.attention_fwd_seq_scale;
    curve.clear();
    // A shorter length measured faster than the longest is noise (a slow window of a shared
    // host during the long one): its factor is capped at 1.
    std::string rates, seqs;
    for (const auto& [seq, r] : by_seq) {
      curve.push_back({seq, std::clamp(r / rate, 1e-3, 1.0)});
      rates += fmt::format("{}{:.1f}", rates.empty() ? "" : " / ", r / 1e9);
      seqs += fmt::format("{}{}", seqs.empty() ? "" : " / ", seq);
    }
    mark(p, backward ? "gpu.attention.bwd_seq_scale" : "gpu.attention.fwd_seq_scale",
         fmt::format("{}: {} GFLOP/s at seq {} (time - launch), divided by the last (at most 1)",
                     measured_, rates, seqs));
  }

  // gpu.attention.fwd_element_ps / bwd_element_ps: fitted from two head dims per length, the
  // rates then without it; a run with one head dim leaves the measured kernel none (its rates
  // hold the softmax at that head dim, the base's figure is another kernel's), one without
  // attention keeps the base's.
  void attention_elements(SystemProfile& p) {
    if (s_.attention.empty()) {
      if (p.gpu.attention_fwd_element_ps > 0 || p.gpu.attention_bwd_element_ps > 0)
        mark(p, "gpu.attention.element_ps", from_base("attention's time per score element"));
      return;
    }
    p.gpu.attention_fwd_element_ps = f_.attention_fwd_element_s * 1e12;
    p.gpu.attention_bwd_element_ps = f_.attention_bwd_element_s * 1e12;
    if (!f_.attention_elements_fitted) {
      p.provenance.erase("gpu.attention.element_ps");
      return;
    }
    mark(p, "gpu.attention.element_ps",
         fmt::format("{}: {:.0f} / {:.0f} ps per score element forward / backward, from causal "
                     "calls at two head dims per key length: their time less the launch per "
                     "model FLOP falls with the head dim as 1 / rate + e / (4 d) (backward "
                     "8 d); the median over lengths",
                     measured_, f_.attention_fwd_element_s * 1e12,
                     f_.attention_bwd_element_s * 1e12));
  }

  // gpu.attention.noncausal_scale from the lengths timed both ways; attention() dropped the
  // base's (another kernel's) once attention was measured, and with no unmasked samples
  // unmasked calls run at the measured causal rate.
  void unmasked_attention(SystemProfile& p) {
    std::vector<hardware::CurvePoint>& curve = p.gpu.attention_noncausal_scale;
    if (f_.attention_unmasked_by_seq.empty() || f_.attention_fwd_by_seq.empty()) {
      if (!curve.empty())
        mark(p, "gpu.attention.noncausal_scale", from_base("unmasked attention's speed-up"));
      return;
    }
    curve.clear();
    std::string factors, seqs;
    for (const auto& [seq, factor] : f_.attention_unmasked_by_seq) {
      // Clamped to the validator's range: a factor outside it is a broken timing, not a kernel.
      curve.push_back({seq, std::clamp(factor, 0.1, hardware::kMaxNoncausalScale)});
      factors += fmt::format("{}{:.3f}", factors.empty() ? "" : " / ", factor);
      seqs += fmt::format("{}{}", seqs.empty() ? "" : " / ", seq);
    }
    mark(p, "gpu.attention.noncausal_scale",
         fmt::format("{}: {} at seq {}: per length, (the unmasked forward and backward calls' "
                     "FLOPs at the causal calls' rates) / (their time - launch), clamped to "
                     "[0.1, {}]",
                     measured_, factors, seqs, hardware::kMaxNoncausalScale));
  }

  // A run that measured fp32 GEMMs and no bf16 ones (the cpu backend computes every dtype
  // in fp32) lets the fp32 figures stand for bf16, which every profile needs.
  bool fp32_stands_for_bf16() const {
    bool fp32 = false;
    for (const GemmFit& gf : f_.gemm) {
      if (gf.dtype == DType::kBf16) return false;
      fp32 = fp32 || gf.dtype == DType::kF32;
    }
    return fp32;
  }

  const CollectiveFit* pooled_p2p(CollectiveScope scope) const {
    for (const CollectiveFit& c : f_.collectives)
      if (c.scope == scope && c.op == Collective::kSendRecv) return &c;
    return nullptr;
  }

  void intra(SystemProfile& p) {
    hardware::IntraNodeFabric& f = p.intra_node;
    if (p.gpus_per_node == 1) {
      f = {};
      mark(p, "intra_node", "one rank per host: no intra-node fabric");
      return;
    }
    if (!o_.base) f.kind = hardware::FabricKind::kPcie;
    if (f.nvls && f.nvls_min_group > p.gpus_per_node) f.nvls = false;
    if (const CollectiveFit* c = pooled_p2p(CollectiveScope::kIntraNode)) {
      f.bandwidth = Bandwidth::bytes_per_s(std::round(c->fit.beta_Bps));
      f.latency = Time::seconds(c->fit.alpha_s);
      mark(p, "intra_node",
           fmt::format("{}: P2P between every pair of ranks on one host, pooled alpha-beta fit "
                       "(R^2 {:.4f}){}",
                       measured_, c->fit.r2,
                       o_.base ? "; fabric kind and NVLS from the base profile " + o_.base_ref
                               : "; fabric \"pcie\" stands for any non-switched host fabric"));
    } else {
      mark(p, "intra_node", from_base("intra-node fabric"));
    }
    // Not measured by the sweeps (they run no compute beside collectives).
    if (f.registered_collective_sms != hardware::RegisteredCollectiveSms{})
      mark(p, "intra_node.registered_collective_sms", from_base("registered collectives' SMs"));
  }

  void inter(SystemProfile& p, int hosts) {
    hardware::InterNodeNetwork& n = p.inter_node;
    const CollectiveFit* c = hosts > 1 ? pooled_p2p(CollectiveScope::kInterNode) : nullptr;
    if (c) {
      if (!o_.base) n.nics_per_node = 1;
      n.nic_bandwidth = Bandwidth::bytes_per_s(std::round(c->fit.beta_Bps));
      n.latency = Time::seconds(c->fit.alpha_s);
      mark(p, "inter_node",
           fmt::format("{}: P2P between ranks on different hosts, pooled alpha-beta fit (R^2 "
                       "{:.4f}); nics_per_node {}",
                       measured_, c->fit.r2,
                       o_.base ? "from the base profile " + o_.base_ref : "1 [not measured]"));
    } else if (o_.base) {
      mark(p, "inter_node", from_base("inter-node network (one host measured)"));
    } else if (const CollectiveFit* intra = pooled_p2p(CollectiveScope::kIntraNode)) {
      n.nics_per_node = 1;
      n.nic_bandwidth = Bandwidth::bytes_per_s(std::round(intra->fit.beta_Bps));
      n.latency = Time::seconds(intra->fit.alpha_s);
      mark(p, "inter_node",
           "[not measured] one host: copied from the intra-node P2P fit; run across hosts or "
           "pass --base for a real network");
    } else {
      n = {};
      n.nics_per_node = 1;
      n.nic_bandwidth = Bandwidth::gbit_per_s(10);
      n.latency = Time::us(50);
      mark(p, "inter_node", "[not measured] one rank: placeholder 10 Gb/s Ethernet, 50 us");
    }
    if (n.registered_collective_sms != hardware::RegisteredCollectiveSms{})
      mark(p, "inter_node.registered_collective_sms", from_base("registered collectives' SMs"));
  }

  // The profile's figure of (scope, op) from the fits of that scope: busbw per group size
  // (ranks inside a host, hosts across them), alpha of the largest group.
  std::optional<CollectiveFigure> measured_figure(CollectiveScope scope, Collective op,
                                                  std::string* how) const {
    CollectiveFigure fig;
    fig.scope = scope;
    fig.op = op;
    double worst_r2 = 1, worst_res = 0;
    const CollectiveFit* largest = nullptr;
    for (const CollectiveFit& c : f_.collectives) {
      if (c.scope != scope || c.op != op) continue;
      const int size = scope == CollectiveScope::kIntraNode ? c.ranks : c.nodes;
      fig.busbw.emplace_back(size, Bandwidth::bytes_per_s(std::round(c.busbw_Bps)));
      fig.alpha = Time::seconds(c.fit.alpha_s);  // sorted by ranks: the largest group last
      largest = &c;
      worst_r2 = std::min(worst_r2, c.fit.r2);
      worst_res = std::max(worst_res, c.fit.max_rel_residual);
    }
    if (fig.busbw.empty()) return std::nullopt;
    std::sort(fig.busbw.begin(), fig.busbw.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    if (op != Collective::kSendRecv) fig.size_scale = size_scale(*largest);
    *how = fmt::format(
        "{}: alpha-beta fit per group size ({} to {} {}), busbw = beta x nccl-tests bus factor, "
        "alpha of the largest group; worst R^2 {:.4f}, worst max relative residual {:.3f}{}",
        measured_, fig.busbw.front().first, fig.busbw.back().first,
        scope == CollectiveScope::kIntraNode ? "ranks" : "hosts", worst_r2, worst_res,
        fig.size_scale.empty()
            ? ""
            : fmt::format("; size_scale from the largest group's {} samples whose bandwidth "
                          "term is at least alpha",
                          fig.size_scale.size()));
    return fig;
  }

  // The ramp over message sizes (CollectiveFigure::size_scale) of the largest group's
  // samples: at each size whose bandwidth term reaches alpha (below it the latency
  // dominates and the factor is noise), the share of the fitted bandwidth the sample reached
  // once alpha is paid, so that the simulator's alpha + S / (beta x factor) gives the
  // measured time there. Factors within 3 % of 1 everywhere (the line fits): none. Capped at
  // the validator's (0, 1.5].
  std::vector<CurvePoint> size_scale(const CollectiveFit& c) const {
    std::vector<CurvePoint> out;
    bool ramps = false;
    for (const CollectiveSample& smp : s_.collectives) {
      if (smp.scope != c.scope || smp.op != c.op || smp.ranks != c.ranks || smp.nodes != c.nodes)
        continue;
      const double bandwidth_s = static_cast<double>(smp.bytes) / c.fit.beta_Bps;
      if (bandwidth_s < c.fit.alpha_s || smp.bytes < 1) continue;
      const double paid = smp.t.median_s - c.fit.alpha_s;
      const double factor = paid > 0 ? std::clamp(bandwidth_s / paid, 0.05, 1.5) : 1.5;
      out.push_back({smp.bytes, factor});
      ramps = ramps || std::fabs(factor - 1) > 0.03;
    }
    if (!ramps) return {};
    std::sort(out.begin(), out.end(),
              [](const CurvePoint& a, const CurvePoint& b) { return a.at < b.at; });
    out.erase(std::unique(out.begin(), out.end(),
                          [](const CurvePoint& a, const CurvePoint& b) { return a.at == b.at; }),
              out.end());  // one factor per size (the first sample's)
    return out;
  }

  // The intra-node all_reduce `ring`, measured with NVLS switched off: on a node with NVLS
  // (the base's, intra()), the base's figure with `ring` as its figure without NVLS;
  // elsewhere `ring` itself, the node's own figure.
  CollectiveFigure without_nvls(SystemProfile& p, CollectiveFigure ring, const std::string& key,
                                std::string* how) {
    if (!p.intra_node.nvls || !o_.base || !o_.base->has_collective(ring.scope, ring.op)) {
      *how += "; NCCL ran with NVLS disabled (NCCL_NVLS_ENABLE=0), as this node runs";
      return ring;
    }
    CollectiveFigure fig = o_.base->collective(ring.scope, ring.op);
    fig.busbw_without_nvls = std::move(ring.busbw);
    fig.size_scale_without_nvls = std::move(ring.size_scale);
    const std::string measured = fmt::format(
        "NCCL's ring with NVLS disabled (NCCL_NVLS_ENABLE=0, what a cluster's \"nvls\": false "
        "runs), {}",
        *how);
    mark(p, key + ".busbw_without_nvls_GBps", measured);
    if (!fig.size_scale_without_nvls.empty()) mark(p, key + ".size_scale_without_nvls", measured);
    *how = from_base("figure with NVLS (this run measured NCCL without it)");
    return fig;
  }

  Status collectives(SystemProfile& p, int hosts) {
    std::vector<CollectiveFigure> out;
    for (CollectiveScope scope : hardware::kAllScopes) {
      if (scope == CollectiveScope::kIntraNode && p.gpus_per_node == 1) continue;
      for (Collective op : hardware::kAllCollectives) {
        const std::string key =
            fmt::format("collectives.{}.{}", hardware::to_string(scope), hardware::to_string(op));
        std::string how;
        std::optional<CollectiveFigure> fig;
        if (scope == CollectiveScope::kIntraNode || hosts > 1)
          fig = measured_figure(scope, op, &how);
        if (fig && o_.nvls_disabled && scope == CollectiveScope::kIntraNode &&
            op == Collective::kAllReduce)
          fig = without_nvls(p, *std::move(fig), key, &how);
        if (!fig && o_.base && o_.base->has_collective(scope, op)) {
          fig = o_.base->collective(scope, op);
          how = from_base("figure");
          // Its ring for NVLS switched off describes NVLS hardware (intra(): a node of
          // fewer GPUs than NVLS needs has none).
          if (!p.intra_node.nvls) {
            fig->busbw_without_nvls.clear();
            fig->size_scale_without_nvls.clear();
          }
        }
        if (!fig && scope == CollectiveScope::kInterNode && p.gpus_per_node > 1) {
          fig = measured_figure(CollectiveScope::kIntraNode, op, &how);
          if (fig) {
            fig->scope = scope;
            fig->busbw = {{2, fig->busbw.back().second}};
            how =
                "[not measured] one host: copied from the intra-node figure of the largest "
                "group; run across hosts or pass --base";
          }
        }
        if (!fig && scope == CollectiveScope::kInterNode) {
          fig.emplace();  // member by member: -Wmissing-field-initializers
          fig->scope = scope;
          fig->op = op;
          fig->alpha = p.inter_node.latency;
          fig->busbw = {{2, p.inter_node.nic_bandwidth}};
          how = "[not measured] from the inter_node placeholder";
        }
        if (!fig)
          return Status::invalid_argument(
              fmt::format("calibration: no samples for {} {} and no base profile",
                          hardware::to_string(scope), hardware::to_string(op)));
        mark(p, key, how);
        out.push_back(*fig);
      }
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
      return std::pair(a.scope, a.op) < std::pair(b.scope, b.op);
    });
    p.collectives = std::move(out);
    return Status::ok();
  }

  const Samples& s_;
  const Fits& f_;
  const ProfileOptions& o_;
  std::string measured_;
};

}  // namespace

Result<SystemProfile> build_profile(const Samples& samples, const Fits& fits,
                                    const ProfileOptions& opts) {
  return Builder(samples, fits, opts).build();
}

}  // namespace hetpar::calibrate
