// `hetpar calibrate --backend cpu|cuda [--quick] [--out FILE] [--base PROFILE] [--name N]
// [--shapes-from SCENARIO [--max-shapes K]]`: run under `mpirun -np N` (one process per
// device). Every rank sweeps; rank 0 fits the samples, prints the fitted figures, and writes
// the profile (with the raw samples under "$calibration") atomically. Progress goes to
// stderr on rank 0. --shapes-from adds the GEMMs a scenario's plan runs (lowered as
// `hetpar validate` runs it) in its workload's dtype: the profile's GEMM table is exact at
// measured shapes, so a plan validated against it meets no interpolation error. Run with
// NCCL_NVLS_ENABLE=0 and --base a profile measured with NVLS, it adds NCCL's ring without
// NVLS to the base's intra-node all_reduce (ProfileOptions::nvls_disabled).
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <utility>

#include "commands.h"
#include "hetpar/calibrate/profile.h"
#include "hetpar/calibrate/sweep.h"
#include "hetpar/core/file_io.h"
#include "hetpar/planner/kernels.h"
#include "hetpar/planner/lower.h"
#include "hetpar/planner/scenario.h"
#include "hetpar/runtime/backend.h"

namespace hetpar::cli {

namespace {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", tm);
}

void print_fits(const calibrate::Fits& f, const calibrate::Samples& s, const std::string& out) {
  fmt::print("Calibrated {} ({} backend), {} rank{} on {} host{}, {:.1f} s\n", s.device.name,
             s.device.backend, s.device.world, s.device.world == 1 ? "" : "s", s.topology.hosts(),
             s.topology.hosts() == 1 ? "" : "s", s.wall_s);
  const auto print_gemms = [](const calibrate::GemmFit& g, std::string_view what) {
    fmt::print(
        "GEMM {:<5}    {} shapes{}: best {:.1f} GFLOP/s ({}x{}x{}), median {:.1f}, min {:.1f}\n",
        runtime::to_string(g.dtype), g.shapes, what, g.max_flops_per_s / 1e9, g.best.m, g.best.n,
        g.best.k, g.median_flops_per_s / 1e9, g.min_flops_per_s / 1e9);
  };
  for (const calibrate::GemmFit& g : f.gemm) print_gemms(g, "");
  for (const calibrate::GemmFit& g : f.gemm_accumulate) print_gemms(g, " adding into fp32");
  // The cost of adding into fp32: each such shape's time against its plain measurement.
  for (const calibrate::GemmFit& g : f.gemm_accumulate) {
    std::vector<double> ratios;
    for (const calibrate::GemmSample& a : s.gemms) {
      if (!a.accumulate_fp32 || a.dtype != g.dtype) continue;
      for (const calibrate::GemmSample& b : s.gemms)
        if (!b.accumulate_fp32 && b.dtype == a.dtype && b.dims == a.dims && b.t.median_s > 0)
          ratios.push_back(a.t.median_s / b.t.median_s);
    }
    if (ratios.empty()) continue;
    std::sort(ratios.begin(), ratios.end());
    fmt::print(
        "GEMM {:<5}    adding into fp32 takes {:.2f}x the plain time (median of {}; {:.2f} "
        "to {:.2f})\n",
        runtime::to_string(g.dtype), ratios[ratios.size() / 2], ratios.size(), ratios.front(),
        ratios.back());
  }
  fmt::print("Launch        {:.2f} us (8x8x8 GEMM)\n", f.launch_s * 1e6);
  if (f.attention_fwd_flops_per_s > 0)
    fmt::print("Attention     forward {:.1f} GFLOP/s, backward {:.1f} GFLOP/s at seq {}\n",
               f.attention_fwd_flops_per_s / 1e9, f.attention_bwd_flops_per_s / 1e9,
               f.attention_fwd_by_seq.back().first);
  for (size_t i = 0; i + 1 < f.attention_fwd_by_seq.size(); ++i)
    fmt::print(
        "              seq {:>5}: forward {:.1f} GFLOP/s{}\n", f.attention_fwd_by_seq[i].first,
        f.attention_fwd_by_seq[i].second / 1e9,
        i < f.attention_bwd_by_seq.size()
            ? fmt::format(", backward {:.1f} GFLOP/s", f.attention_bwd_by_seq[i].second / 1e9)
            : std::string());
  if (!f.attention_unmasked_by_seq.empty()) {
    std::string factors;
    for (const auto& [seq, factor] : f.attention_unmasked_by_seq)
      factors += fmt::format("{}{:.2f}x at {}", factors.empty() ? "" : ", ", factor, seq);
    fmt::print("              unmasked per FLOP (causal = 1): {}\n", factors);
  }
  if (f.attention_elements_fitted)
    fmt::print("              per score element (softmax): forward {:.0f} ps, backward {:.0f} ps\n",
               f.attention_fwd_element_s * 1e12, f.attention_bwd_element_s * 1e12);
  if (f.memory)
    fmt::print(
        "Memory        {:.1f} GB/s read+write (median traffic / time; alpha-beta fit {:.1f} GB/s, "
        "alpha {:.2f} us, R^2 {:.4f})\n",
        f.memory_Bps / 1e9, f.memory->beta_Bps / 1e9, f.memory->alpha_s * 1e6, f.memory->r2);
  if (f.host_to_device_Bps > 0)
    fmt::print("Host link     to device {:.1f} GB/s, to host {:.1f} GB/s\n",
               f.host_to_device_Bps / 1e9, f.device_to_host_Bps / 1e9);
  if (!f.collectives.empty())
    fmt::print("\n{:<11} {:<15} {:>5} {:>5} {:>10} {:>11} {:>11} {:>8} {:>9}\n", "scope", "op",
               "ranks", "hosts", "alpha_us", "algbw_GB/s", "busbw_GB/s", "R^2", "max_res");
  for (const calibrate::CollectiveFit& c : f.collectives)
    fmt::print("{:<11} {:<15} {:>5} {:>5} {:>10.2f} {:>11.2f} {:>11.2f} {:>8.4f} {:>9.3f}{}\n",
               hardware::to_string(c.scope), hardware::to_string(c.op), c.ranks, c.nodes,
               c.fit.alpha_s * 1e6, c.fit.beta_Bps / 1e9, c.busbw_Bps / 1e9, c.fit.r2,
               c.fit.max_rel_residual, c.fit.fallback ? " (bounds)" : "");
  fmt::print("\nProfile written to {}\n", out);
}

// The built-in profile of a known GPU (datasheet peaks, NVLink/NIC figures a one-node run
// cannot measure), by the device name CUDA reports; "" when none matches.
std::string default_base(const runtime::DeviceInfo& d) {
  if (d.backend != "cuda") return "";
  const std::pair<const char*, const char*> known[] = {{"H200", "dgx-h200"},
                                                       {"H100", "dgx-h100"},
                                                       {"A100", "dgx-a100-80gb"},
                                                       {"B200", "dgx-b200"},
                                                       {"4090", "rtx4090-node"}};
  for (const auto& [needle, profile] : known)
    if (d.name.find(needle) != std::string::npos) return profile;
  return "";
}

// The GEMMs of `path`'s plan, added to `plan` (shapes not already there, at most `max`,
// most FLOPs first) with the workload's dtype for GEMMs and attention; an fp8 workload's
// GEMMs are measured in fp8 (TN, as the sweep runs them) and its attention stays in bf16,
// as Transformer Engine runs it.
Status add_plan_shapes(const std::string& path, int max, calibrate::SweepPlan& plan,
                       std::string* what) {
  if (max < 1) return Status::invalid_argument(fmt::format("--max-shapes {} must be >= 1", max));
  HETPAR_ASSIGN_OR_RETURN(planner::Scenario s, planner::load_scenario(path));
  if (!s.plan)
    return Status::invalid_argument(fmt::format(
        "{}: plan: missing required object (--shapes-from measures the plan's GEMMs)", path));
  // Userbuffers' ring exchange runs each layer linear in tp chunks, which lower() has no
  // kernel lists for (the executor runs whole GEMMs): measure the whole GEMMs; the profile's
  // table carries their rate to the chunks' shapes (the ratio is interpolated in log space).
  planner::Plan whole = *s.plan;
  bool userbuffers = std::exchange(whole.layout.tp_comm_overlap, false);
  for (planner::ModulePlan& m : whole.modules)
    userbuffers = std::exchange(m.layout.tp_comm_overlap, false) || userbuffers;
  planner::LowerOptions lo;
  lo.full_ranks = lo.kernels = true;
  HETPAR_ASSIGN_OR_RETURN(planner::LoweredPlan lp, planner::lower(s, whole, lo));
  const hardware::Precision p = s.workload.precision;
  const runtime::DType t = p == hardware::Precision::kFp8    ? runtime::DType::kF8E4M3
                           : p == hardware::Precision::kBf16 ? runtime::DType::kBf16
                           : p == hardware::Precision::kFp16 ? runtime::DType::kF16
                                                             : runtime::DType::kF32;
  // Every shape is measured plain; a wgrad that adds into the fp32 main_grad
  // (Layout::gradient_accumulation_fusion) also so, to compare, in its own operands' dtype:
  // the plan's, but bf16 for an fp8 plan's 16-bit GEMMs (the output layer's).
  const size_t accumulating_before = plan.accumulate_gemms.size();
  int added = 0, total = 0;
  for (const sim::Kernel& k : planner::distinct_gemms(lp.graph)) {
    ++total;
    if (added >= max) continue;
    const calibrate::GemmDims d{k.m, k.n, k.k};
    const bool plain = std::find(plan.gemms.begin(), plan.gemms.end(), d) == plan.gemms.end();
    if (plain) plan.gemms.push_back(d);
    const runtime::DType kt =
        t == runtime::DType::kF8E4M3 && k.element_bytes != 1 ? runtime::DType::kBf16 : t;
    const calibrate::AccumulateGemm ag{d, kt};
    const bool accumulating =
        k.accumulate_fp32 && std::find(plan.accumulate_gemms.begin(), plan.accumulate_gemms.end(),
                                       ag) == plan.accumulate_gemms.end();
    if (accumulating) plan.accumulate_gemms.push_back(ag);
    if (plain || accumulating) ++added;
  }
  const size_t accumulating = plan.accumulate_gemms.size() - accumulating_before;
  if (std::find(plan.gemm_dtypes.begin(), plan.gemm_dtypes.end(), t) == plan.gemm_dtypes.end())
    plan.gemm_dtypes.push_back(t);
  // Attention in the dtype the plan runs it in too (its efficiency is then quoted against
  // that dtype's measured peak, the one attention_time() reads for the plan); fp8 plans run
  // it in bf16.
  const runtime::DType at = t == runtime::DType::kF8E4M3 ? runtime::DType::kBf16 : t;
  for (runtime::AttentionDesc& a : plan.attention) a.dtype = at;
  const std::string dtype = std::string(runtime::to_string(t));
  *what = fmt::format(
      "{} of the {} GEMM shapes of {}'s plan ({} of them weight gradients, "
      "also measured adding into fp32), dtypes {}{}",
      added, total, path, accumulating, dtype,
      userbuffers ? "; its tp_comm_overlap linears as whole GEMMs, not userbuffers' chunks" : "");
  return Status::ok();
}

}  // namespace

