// Sweeps on a backend double with known costs (fake_backend.h): the samples, fits and the
// profile they make recover those costs; the profile passes hardware's parser and
// validation and round-trips through the calibration JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "fake_backend.h"
#include "hetpar/calibrate/profile.h"
#include "hetpar/calibrate/sweep.h"
#include "hetpar/hardware/cluster.h"
#include "hetpar/hardware/hardware_json.h"

namespace hetpar::calibrate {
namespace {

using hardware::Collective;
using hardware::CollectiveScope;
using hardware::Precision;
using testing::FakeBackend;
using testing::FakeModel;

SweepPlan small_plan() {
  SweepPlan p = default_plan("cpu", /*quick=*/true);
  p.reps = 3;
  p.warmup = 1;
  return p;
}

// Options for a profile on the built-in H100's datasheet and unmeasured figures.
ProfileOptions h100_based(std::string date) {
  ProfileOptions o;
  o.base = *hardware::load_profile("dgx-h100");
  o.base_ref = "dgx-h100";
  o.date = std::move(date);
  return o;
}

Samples sweep(FakeBackend& b, const SweepPlan& plan) {
  int calls = 0, last_total = 0;
  Result<Samples> s = run_sweeps(b, plan, [&](std::string_view, int done, int total) {
    EXPECT_EQ(done, calls);
    ++calls;
    last_total = total;
  });
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(calls, last_total);  // one progress call per sample
  return s.is_ok() ? *s : Samples{};
}

TEST(Sweep, SamplesAndFitsRecoverTheBackendsCosts) {
  const FakeModel m;
  FakeBackend b(2, m);
  const SweepPlan plan = small_plan();
  const Samples s = sweep(b, plan);

  ASSERT_EQ(s.gemms.size(), plan.gemms.size());
  for (const GemmSample& g : s.gemms) {
    EXPECT_NEAR(g.t.median_s / m.gemm_s(g.dims.m, g.dims.n, g.dims.k), 1.0, 1e-6);
    EXPECT_EQ(g.t.reps, plan.reps);
  }
  // A flush before every timed GEMM and attention call, except GEMMs with operands under
  // 64 KiB (timed warm: per-call overhead).
  int flushed_gemms = 0;
  for (const GemmDims& d : plan.gemms)
    flushed_gemms += (d.m * d.k + d.k * d.n + d.m * d.n) * 4 >= 64 * 1024;
  EXPECT_LT(flushed_gemms, static_cast<int>(plan.gemms.size()));  // 8x8x8 is warm
  EXPECT_EQ(b.flushes, static_cast<int>(plan.reps * (flushed_gemms + 2 * plan.attention.size())));
  ASSERT_EQ(s.attention.size(), 2 * plan.attention.size());
  ASSERT_EQ(s.p2p.size(), plan.p2p_bytes.size());  // one pair
  ASSERT_EQ(s.collectives.size(), plan.collectives.size() * plan.collective_bytes.size());
  EXPECT_EQ(s.topology.hosts(), 1);

  Result<Fits> f = fit_samples(s);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_NEAR(f->launch_s, m.gemm_s(8, 8, 8), 1e-12);
  // Attention: the rate of the longest key length, and each length's own rate, without the
  // launch.
  EXPECT_NEAR(f->attention_fwd_flops_per_s / m.attention_rate, 1.0, 1e-6);
  EXPECT_NEAR(f->attention_bwd_flops_per_s / m.attention_rate, 1.0, 1e-6);
  // The rates are the causal calls'; the plan times each length unmasked too, and the
  // unmasked calls' speed-up over them is recovered per length; and causal at half the head
  // dim, which gives the time per score element beside the rate.
  std::set<int64_t> lengths;
  for (const runtime::AttentionDesc& d : plan.attention) lengths.insert(d.seq_kv);
  ASSERT_EQ(plan.attention.size(), 3 * lengths.size());
  ASSERT_TRUE(f->attention_elements_fitted);
  EXPECT_NEAR(f->attention_fwd_element_s / m.element_s, 1.0, 1e-4);
  EXPECT_NEAR(f->attention_bwd_element_s / (m.element_s * m.backward_element_factor), 1.0, 1e-4);
  ASSERT_EQ(f->attention_fwd_by_seq.size(), lengths.size());
  ASSERT_EQ(f->attention_bwd_by_seq.size(), lengths.size());
  for (const auto& [seq, rate] : f->attention_fwd_by_seq)
    EXPECT_NEAR(rate / m.attention_rate_at(seq), 1.0, 1e-6) << seq;
  EXPECT_LT(f->attention_fwd_by_seq.front().second, f->attention_fwd_by_seq.back().second);
  ASSERT_EQ(f->attention_unmasked_by_seq.size(), lengths.size());
  for (const auto& [seq, factor] : f->attention_unmasked_by_seq)
    EXPECT_NEAR(factor / m.unmasked_speedup_at(seq), 1.0, 1e-6) << seq;
  ASSERT_TRUE(f->memory);
  EXPECT_NEAR(f->memory->beta_Bps / m.copy_Bps, 1.0, 1e-3);
  EXPECT_NEAR(f->host_to_device_Bps / m.host_Bps, 1.0, 1e-6);
  for (const CollectiveFit& c : f->collectives) {
    SCOPED_TRACE(hardware::to_string(c.op));
    EXPECT_EQ(c.ranks, 2);
    const double alpha = c.op == Collective::kSendRecv ? m.p2p_alpha : m.coll_alpha_s(c.op, 2);
    const double beta = c.op == Collective::kSendRecv ? m.p2p_Bps : m.coll_beta(2);
    EXPECT_NEAR(c.fit.alpha_s / alpha, 1.0, 0.01);
    EXPECT_NEAR(c.fit.beta_Bps / beta, 1.0, 0.01);
    EXPECT_NEAR(c.busbw_Bps, c.fit.beta_Bps * bus_factor(c.op, 2), 1e-3);
    EXPECT_GT(c.fit.r2, 0.9999);
  }
  ASSERT_EQ(f->pairs.size(), 1u);
}

TEST(CalibratedProfile, ShortSequencesMeasuredFasterAreCappedAtTheLongOnesRate) {
  // Noise on a shared host can make the long sequence the slow one: the seq-scale factors
  // stay at most 1 and the profile stays valid (the validator allows at most 1.5).
  FakeModel m;
  m.short_seq_factor = 2.0;
  FakeBackend b(1, m);
  const Samples s = sweep(b, small_plan());
  ProfileOptions o;
  o.date = "2026-11-29T12:00:00Z";
  Result<hardware::SystemProfile> p = build_profile(s, *fit_samples(s), o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  ASSERT_FALSE(p->gpu.attention_fwd_seq_scale.empty());
  for (const auto& pt : p->gpu.attention_fwd_seq_scale) EXPECT_EQ(pt.factor, 1.0) << pt.at;
  for (const auto& pt : p->gpu.attention_bwd_seq_scale) EXPECT_EQ(pt.factor, 1.0) << pt.at;
}

// A collective that ramps up over message sizes, as NCCL does: the calibrated figure's
// size_scale makes the simulator's alpha + S / (beta x factor) give the measured time at
// every size whose bandwidth term reaches alpha; a backend that follows the line exactly
// gets none.
TEST(CalibratedProfile, CollectivesRampingUpOverSizesGetASizeScale) {
  const FakeModel m;
  FakeBackend b(2, m);
  Samples s = sweep(b, small_plan());
  ProfileOptions o;
  o.date = "2026-11-29T12:00:00Z";
  {
    Result<hardware::SystemProfile> p = build_profile(s, *fit_samples(s), o);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_TRUE(
        p->collective(CollectiveScope::kIntraNode, Collective::kAllGather).size_scale.empty());
  }
  // The all_gather's two largest sizes keep their time; the smaller ones take 1.5 x longer
  // beyond alpha.
  int64_t largest = 0;
  for (const CollectiveSample& c : s.collectives)
    if (c.op == Collective::kAllGather) largest = std::max(largest, c.bytes);
  const double alpha = m.coll_alpha_s(Collective::kAllGather, 2);
  for (CollectiveSample& c : s.collectives)
    if (c.op == Collective::kAllGather && c.bytes < largest / 4)
      c.t.median_s = alpha + (c.t.median_s - alpha) * 1.5;
  const Fits f = *fit_samples(s);
  Result<hardware::SystemProfile> p = build_profile(s, f, o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_TRUE(hardware::validate_profile(*p).is_ok());
  const hardware::CollectiveFigure& ag =
      p->collective(CollectiveScope::kIntraNode, Collective::kAllGather);
  ASSERT_GE(ag.size_scale.size(), 2u);
  const CollectiveFit* fit = nullptr;
  for (const CollectiveFit& c : f.collectives)
    if (c.op == Collective::kAllGather) fit = &c;
  ASSERT_NE(fit, nullptr);
  for (const CollectiveSample& c : s.collectives) {
    if (c.op != Collective::kAllGather) continue;
    const double bandwidth_s = static_cast<double>(c.bytes) / fit->fit.beta_Bps;
    if (bandwidth_s < fit->fit.alpha_s) continue;
    const double predicted = fit->fit.alpha_s + bandwidth_s / curve_factor(ag.size_scale, c.bytes);
    EXPECT_NEAR(predicted / c.t.median_s, 1.0, 1e-6) << c.bytes;
  }
  EXPECT_NE(p->provenance.at("collectives.intra_node.all_gather").find("size_scale"),
            std::string::npos);
}

TEST(Sweep, GroupSizesTwoToWorldEachRecovered) {
  const FakeModel m;
  FakeBackend b(4, m);
  SweepPlan plan = small_plan();
  plan.p2p_bytes.clear();  // a one-process double cannot play pairs it is not in
  const Samples s = sweep(b, plan);
  Result<Fits> f = fit_samples(s);
  ASSERT_TRUE(f.is_ok());
  std::set<int> sizes;
  for (const CollectiveFit& c : f->collectives) {
    sizes.insert(c.ranks);
    EXPECT_NEAR(c.fit.alpha_s / m.coll_alpha_s(c.op, c.ranks), 1.0, 0.01);
    EXPECT_NEAR(c.fit.beta_Bps / m.coll_beta(c.ranks), 1.0, 0.01);
  }
  EXPECT_EQ(sizes, (std::set<int>{2, 3, 4}));
}

TEST(Sweep, AcrossHostsMeasuresIntraNodeGroupsOnOneHostAndWholeHostsAcross) {
  const FakeModel m;
  FakeBackend b(6, m, {0, 0, 0, 1, 1, 1});  // 2 hosts x 3 ranks
  SweepPlan plan = small_plan();
  plan.p2p_bytes.clear();
  const Samples s = sweep(b, plan);
  EXPECT_EQ(s.topology.hosts(), 2);
  EXPECT_EQ(s.topology.ranks_on_host(1), (std::vector<int>{3, 4, 5}));
  std::set<std::tuple<CollectiveScope, int, int>> groups;
  for (const CollectiveSample& c : s.collectives) groups.insert({c.scope, c.ranks, c.nodes});
  EXPECT_EQ(groups,
            (std::set<std::tuple<CollectiveScope, int, int>>{{CollectiveScope::kIntraNode, 2, 1},
                                                             {CollectiveScope::kIntraNode, 3, 1},
                                                             {CollectiveScope::kInterNode, 6, 2}}));
  ProfileOptions o;  // no P2P sampled: send_recv figures from the base
  o.base = *hardware::load_profile("dgx-h100");
  o.base_ref = "dgx-h100";
  Result<hardware::SystemProfile> p = build_profile(s, *fit_samples(s), o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->gpus_per_node, 3);
  // Across hosts the figure is keyed by host count, busbw from all 6 ranks' bus factor.
  const auto& ar = p->collective(CollectiveScope::kInterNode, Collective::kAllReduce);
  ASSERT_EQ(ar.busbw.size(), 1u);
  EXPECT_EQ(ar.busbw[0].first, 2);
  EXPECT_NEAR(ar.busbw[0].second.bytes_per_s() / (m.coll_beta(6) * 2.0 * 5 / 6), 1.0, 0.01);
  EXPECT_EQ(p->provenance.at("collectives.inter_node.all_reduce").find("[not measured]"),
            std::string::npos);
  EXPECT_NE(p->provenance.at("collectives.inter_node.send_recv").find("from the base profile"),
            std::string::npos);
}

TEST(Sweep, RejectsABadPlan) {
  FakeBackend b(1);
  SweepPlan plan = small_plan();
  plan.reps = 0;
  EXPECT_NE(run_sweeps(b, plan).status().message().find("reps must be >= 1"), std::string::npos);
}

TEST(CalibratedProfile, ValidRoundTripsAndReproducesTheMeasurements) {
  const FakeModel m;
  FakeBackend b(2, m);
  const Samples s = sweep(b, small_plan());
  const Fits f = *fit_samples(s);
  ProfileOptions o;
  o.name = "fake-node";
  o.date = "2026-11-29T12:00:00Z";
  o.mode = "quick";
  Result<hardware::SystemProfile> p = build_profile(s, f, o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_TRUE(hardware::validate_profile(*p).is_ok());
  EXPECT_EQ(hardware::missing_provenance(*p), std::vector<std::string>{});
  EXPECT_EQ(p->name, "fake-node");
  EXPECT_EQ(p->gpus_per_node, 2);
  EXPECT_EQ(p->shared_compute_units, 1) << "the host's cores, from the device info";
  EXPECT_EQ(p->gpu.model, "Fake Device");

  // The GEMM model reproduces every measured shape (the table is exact there).
  for (const GemmSample& g : s.gemms)
    EXPECT_NEAR(p->gpu.gemm_time(g.dims.m, g.dims.n, g.dims.k, 1, Precision::kFp32).to_seconds() /
                    g.t.median_s,
                1.0, 1e-4);
  // Attention: the profile's attention_time (with its seq-scale curves) reproduces every
  // measured call, causal or unmasked (the noncausal_scale curve).
  EXPECT_EQ(p->gpu.attention_fwd_seq_scale.size(), s.attention.size() / 6);
  EXPECT_EQ(p->gpu.attention_noncausal_scale.size(), s.attention.size() / 6);
  EXPECT_GT(p->gpu.attention_fwd_element_ps, 0);
  for (const AttentionSample& a : s.attention)
    EXPECT_NEAR(p->gpu.attention_time(Flops(a.flops()), Precision::kBf16, a.backward, a.desc.seq_kv,
                                      nullptr, a.desc.causal, a.desc.head_dim)
                        .to_seconds() /
                    a.t.median_s,
                1.0, 1e-5)
        << a.desc.seq_kv << (a.backward ? " backward" : " forward")
        << (a.desc.causal ? " causal" : " unmasked");
  // Memory: the fitted bandwidth with efficiency 1 (no datasheet).
  EXPECT_NEAR(p->gpu.effective_memory_bandwidth().bytes_per_s() / m.copy_Bps, 1.0, 1e-3);
  // Collectives: busbw of 2 ranks, alpha of the fit.
  const auto& ar = p->collective(CollectiveScope::kIntraNode, Collective::kAllReduce);
  EXPECT_NEAR(ar.bus_bandwidth(2).bytes_per_s() / (m.coll_beta(2) * 1.0), 1.0, 0.01);
  EXPECT_NEAR(ar.alpha.to_seconds() / m.coll_alpha_s(Collective::kAllReduce, 2), 1.0, 0.01);
  // One host: inter-node figures are copies, and say so.
  EXPECT_NE(p->provenance.at("collectives.inter_node.all_reduce").find("[not measured]"),
            std::string::npos);

  const std::string text = calibration_to_json_text(*p, s, f, o);
  Result<hardware::SystemProfile> back = hardware::parse_profile_text(text, "calibration");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, *p);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["$calibration"]["backend"], "fake");
  EXPECT_EQ(j["$calibration"]["samples"]["gemm"].size(), s.gemms.size());
  EXPECT_EQ(j["$calibration"]["fits"]["collectives"].size(), f.collectives.size());
  EXPECT_EQ(j["$calibration"]["fits"]["attention_unmasked_scale"].size(),
            f.attention_unmasked_by_seq.size());
  EXPECT_NEAR(
      j["$calibration"]["fits"]["attention_element_ps"]["fwd"].get<double>() / (m.element_s * 1e12),
      1.0, 1e-4);
}

TEST(CalibratedProfile, BaseProfileKeepsDatasheetPeaksAndUnmeasuredFigures) {
  FakeModel m;
  m.gemm_peak = 400e12;  // a fast device: eta_max against the H100 bf16 peak
  FakeBackend b(2, m);
  SweepPlan plan = small_plan();
  plan.gemm_dtypes = {runtime::DType::kBf16};
  const Samples s = sweep(b, plan);
  ProfileOptions o;
  o.base = *hardware::load_profile("dgx-h100");
  o.base_ref = "dgx-h100";
  o.date = "2026-11-29T12:00:00Z";
  Result<hardware::SystemProfile> p = build_profile(s, *fit_samples(s), o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(hardware::missing_provenance(*p), std::vector<std::string>{});
  EXPECT_EQ(p->gpu.peak(Precision::kBf16), o.base->gpu.peak(Precision::kBf16));
  double best = 0;
  for (const GemmSample& g : s.gemms) best = std::max(best, g.flops_per_s());
  EXPECT_NEAR(p->gpu.eta_max(Precision::kBf16), best / 989.4e12, 1e-9);
  EXPECT_EQ(p->gpu.sm_count, 132);
  EXPECT_FALSE(p->gpu.gemm_measured[hardware::precision_index(Precision::kBf16)].empty());
  EXPECT_TRUE(p->gpu.gemm_measured[hardware::precision_index(Precision::kFp8)].empty());
  EXPECT_EQ(p->collective(CollectiveScope::kInterNode, Collective::kAllReduce),
            o.base->collective(CollectiveScope::kInterNode, Collective::kAllReduce));
  EXPECT_EQ(p->gpus_per_node, 2);
  EXPECT_FALSE(p->intra_node.nvls);  // NVLS needs 5 GPUs; two ranks measured
  // Without NVLS the base's ring figure for NVLS switched off has no place, also where the
  // base's all_reduce figure is kept (its samples dropped here).
  Samples no_all_reduce = s;
  std::erase_if(no_all_reduce.collectives, [](const CollectiveSample& c) {
    return c.op == Collective::kAllReduce && c.scope == CollectiveScope::kIntraNode;
  });
  Result<hardware::SystemProfile> kept =
      build_profile(no_all_reduce, *fit_samples(no_all_reduce), o);
  ASSERT_TRUE(kept.is_ok()) << kept.status().to_string();
  const hardware::CollectiveFigure& ar =
      kept->collective(CollectiveScope::kIntraNode, Collective::kAllReduce);
  EXPECT_EQ(ar.busbw,
            o.base->collective(CollectiveScope::kIntraNode, Collective::kAllReduce).busbw);
  EXPECT_TRUE(ar.busbw_without_nvls.empty());
  EXPECT_EQ(hardware::missing_provenance(*kept), std::vector<std::string>{});
  // The memory bandwidth is below the datasheet: an efficiency of the datasheet peak.
  EXPECT_EQ(p->gpu.memory_bandwidth, o.base->gpu.memory_bandwidth);
  EXPECT_NEAR(p->gpu.effective_memory_bandwidth().bytes_per_s() / m.copy_Bps, 1.0, 1e-3);
  // Attention is timed in bursts, as the base's figures were: its sustained fraction stays.
  EXPECT_EQ(p->gpu.attention_sustain, 0.88);
  EXPECT_NE(p->provenance.at("gpu.attention.sustain").find("from the base profile"),
            std::string::npos);
}

// The H100 base's unmasked-call factor is cuDNN's. A run that times attention both ways
// replaces it with its own kernel's; one that times causal calls only drops it (its kernel is
// not cuDNN); one that times no attention keeps the base's rates and the factor with them.
// Likewise the base's head-dim curve: dropped once attention is measured, else kept.
TEST(CalibratedProfile, UnmaskedAttentionFactorIsTheMeasuredKernelsOrNone) {
  FakeModel m;
  m.unmasked_speedup = 1.8;
  FakeBackend b(1, m);
  const Samples s = sweep(b, small_plan());
  const ProfileOptions o = h100_based("2026-12-06T00:00:00Z");
  ASSERT_FALSE(o.base->gpu.attention_noncausal_scale.empty());

  Result<hardware::SystemProfile> both = build_profile(s, *fit_samples(s), o);
  ASSERT_TRUE(both.is_ok()) << both.status().to_string();
  const auto& curve = both->gpu.attention_noncausal_scale;
  ASSERT_EQ(curve.size(), 4u);
  for (const hardware::CurvePoint& pt : curve)
    EXPECT_NEAR(pt.factor, m.unmasked_speedup_at(pt.at), 1e-6) << pt.at;
  EXPECT_NE(both->provenance.at("gpu.attention.noncausal_scale").find("measured"),
            std::string::npos);
  // The base's head-dim curve is cuDNN's too; the measured kernel's is its time per element.
  ASSERT_FALSE(o.base->gpu.attention_head_dim_scale.empty());
  EXPECT_TRUE(both->gpu.attention_head_dim_scale.empty());
  EXPECT_FALSE(both->provenance.contains("gpu.attention.head_dim_scale"));
  EXPECT_TRUE(hardware::validate_profile(*both).is_ok());
  EXPECT_EQ(hardware::missing_provenance(*both), std::vector<std::string>{});

  Samples causal_only = s;
  std::erase_if(causal_only.attention, [](const AttentionSample& a) { return !a.desc.causal; });
  Result<hardware::SystemProfile> causal = build_profile(causal_only, *fit_samples(causal_only), o);
  ASSERT_TRUE(causal.is_ok()) << causal.status().to_string();
  EXPECT_TRUE(causal->gpu.attention_noncausal_scale.empty());
  EXPECT_FALSE(causal->provenance.contains("gpu.attention.noncausal_scale"));
  EXPECT_EQ(causal->gpu.attention_fwd_efficiency, both->gpu.attention_fwd_efficiency)
      << "the rates are the causal calls' either way";

  Samples none = s;
  none.attention.clear();
  Result<hardware::SystemProfile> kept = build_profile(none, *fit_samples(none), o);
  ASSERT_TRUE(kept.is_ok()) << kept.status().to_string();
  EXPECT_EQ(kept->gpu.attention_noncausal_scale, o.base->gpu.attention_noncausal_scale);
  EXPECT_NE(kept->provenance.at("gpu.attention.noncausal_scale").find("from the base profile"),
            std::string::npos);
  EXPECT_EQ(kept->gpu.attention_head_dim_scale, o.base->gpu.attention_head_dim_scale);
  EXPECT_NE(kept->provenance.at("gpu.attention.head_dim_scale").find("from the base profile"),
            std::string::npos);

  // A broken timing outside the validator's range is clamped into it.
  Fits wild = *fit_samples(s);
  wild.attention_unmasked_by_seq.front().second = 40;
  Result<hardware::SystemProfile> clamped = build_profile(s, wild, o);
  ASSERT_TRUE(clamped.is_ok()) << clamped.status().to_string();
  EXPECT_EQ(clamped->gpu.attention_noncausal_scale.front().factor, 3.0);
  EXPECT_TRUE(hardware::validate_profile(*clamped).is_ok());
}

// The time per score element (the softmax) comes from causal calls at two head dims of one
// key length: the profile's attention_time then holds at other head dims too (here 16, which
// no call was timed at). A run at one head dim leaves the measured kernel none (its rates
// hold the softmax at that head dim) and predicts a smaller head too fast; one with no
// attention keeps the base's.
TEST(CalibratedProfile, ScoreElementTimeComesFromTwoHeadDims) {
  FakeModel m;
  m.element_s = 2e-9;  // a softmax that weighs: about the FLOPs' time per element at head dim 16
  FakeBackend b(1, m);
  const Samples s = sweep(b, small_plan());
  ProfileOptions o;
  o.date = "2026-12-06T00:00:00Z";
  Result<hardware::SystemProfile> p = build_profile(s, *fit_samples(s), o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_NEAR(p->gpu.attention_fwd_element_ps / (m.element_s * 1e12), 1.0, 1e-4);
  EXPECT_NE(p->provenance.at("gpu.attention.element_ps").find("two head dims"), std::string::npos);
  EXPECT_TRUE(hardware::validate_profile(*p).is_ok());
  EXPECT_EQ(hardware::missing_provenance(*p), std::vector<std::string>{});
  runtime::AttentionDesc small;
  small.heads = small.kv_heads = 4;
  small.seq_q = small.seq_kv = 128;
  small.head_dim = 16;
  small.causal = true;
  const double flops = small.forward_flops();
  const auto predicted = [&](const hardware::SystemProfile& q) {
    return q.gpu.attention_time(Flops(flops), Precision::kBf16, false, 128, nullptr, true, 16)
        .to_seconds();
  };
  const double measured = m.attention_s(flops, 128, true, 16);
  EXPECT_NEAR(predicted(*p) / measured, 1.0, 1e-4);

  Samples one_dim = s;
  std::erase_if(one_dim.attention, [](const AttentionSample& a) { return a.desc.head_dim != 64; });
  Result<hardware::SystemProfile> single = build_profile(one_dim, *fit_samples(one_dim), o);
  ASSERT_TRUE(single.is_ok()) << single.status().to_string();
  EXPECT_EQ(single->gpu.attention_fwd_element_ps, 0);
  EXPECT_FALSE(single->provenance.contains("gpu.attention.element_ps"));
  EXPECT_LT(predicted(*single), 0.9 * measured);
  EXPECT_TRUE(hardware::validate_profile(*single).is_ok());

  Samples none = s;
  none.attention.clear();
  hardware::SystemProfile base = *p;
  ProfileOptions on_base = o;
  on_base.base = base;
  on_base.base_ref = "the calibrated profile";
  Result<hardware::SystemProfile> kept = build_profile(none, *fit_samples(none), on_base);
  ASSERT_TRUE(kept.is_ok()) << kept.status().to_string();
  EXPECT_EQ(kept->gpu.attention_fwd_element_ps, p->gpu.attention_fwd_element_ps);
  EXPECT_NE(kept->provenance.at("gpu.attention.element_ps").find("from the base profile"),
            std::string::npos);
}

// A run with NCCL's NVLS switched off measures the ring: on a node with NVLS (eight ranks
// against the H100 base) it becomes the base figure's ring without NVLS, which a cluster's
// "nvls": false then runs; on a node without NVLS (two ranks) it is the node's own figure.
TEST(CalibratedProfile, ARunWithNvlsDisabledMeasuresTheRingWithoutNvls) {
  const FakeModel m;
  FakeBackend b(8, m);
  SweepPlan plan = small_plan();
  plan.p2p_bytes.clear();  // a one-process double cannot play pairs it is not in
  plan.gemms.resize(2);
  const Samples s = sweep(b, plan);
  const Result<Fits> fits = fit_samples(s);
  ASSERT_TRUE(fits.is_ok()) << fits.status().to_string();
  ProfileOptions o;
  o.base = *hardware::load_profile("dgx-h100");
  o.base_ref = "dgx-h100";
  o.date = "2026-12-05T12:00:00Z";
  const hardware::CollectiveFigure& base_ar =
      o.base->collective(CollectiveScope::kIntraNode, Collective::kAllReduce);
  Result<hardware::SystemProfile> nvls_on = build_profile(s, *fits, o);
  ASSERT_TRUE(nvls_on.is_ok()) << nvls_on.status().to_string();
  ASSERT_TRUE(nvls_on->intra_node.nvls);
  const hardware::CollectiveFigure measured =
      nvls_on->collective(CollectiveScope::kIntraNode, Collective::kAllReduce);
  ASSERT_EQ(measured.busbw.size(), 7u);  // 2 to 8 ranks
  EXPECT_NE(measured.busbw, base_ar.busbw);

  o.nvls_disabled = true;
  Result<hardware::SystemProfile> p = build_profile(s, *fits, o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_TRUE(p->intra_node.nvls);
  const hardware::CollectiveFigure& ar =
      p->collective(CollectiveScope::kIntraNode, Collective::kAllReduce);
  EXPECT_EQ(ar.busbw, base_ar.busbw);
  EXPECT_EQ(ar.size_scale, base_ar.size_scale);
  EXPECT_EQ(ar.alpha, base_ar.alpha);
  EXPECT_EQ(ar.busbw_without_nvls, measured.busbw);
  EXPECT_EQ(ar.size_scale_without_nvls, measured.size_scale);
  EXPECT_TRUE(hardware::validate_profile(*p).is_ok());
  EXPECT_EQ(hardware::missing_provenance(*p), std::vector<std::string>{});
  const std::string key = "collectives.intra_node.all_reduce";
  EXPECT_NE(p->provenance.at(key + ".busbw_without_nvls_GBps").find("NCCL_NVLS_ENABLE=0"),
            std::string::npos);
  EXPECT_NE(p->provenance.at(key).find("from the base profile dgx-h100"), std::string::npos);
  // The other collectives are the run's own, as without the setting.
  EXPECT_EQ(p->collective(CollectiveScope::kIntraNode, Collective::kAllGather),
            nvls_on->collective(CollectiveScope::kIntraNode, Collective::kAllGather));
  // Written and read back, a cluster with NVLS off runs the measured ring.
  const std::string text = calibration_to_json_text(*p, s, *fits, o);
  EXPECT_NE(text.find("\"nvls_disabled\": true"), std::string::npos);
  Result<hardware::SystemProfile> back = hardware::parse_profile_text(text, "calibrated.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  hardware::ClusterOverrides nvls_off;
  nvls_off.nvls = false;
  Result<hardware::ClusterSpec> off =
      hardware::ClusterSpec::create({{"calibrated.json", *back, 2}}, nvls_off);
  ASSERT_TRUE(off.is_ok()) << off.status().to_string();
  EXPECT_EQ(off->groups()[0]
                .profile.collective(CollectiveScope::kIntraNode, Collective::kAllReduce)
                .busbw,
            measured.busbw);

  // Two ranks: no NVLS on the node, so the ring is its own figure.
  FakeBackend pair(2, m);
  SweepPlan two = small_plan();
  two.gemms.resize(2);
  const Samples s2 = sweep(pair, two);
  Result<hardware::SystemProfile> p2 = build_profile(s2, *fit_samples(s2), o);
  ASSERT_TRUE(p2.is_ok()) << p2.status().to_string();
  EXPECT_FALSE(p2->intra_node.nvls);
  const hardware::CollectiveFigure& ar2 =
      p2->collective(CollectiveScope::kIntraNode, Collective::kAllReduce);
  EXPECT_TRUE(ar2.busbw_without_nvls.empty());
  EXPECT_NE(ar2.busbw, base_ar.busbw);
  EXPECT_NE(p2->provenance.at(key).find("NCCL_NVLS_ENABLE=0"), std::string::npos);
}

// The weight-gradient GEMMs measured adding into fp32 fill their own table, which only such
// GEMMs read; the plain table and eta_max come from the plain samples alone. --sustain is
// recorded in the provenance.
// Every rank timing its own GPU through sustained GEMMs measures the spread of a job's GPUs
// (gpu.clock_spread): the ranks' relative standard deviation over the largest quarter of
// the plain GEMMs (their median); burst timings, or one rank, keep the base's figure.
TEST(CalibratedProfile, RanksSustainedGemmRatesGiveTheClockSpread) {
  FakeModel m;
  FakeBackend b(1, m);
  SweepPlan plan = small_plan();
  plan.gemm_dtypes = {runtime::DType::kBf16};
  plan.gemms = {{8, 8, 8}, {256, 256, 256}, {1024, 1024, 1024}, {2048, 2048, 2048}};
  plan.gemm_sustain_s = 0.01;
  Samples s = sweep(b, plan);
  ASSERT_EQ(s.gemms.size(), 4u);
  for (const GemmSample& g : s.gemms) EXPECT_TRUE(g.rank_median_s.empty());  // one rank
  // Four GPUs, one 2% faster and one 2% slower than the other two: rates 1.02, 1, 1, 0.98
  // (relative std sqrt(0.0008 / 3) = 0.01633) on the largest GEMM; the smaller ones, which
  // the median over the largest quarter leaves out, spread more.
  for (GemmSample& g : s.gemms) {
    const double t = g.t.median_s;
    g.rank_median_s = g.dims.m == 2048 ? std::vector<double>{t / 1.02, t, t, t / 0.98}
                                       : std::vector<double>{t / 1.2, t, t, t / 0.8};
  }
  const Fits f = *fit_samples(s);
  const ProfileOptions o = h100_based("2026-12-05T00:00:00Z");
  Result<hardware::SystemProfile> p = build_profile(s, f, o);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_NEAR(p->gpu.clock_spread, std::sqrt(0.0008 / 3), 1e-9);
  EXPECT_NE(p->provenance.at("gpu.clock_spread").find("4 ranks' sustained GEMM rates"),
            std::string::npos);
  EXPECT_EQ(hardware::missing_provenance(*p), std::vector<std::string>{});
  // Burst timings: the base's figure.
  s.gemm_sustain_s = 0;
  Result<hardware::SystemProfile> burst = build_profile(s, f, o);
  ASSERT_TRUE(burst.is_ok()) << burst.status().to_string();
  EXPECT_EQ(burst->gpu.clock_spread, o.base->gpu.clock_spread);
  EXPECT_NE(burst->provenance.at("gpu.clock_spread").find("dgx-h100"), std::string::npos);
}

TEST(CalibratedProfile, AccumulatingGemmsGetTheirOwnTable) {
  FakeModel m;
  m.gemm_peak = 400e12;
  m.fp32_c_slowdown = 1.5;
  FakeBackend b(1, m);
  SweepPlan plan = small_plan();
  plan.gemm_dtypes = {runtime::DType::kBf16};
  plan.gemms = {{8, 8, 8}, {1024, 2048, 512}};
  plan.accumulate_gemms = {{{1024, 2048, 512}, runtime::DType::kBf16}};
  plan.gemm_sustain_s = 0.01;
  const Samples s = sweep(b, plan);
  EXPECT_EQ(s.gemm_sustain_s, 0.01);
  ASSERT_EQ(s.gemms.size(), 3u);
  EXPECT_TRUE(s.gemms.back().accumulate_fp32);
  EXPECT_NEAR(s.gemms.back().t.median_s / s.gemms[1].t.median_s, 1.5, 1e-9);
  const Fits f = *fit_samples(s);
  ASSERT_EQ(f.gemm.size(), 1u);
  ASSERT_EQ(f.gemm_accumulate.size(), 1u);
  EXPECT_EQ(f.gemm[0].shapes, 2);
  Result<hardware::SystemProfile> p = build_profile(s, f, h100_based("2026-12-02T00:00:00Z"));
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(hardware::missing_provenance(*p), std::vector<std::string>{});
  const size_t bf16 = hardware::precision_index(Precision::kBf16);
  EXPECT_EQ(p->gpu.gemm_measured[bf16].size(), 2u);
  ASSERT_EQ(p->gpu.gemm_accumulate_measured[bf16].size(), 1u);
  EXPECT_NEAR(p->gpu.eta_max(Precision::kBf16), s.gemms[1].flops_per_s() / 989.4e12, 1e-9);
  EXPECT_NEAR(p->gpu.gemm_time(1024, 2048, 512, 1, Precision::kBf16, true) /
                  p->gpu.gemm_time(1024, 2048, 512, 1, Precision::kBf16),
              1.5, 1e-6);
  EXPECT_NE(p->provenance.at("gpu.gemm.measured.bf16").find("back to back for 0.01 s"),
            std::string::npos)
      << p->provenance.at("gpu.gemm.measured.bf16");
  EXPECT_NE(p->provenance.at("gpu.gemm.measured_accumulate.bf16").find("adding into an fp32"),
            std::string::npos);
  // The pair's extra time over the output's fp32 traffic: gpu.gemm.accumulate_exposed.
  const double bps = p->gpu.memory_bandwidth.bytes_per_s() * p->gpu.memory_efficiency;
  const double extra = s.gemms.back().t.median_s - s.gemms[1].t.median_s;
  EXPECT_NEAR(p->gpu.gemm_accumulate_exposed,
              std::clamp(extra / (8.0 * 1024 * 2048 / bps), 0.0, 1.0), 1e-12);
  EXPECT_NE(p->provenance.at("gpu.gemm.accumulate_exposed").find("median over 1 GEMMs"),
            std::string::npos)
      << p->provenance.at("gpu.gemm.accumulate_exposed");
}

}  // namespace
}  // namespace hetpar::calibrate
