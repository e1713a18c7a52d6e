// The calibration file: the profile in the built-in schema plus a "$calibration"
// annotation (run provenance, fits, raw samples) that the profile parser skips.
#include <nlohmann/json.hpp>

#include "hetpar/calibrate/profile.h"
#include "hetpar/hardware/hardware_json.h"

namespace hetpar::calibrate {

namespace {

using nlohmann::json;

json stats_json(const TimingStats& t) {
  return {{"median_us", t.median_s * 1e6}, {"p10_us", t.p10_s * 1e6}, {"p90_us", t.p90_s * 1e6},
          {"min_us", t.min_s * 1e6},       {"max_us", t.max_s * 1e6}, {"reps", t.reps}};
}

json fit_json(const AlphaBetaFit& f) {
  json j = {{"alpha_us", f.alpha_s * 1e6},
            {"beta_GBps", f.beta_Bps / 1e9},
            {"r2", f.r2},
            {"max_rel_residual", f.max_rel_residual},
            {"points", f.points}};
  if (f.alpha_clamped) j["alpha_clamped"] = true;
  if (f.fallback) j["fallback"] = true;
  return j;
}

json fits_json(const Fits& f) {
  json gemm = json::array();
  auto add = [&gemm](const GemmFit& g, bool into_fp32) {
    json j = {
        {"dtype", runtime::to_string(g.dtype)},  {"shapes", g.shapes},
        {"max_gflops", g.max_flops_per_s / 1e9}, {"median_gflops", g.median_flops_per_s / 1e9},
        {"min_gflops", g.min_flops_per_s / 1e9}, {"best", {g.best.m, g.best.n, g.best.k}}};
    if (into_fp32) j["into_fp32"] = true;  // beta 1, fp32 C (the weight gradients)
    gemm.push_back(j);
  };
  for (const GemmFit& g : f.gemm) add(g, false);
  for (const GemmFit& g : f.gemm_accumulate) add(g, true);
  json colls = json::array();
  for (const CollectiveFit& c : f.collectives) {
    json j = fit_json(c.fit);
    j["scope"] = hardware::to_string(c.scope);
    j["op"] = hardware::to_string(c.op);
    j["ranks"] = c.ranks;
    j["nodes"] = c.nodes;
    j["busbw_GBps"] = c.busbw_Bps / 1e9;
    colls.push_back(j);
  }
  json pairs = json::array();
  for (const PairFit& p : f.pairs) {
    json j = fit_json(p.fit);
    j["src"] = p.src;
    j["dst"] = p.dst;
    j["scope"] = hardware::to_string(p.scope);
    pairs.push_back(j);
  }
  json j = {{"gemm", gemm},
            {"launch_us", f.launch_s * 1e6},
            {"attention_fwd_gflops", f.attention_fwd_flops_per_s / 1e9},
            {"attention_bwd_gflops", f.attention_bwd_flops_per_s / 1e9},
            {"host_to_device_GBps", f.host_to_device_Bps / 1e9},
            {"device_to_host_GBps", f.device_to_host_Bps / 1e9},
            {"collectives", colls},
            {"p2p_pairs", pairs}};
  if (f.attention_elements_fitted)
    j["attention_element_ps"] = {{"fwd", f.attention_fwd_element_s * 1e12},
                                 {"bwd", f.attention_bwd_element_s * 1e12}};
  if (!f.attention_unmasked_by_seq.empty()) {
    json unmasked = json::array();  // [seq, factor] rows, as the profile's noncausal_scale
    for (const auto& [seq, factor] : f.attention_unmasked_by_seq) unmasked.push_back({seq, factor});
    j["attention_unmasked_scale"] = unmasked;
  }
  if (f.memory) j["memory_traffic"] = fit_json(*f.memory);
  if (f.memory_Bps > 0) j["memory_GBps"] = f.memory_Bps / 1e9;
  return j;
}

json samples_json(const Samples& s) {
  json gemm = json::array();
  for (const GemmSample& g : s.gemms) {
    json j = stats_json(g.t);
    j["m"] = g.dims.m;
    j["n"] = g.dims.n;
    j["k"] = g.dims.k;
    j["dtype"] = runtime::to_string(g.dtype);
    if (g.accumulate_fp32) j["into_fp32"] = true;  // beta 1, fp32 C
    j["gflops"] = g.flops_per_s() / 1e9;
    if (!g.rank_median_s.empty()) j["rank_median_s"] = g.rank_median_s;  // each GPU's own
    gemm.push_back(j);
  }
  json att = json::array();
  for (const AttentionSample& a : s.attention) {
    json j = stats_json(a.t);
    j["batch"] = a.desc.batch;
    j["heads"] = a.desc.heads;
    j["kv_heads"] = a.desc.kv_heads;
    j["seq"] = a.desc.seq_q;
    j["head_dim"] = a.desc.head_dim;
    j["causal"] = a.desc.causal;
    j["dtype"] = runtime::to_string(a.desc.dtype);
    j["pass"] = a.backward ? "backward" : "forward";
    j["gflops"] = a.flops() / a.t.median_s / 1e9;
    att.push_back(j);
  }
  json copies = json::array();
  for (const CopySample& c : s.copies) {
    json j = stats_json(c.t);
    j["kind"] = !c.host ? "device_copy" : c.to_host ? "device_to_host" : "host_to_device";
    j["bytes"] = c.bytes;
    copies.push_back(j);
  }
  json p2p = json::array();
  for (const P2PSample& p : s.p2p) {
    json j = stats_json(p.t);
    j["src"] = p.src;
    j["dst"] = p.dst;
    j["scope"] = hardware::to_string(p.scope);
    j["bytes"] = p.bytes;
    p2p.push_back(j);
  }
  json colls = json::array();
  for (const CollectiveSample& c : s.collectives) {
    json j = stats_json(c.t);
    j["op"] = hardware::to_string(c.op);
    j["scope"] = hardware::to_string(c.scope);
    j["ranks"] = c.ranks;
    j["nodes"] = c.nodes;
    j["bytes"] = c.bytes;
    colls.push_back(j);
  }
  return {
      {"gemm", gemm}, {"attention", att}, {"copies", copies}, {"p2p", p2p}, {"collectives", colls}};
}

}  // namespace

std::string calibration_to_json_text(const hardware::SystemProfile& profile, const Samples& s,
                                     const Fits& fits, const ProfileOptions& opts) {
  json j = hardware::profile_to_json(profile);
  j["$calibration"] = {
      {"tool", "hetpar calibrate"},
      {"backend", s.device.backend},
      {"device", s.device.name},
      {"versions", s.device.versions},
      {"date", opts.date},
      {"mode", opts.mode},
      {"world", s.device.world},
      {"hosts", s.topology.hosts()},
      {"host_cores", s.device.host_cores},
      {"host_of_rank", s.topology.host_of_rank},
      {"base", opts.base ? opts.base_ref : ""},
      {"nvls_disabled", opts.nvls_disabled},
      {"warmup", s.warmup},
      {"reps", s.reps},
      {"wall_s", s.wall_s},
      {"size_conventions",
       "nccl-tests: all_reduce/broadcast S = buffer, all_gather/reduce_scatter S = whole array, "
       "all_to_all S = one rank's send buffer, p2p S = message; device_copy bytes = copied once "
       "(traffic 2x)"},
      {"fits", fits_json(fits)},
      {"samples", samples_json(s)}};
  return j.dump(1) + "\n";
}

}  // namespace hetpar::calibrate