int run_calibrate(const CalibrateOptions& opts) {
  auto backend = runtime::make_backend(opts.backend);
  if (!backend.is_ok()) return report_error(backend.status());
  runtime::Backend& b = **backend;
  const bool root = b.info().rank == 0;

  calibrate::ProfileOptions po;
  po.name = opts.name;
  po.date = utc_now();
  po.mode = opts.quick ? "quick" : "full";
  const std::string base_ref = opts.base.empty() ? default_base(b.info()) : opts.base;
  if (!base_ref.empty()) {
    auto base = hardware::load_profile(base_ref);
    if (!base.is_ok()) return report_error(base.status().with_context("--base"));
    po.base = *base;
    po.base_ref = base_ref;
    if (root && opts.base.empty())
      fmt::print(stderr, "calibrate: base profile {} (for {}; --base overrides)\n", base_ref,
                 b.info().name);
  }
  // NCCL reads NCCL_NVLS_ENABLE once, at its first communicator: the whole run's
  // all_reduces are then rings, measured as the profile's figure without NVLS.
  if (const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
      opts.backend == "cuda" && nvls && std::string_view(nvls) == "0") {
    po.nvls_disabled = true;
    if (root)
      fmt::print(stderr,
                 "calibrate: NCCL_NVLS_ENABLE=0: the intra-node all_reduce is measured as the "
                 "ring a cluster's \"nvls\": false runs\n");
  }
  const std::string out =
      opts.out.empty() ? fmt::format("calibrated-{}.json", opts.backend) : opts.out;

  std::string last_phase;
  auto progress = [&](std::string_view phase, int done, int total) {
    if (phase != last_phase || done % 20 == 0 || done + 1 == total)
      fmt::print(stderr, "calibrate: [{:>4}/{}] {}\n", done + 1, total, phase);
    last_phase = std::string(phase);
  };
  calibrate::SweepPlan plan = calibrate::default_plan(opts.backend, opts.quick);
  plan.gemm_sustain_s = opts.sustain_s;
  if (!opts.shapes_from.empty()) {
    std::string what;
    Status st = add_plan_shapes(opts.shapes_from, opts.max_shapes, plan, &what);
    if (!st.is_ok()) return report_error(st.with_context("--shapes-from"));
    if (root) fmt::print(stderr, "calibrate: adds {}\n", what);
    po.plan_shapes = fmt::format("the plan of {} (--shapes-from)", opts.shapes_from);
  }
  auto samples = calibrate::run_sweeps(b, plan, progress);
  if (!samples.is_ok()) return report_error(samples.status());
  if (!root) return 0;

  auto fits = calibrate::fit_samples(*samples);
  if (!fits.is_ok()) return report_error(fits.status());
  auto profile = calibrate::build_profile(*samples, *fits, po);
  if (!profile.is_ok()) return report_error(profile.status());
  Status st = write_file_atomically(
      out, calibrate::calibration_to_json_text(*profile, *samples, *fits, po));
  if (!st.is_ok()) return report_error(st);
  print_fits(*fits, *samples, out);
  return 0;
}

}  // namespace hetpar::cli
