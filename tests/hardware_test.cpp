#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "hetpar/hardware/cluster.h"
#include "hetpar/hardware/device_profile.h"
#include "hetpar/hardware/hardware_json.h"
#include "hetpar/hardware/precision.h"
#include "hetpar/hardware/system_profile.h"
#include "hetpar/hardware/topology.h"

namespace hetpar::hardware {
namespace {

SystemProfile builtin(std::string_view name) {
  Result<SystemProfile> p = load_profile(name);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return p.is_ok() ? *p : SystemProfile{};
}

ClusterSpec cluster_of(std::string_view json) {
  Result<ClusterSpec> c = parse_cluster_text(json, "test");
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return *c;
}

TEST(Precision, SizesAndNames) {
  EXPECT_EQ(bytes_per_element(Precision::kFp32), 4);
  EXPECT_EQ(bytes_per_element(Precision::kTf32), 4);
  EXPECT_EQ(bytes_per_element(Precision::kBf16), 2);
  EXPECT_EQ(bytes_per_element(Precision::kFp8), 1);
  for (Precision p : kAllPrecisions) EXPECT_EQ(parse_precision(to_string(p)), p);
  EXPECT_FALSE(parse_precision("fp4").has_value());
  EXPECT_FALSE(parse_precision("BF16").has_value());
}

TEST(BuiltinProfiles, AllLoadValidateAndCarryProvenance) {
  const std::vector<std::string> expected = {"dgx-a100-80gb", "dgx-b200", "dgx-h100", "dgx-h200",
                                             "rtx4090-node"};
  ASSERT_EQ(builtin_profile_names(), expected);
  for (const std::string& name : expected) {
    SCOPED_TRACE(name);
    SystemProfile p = builtin(name);
    EXPECT_EQ(p.name, name);
    EXPECT_TRUE(validate_profile(p).is_ok()) << validate_profile(p).to_string();
    EXPECT_EQ(missing_provenance(p), std::vector<std::string>{});
    EXPECT_EQ(p.gpus_per_node, 8);
    EXPECT_GT(p.gpu.memory_bandwidth.to_GBps(), 0);
    EXPECT_GT(p.gpu.memory_efficiency, 0.5);
    EXPECT_LE(p.gpu.memory_efficiency, 1.0);
    EXPECT_GT(p.gpu.attention_fwd_efficiency, p.gpu.attention_bwd_efficiency);
    EXPECT_FALSE(p.wan.has_value());
    for (Precision prec : kAllPrecisions) {
      if (!p.gpu.supports(prec)) continue;
      EXPECT_GT(p.gpu.peak(prec).to_tflops(), 1);
      EXPECT_GT(p.gpu.eta_max(prec), 0.5);
      EXPECT_LT(p.gpu.eta_max(prec), 0.9);
    }
    for (CollectiveScope scope : kAllScopes) {
      for (Collective op : kAllCollectives) {
        const CollectiveFigure& f = p.collective(scope, op);
        EXPECT_GT(f.alpha, Time::zero());
        // Bus bandwidths never exceed the wire they run on.
        const Bandwidth wire = scope == CollectiveScope::kIntraNode
                                   ? p.intra_node.bandwidth * 1.1  // NVLS may exceed the wire
                                   : p.inter_node.nic_bandwidth * p.inter_node.nics_per_node;
        for (const auto& [group, bw] : f.busbw) {
          EXPECT_GT(bw.to_GBps(), 0);
          EXPECT_LE(bw, wire) << to_string(scope) << " " << to_string(op);
        }
      }
    }
    // all_to_all across nodes cannot aggregate NICs: one NIC's worth at most.
    EXPECT_LE(p.collective(CollectiveScope::kInterNode, Collective::kAllToAll).bus_bandwidth(4),
              p.inter_node.nic_bandwidth);
  }
}

TEST(BuiltinProfiles, DatasheetPeaks) {
  SystemProfile h100 = builtin("dgx-h100");
  EXPECT_DOUBLE_EQ(h100.gpu.peak(Precision::kBf16).to_tflops(), 989.4);
  EXPECT_DOUBLE_EQ(h100.gpu.peak(Precision::kFp8).to_tflops(), 1978.9);
  EXPECT_EQ(h100.gpu.memory_capacity, Bytes::GiB(80));
  EXPECT_DOUBLE_EQ(h100.gpu.memory_bandwidth.to_GBps(), 3350);
  EXPECT_EQ(h100.gpu.sm_count, 132);
  EXPECT_DOUBLE_EQ(h100.intra_node.bandwidth.to_GBps(), 450);
  EXPECT_DOUBLE_EQ(h100.inter_node.nic_bandwidth.to_GBps(), 50);  // 400 Gb/s
  EXPECT_TRUE(h100.intra_node.nvls);

  SystemProfile a100 = builtin("dgx-a100-80gb");
  EXPECT_DOUBLE_EQ(a100.gpu.peak(Precision::kBf16).to_tflops(), 312);
  EXPECT_FALSE(a100.gpu.supports(Precision::kFp8));
  EXPECT_EQ(a100.gpu.memory_capacity, Bytes::GiB(80));
  EXPECT_DOUBLE_EQ(a100.gpu.memory_bandwidth.to_GBps(), 2039);
  EXPECT_DOUBLE_EQ(a100.intra_node.bandwidth.to_GBps(), 300);
  EXPECT_DOUBLE_EQ(a100.inter_node.nic_bandwidth.to_GBps(), 25);  // 200 Gb/s HDR
  EXPECT_FALSE(a100.intra_node.nvls);

  SystemProfile h200 = builtin("dgx-h200");
  EXPECT_EQ(h200.gpu.memory_capacity, Bytes::GiB(141));
  EXPECT_DOUBLE_EQ(h200.gpu.memory_bandwidth.to_GBps(), 4800);
  EXPECT_DOUBLE_EQ(h200.gpu.peak(Precision::kBf16).to_tflops(), 989.4);

  SystemProfile b200 = builtin("dgx-b200");
  EXPECT_DOUBLE_EQ(b200.gpu.peak(Precision::kBf16).to_tflops(), 2250);
  EXPECT_DOUBLE_EQ(b200.gpu.memory_bandwidth.to_GBps(), 8000);
  EXPECT_DOUBLE_EQ(b200.intra_node.bandwidth.to_GBps(), 900);
  EXPECT_EQ(b200.intra_node.nvls_min_group, 6);

  SystemProfile rtx = builtin("rtx4090-node");
  EXPECT_DOUBLE_EQ(rtx.gpu.peak(Precision::kBf16).to_tflops(), 165.2);
  EXPECT_EQ(rtx.gpu.memory_capacity, Bytes::GiB(24));
  EXPECT_EQ(rtx.intra_node.kind, FabricKind::kPcie);
  EXPECT_FALSE(rtx.intra_node.nvls);
  EXPECT_DOUBLE_EQ(rtx.intra_node.bandwidth.to_GBps(), 25);
}

// NCCL's channels across nodes hold 16 SMs (NVIDIA/nccl#689): compute beside such a
// collective has the rest, sm / (sm - 16) of its time; none where the field is absent.
TEST(BuiltinProfiles, CrossNodeCollectivesHoldSixteenSms) {
  for (const char* name : {"dgx-a100-80gb", "dgx-h100", "dgx-h200", "dgx-b200"}) {
    const SystemProfile p = builtin(name);
    EXPECT_EQ(p.inter_node.collective_sms, 16) << name;
    EXPECT_DOUBLE_EQ(p.cross_node_collective_slowdown(), 16.0 / (p.gpu.sm_count - 16)) << name;
  }
  EXPECT_NEAR(builtin("dgx-a100-80gb").cross_node_collective_slowdown(), 0.174, 1e-3);
  EXPECT_NEAR(builtin("dgx-h100").cross_node_collective_slowdown(), 0.138, 1e-3);
  SystemProfile none = builtin("rtx4090-node");
  EXPECT_EQ(none.inter_node.collective_sms, 0);
  EXPECT_EQ(none.cross_node_collective_slowdown(), 0.0);
  none.inter_node.collective_sms = 8;
  none.gpu.sm_count = 0;  // an unknown SM count slows nothing rather than dividing by it
  EXPECT_EQ(none.cross_node_collective_slowdown(), 0.0);
}

// NCCL-registered buffers (Megatron's nccl_ub): Megatron-Core's reference table, AG / RS
// SMs inside a node 4 / 5, one GPU per node 1 / 4; a profile without figures (the A100's)
// charges what an unregistered collective costs.
TEST(BuiltinProfiles, RegisteredCollectivesHoldFewSms) {
  for (const char* name : {"dgx-h100", "dgx-h200", "dgx-b200"}) {
    SCOPED_TRACE(name);
    const SystemProfile p = builtin(name);
    EXPECT_EQ(p.intra_node.registered_collective_sms, (RegisteredCollectiveSms{4, 5}));
    EXPECT_EQ(p.inter_node.registered_collective_sms, (RegisteredCollectiveSms{1, 4}));
    const double sm = p.gpu.sm_count;
    EXPECT_DOUBLE_EQ(p.registered_collective_slowdown(true, true), 4 / (sm - 4));
    EXPECT_DOUBLE_EQ(p.registered_collective_slowdown(true, false), 5 / (sm - 5));
    EXPECT_DOUBLE_EQ(p.registered_collective_slowdown(false, true), 1 / (sm - 1));
    EXPECT_DOUBLE_EQ(p.registered_collective_slowdown(false, false), 4 / (sm - 4));
  }
  const SystemProfile a100 = builtin("dgx-a100-80gb");
  EXPECT_EQ(a100.intra_node.registered_collective_sms, RegisteredCollectiveSms{});
  EXPECT_EQ(a100.registered_collective_slowdown(true, true), a100.gpu.collective_overlap_slowdown);
  EXPECT_EQ(a100.registered_collective_slowdown(false, false),
            a100.cross_node_collective_slowdown());
}

TEST(CollectiveFigure, BusBandwidthStepsWithGroupSize) {
  const SystemProfile h200 = builtin("dgx-h200");  // the figure refers into it
  const CollectiveFigure& ar = h200.collective(CollectiveScope::kIntraNode, Collective::kAllReduce);
  EXPECT_DOUBLE_EQ(ar.bus_bandwidth(2).to_GBps(), 363.3);  // below the table: smallest entry
  EXPECT_DOUBLE_EQ(ar.bus_bandwidth(4).to_GBps(), 363.3);  // Ring
  EXPECT_DOUBLE_EQ(ar.bus_bandwidth(5).to_GBps(), 414.2);  // NVLS from 5 GPUs
  EXPECT_DOUBLE_EQ(ar.bus_bandwidth(8).to_GBps(), 473.1);
  EXPECT_DOUBLE_EQ(ar.bus_bandwidth(64).to_GBps(), 473.1);
}

TEST(GemmModel, LargeAlignedGemmReachesEtaMax) {
  for (const char* name : {"dgx-h100", "dgx-a100-80gb", "dgx-b200"}) {
    SCOPED_TRACE(name);
    const DeviceProfile gpu = builtin(name).gpu;
    const double eff = gpu.gemm_efficiency(8192, 8192, 8192, 1, Precision::kBf16);
    EXPECT_GT(eff, 0.95 * gpu.eta_max(Precision::kBf16));
    EXPECT_LE(eff, gpu.eta_max(Precision::kBf16));
  }
  const DeviceProfile h100 = builtin("dgx-h100").gpu;
  // 8192^3 bf16 at the sustained 0.763 x 989.4 TF takes 1.46 ms; 2048 tiles of 256x128 in 16
  // waves on 132 SMs (0.97 filled) make it about 1.50 ms.
  EXPECT_NEAR(h100.gemm_time(8192, 8192, 8192, 1, Precision::kBf16).to_ms(), 1.50, 0.05);
  // fp8 runs at its own (lower) eta_max on twice the peak, at K = 8192 a little below the
  // K = 10240 of its eta_max shape (gpu.gemm.k_scale.fp8: 0.982).
  const double fp8 = h100.gemm_efficiency(8192, 8192, 8192, 1, Precision::kFp8);
  EXPECT_GT(fp8, 0.93 * h100.eta_max(Precision::kFp8));
}

// At fixed M and N (the same tiles and waves) a shorter K runs slower: each tile's prologue
// and epilogue take a larger share of its main loop (OpenXLA's cuBLAS tables, their launch
// taken out). FP8, whose main loop is twice as fast, loses more: at K what BF16 loses at
// 0.8 K, as the B200 table measures (on H100 derived so; on B200 measured). 16384 x 16384:
// compute bound, the launch under 1 %.
TEST(GemmModel, ShortReductionsRunSlowerAndFp8LosesMore) {
  const Precision bf16 = Precision::kBf16, fp8 = Precision::kFp8;
  const DeviceProfile h100 = builtin("dgx-h100").gpu;
  auto rate = [](const DeviceProfile& d, int64_t k, Precision p) {
    return d.gemm_efficiency(16384, 16384, k, 1, p);
  };
  EXPECT_NEAR(rate(h100, 1024, bf16) / rate(h100, 6144, bf16), 0.868, 0.01);
  EXPECT_NEAR(rate(h100, 2048, bf16) / rate(h100, 6144, bf16), 0.954, 0.01);
  EXPECT_NEAR(rate(h100, 2048, fp8) / rate(h100, 10240, fp8), 0.932, 0.01);
  EXPECT_NEAR(rate(h100, 4096, fp8) / rate(h100, 10240, fp8), 0.967, 0.01);
  // FP8 at 2048 as BF16 at 0.8 x 2048, each against its curve at 10240 and 8192.
  EXPECT_NEAR(rate(h100, 2048, fp8) / rate(h100, 10240, fp8),
              rate(h100, 1638, bf16) / rate(h100, 8192, bf16), 0.01);
  const DeviceProfile b200 = builtin("dgx-b200").gpu;
  EXPECT_NEAR(rate(b200, 1024, bf16) / rate(b200, 4096, bf16), 0.807, 0.01);
  EXPECT_NEAR(rate(b200, 1024, fp8) / rate(b200, 4096, fp8), 0.733, 0.01);
  for (const DeviceProfile* d : {&h100, &b200})
    EXPECT_LT(rate(*d, 2048, fp8) / rate(*d, 10240, fp8),
              rate(*d, 2048, bf16) / rate(*d, 10240, bf16));
}

TEST(GemmModel, SkinnyGemmIsMemoryBound) {
  const DeviceProfile h100 = builtin("dgx-h100").gpu;
  const int64_t m = 16, n = 8192, k = 8192;
  const Bytes bytes(2 * (m * k + k * n + m * n));
  const Time roofline = h100.memory_time(bytes) + h100.gemm_launch_overhead;
  const Time t = h100.gemm_time(m, n, k, 1, Precision::kBf16);
  EXPECT_NEAR(t / roofline, 1.0, 0.05);
  EXPECT_LT(h100.gemm_efficiency(m, n, k, 1, Precision::kBf16), 0.06);  // about 5% of peak
}

TEST(GemmModel, WaveQuantizationPenalizesShapesPastAWaveBoundary) {
  const DeviceProfile h100 = builtin("dgx-h100").gpu;
  // 12 x 11 tiles of 256x128 = 132 tiles: exactly one wave on 132 SMs.
  const double full = h100.gemm_efficiency(12 * 256, 11 * 128, 8192, 1, Precision::kBf16);
  // One more row of tiles spills into a second, mostly empty wave.
  const double spill = h100.gemm_efficiency(13 * 256, 11 * 128, 8192, 1, Precision::kBf16);
  EXPECT_GT(full, 0.95 * h100.eta_max(Precision::kBf16));
  EXPECT_LT(spill, 0.8 * full);
  // Batching fills the waves again.
  EXPECT_GT(h100.gemm_efficiency(13 * 256, 11 * 128, 8192, 12, Precision::kBf16), 0.95 * full);
}

TEST(GemmModel, SplitKFillsTheMachineForSmallOutputs) {
  DeviceProfile gpu = builtin("dgx-h100").gpu;
  const double with_split = gpu.gemm_efficiency(256, 256, 65536, 1, Precision::kBf16);
  gpu.gemm_split_k = false;
  const double without = gpu.gemm_efficiency(256, 256, 65536, 1, Precision::kBf16);
  EXPECT_GT(with_split, 4 * without);
  EXPECT_LT(with_split, gpu.eta_max(Precision::kBf16));
}

TEST(DeviceProfile, HopperAndBlackwellGemmRatesAreSustainedMeasurements) {
  // ml-engineering's MSMF (steady over 2 s at the power limit, the node's other GPUs busy,
  // kernels queued back to back): the wave model's kernel time, without its separate
  // launch overhead, reproduces each measured shape (H200 755 / 1354 TF; B200 1439 / 2788 TF;
  // H100 takes the H200 figures: same compute at the same power).
  auto tflops = [](const DeviceProfile& g, int64_t m, int64_t n, int64_t k, Precision p) {
    const Time kernel = g.gemm_time(m, n, k, 1, p) - g.gemm_launch_overhead;
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) /
           kernel.to_seconds() / 1e12;
  };
  for (const char* name : {"dgx-h100", "dgx-h200"}) {
    SCOPED_TRACE(name);
    const DeviceProfile g = builtin(name).gpu;
    EXPECT_NEAR(tflops(g, 1536, 2816, 6144, Precision::kBf16), 755, 2);
    EXPECT_NEAR(tflops(g, 1536, 2816, 10240, Precision::kFp8), 1354, 3);
  }
  const DeviceProfile b200 = builtin("dgx-b200").gpu;
  EXPECT_NEAR(tflops(b200, 3072, 18944, 4608, Precision::kBf16), 1439, 3);
  EXPECT_NEAR(tflops(b200, 3072, 18944, 6144, Precision::kFp8), 2788, 6);
}

TEST(DeviceProfile, A100GemmRateIsTheSustainedMeasurement) {
  // 230 TFLOP/s for back-to-back fp16 8192^3 matmuls (mli/transformers-benchmarks), not the
  // burst MAMF: the wave model reproduces the measured point.
  const DeviceProfile a100 = builtin("dgx-a100-80gb").gpu;
  const double eff = a100.gemm_efficiency(8192, 8192, 8192, 1, Precision::kFp16);
  EXPECT_NEAR(eff * a100.peak(Precision::kFp16).to_tflops(), 230, 1.0);
}

TEST(DeviceProfile, AttentionAndMemoryTimes) {
  const DeviceProfile h100 = builtin("dgx-h100").gpu;
  const Flops f(1e12);
  const Time fwd = h100.attention_time(f, Precision::kBf16, false);
  const Time bwd = h100.attention_time(f, Precision::kBf16, true);
  // The burst benchmark rate (0.545 of peak) at the fraction of it the GPU sustains.
  const FlopRate sustained = h100.peak(Precision::kBf16) * h100.attention_sustain;
  EXPECT_EQ(fwd, f / (sustained * 0.545) + h100.gemm_launch_overhead);
  // The backward efficiency is a FlashAttention benchmark rate, which counts 2.5x the
  // forward FLOPs; the caller passes model FLOPs (2x forward): 1.25x the work.
  EXPECT_EQ(bwd, f * 1.25 / (sustained * 0.472) + h100.gemm_launch_overhead);
  EXPECT_GT(bwd, fwd);
  // 3 GB at 0.9 x 3.35 TB/s.
  EXPECT_NEAR(h100.memory_time(Bytes::GB(3)).to_ms(), 3.0 / (0.9 * 3.35), 1e-6);
  // A memory-bound kernel pays the per-kernel launch like a GEMM; no bytes, no kernel.
  EXPECT_EQ(h100.memory_kernel_time(Bytes::GB(3)),
            h100.memory_time(Bytes::GB(3)) + h100.gemm_launch_overhead);
  EXPECT_EQ(h100.memory_kernel_time(Bytes(0)), Time::zero());
  EXPECT_GT(h100.gemm_launch_overhead, Time::zero());
}

// The sustained GEMM rate against K (the MSMF finder's K walk on an H200, bf16): one
// (M, N) shape at the measured K values runs at 722 / 749 / 741 / 727 TFLOP/s relative to
// each other; the FP8 curve falls to 0.958 past K = 16384; profiles without a curve keep one
// rate for every K.
TEST(DeviceProfile, GemmRateFollowsTheMeasuredKCurve) {
  const DeviceProfile h200 = builtin("dgx-h200").gpu;
  // The kernel's rate without its launch overhead (one wave of 256 x 128 tiles at every K).
  const auto eff = [&](int64_t k, Precision p) {
    return 2.0 * 1536 * 2816 * static_cast<double>(k) /
           (h200.gemm_time(1536, 2816, k, 1, p) - h200.gemm_launch_overhead).to_seconds();
  };
  EXPECT_NEAR(eff(20480, Precision::kBf16) / eff(6144, Precision::kBf16), 727.0 / 749, 0.002);
  EXPECT_NEAR(eff(10240, Precision::kBf16) / eff(6144, Precision::kBf16), 741.0 / 749, 0.002);
  EXPECT_NEAR(eff(4096, Precision::kBf16) / eff(6144, Precision::kBf16), 722.0 / 749, 0.002);
  EXPECT_NEAR(eff(16384, Precision::kFp8) / eff(10240, Precision::kFp8), 0.958, 0.002);
  EXPECT_DOUBLE_EQ(curve_factor(h200.gemm_k_scale[precision_index(Precision::kBf16)], 65536),
                   0.971);  // clamped past the last point
  EXPECT_TRUE(builtin("dgx-a100-80gb").gpu.gemm_k_scale[precision_index(Precision::kBf16)].empty());
}

TEST(DeviceProfile, AttentionRateFollowsTheMeasuredSequenceLengthCurve) {
  // cuDNN causal head-dim-128 forward on H100 (FlashAttention-3 paper, Figure 5):
  // 315 / 410 / 484 / 518 / 529 / 539 TFLOP/s at 512 .. 16K key/value tokens.
  const DeviceProfile h100 = builtin("dgx-h100").gpu;
  const Flops f(1e12);
  const auto fwd_tflops = [&](int64_t seq) {
    const Time t = h100.attention_time(f, Precision::kBf16, false, seq) - h100.gemm_launch_overhead;
    return f.count() / t.to_seconds() / 1e12 / h100.attention_sustain;  // the burst rate
  };
  EXPECT_NEAR(fwd_tflops(512), 315, 2);
  EXPECT_NEAR(fwd_tflops(2048), 484, 2);
  EXPECT_NEAR(fwd_tflops(8192), 529, 2);
  EXPECT_NEAR(fwd_tflops(16384), 539, 2);
  EXPECT_NEAR(fwd_tflops(65536), 539, 2);  // clamped past the last point
  EXPECT_NEAR(fwd_tflops(256), 315, 2);    // and before the first
  EXPECT_NEAR(fwd_tflops(0), 539, 2);      // 0 = a long sequence
  // Between points: linear in log2(seq); 2896 ~ 2^11.5 is halfway between 2K and 4K.
  EXPECT_NEAR(curve_factor(h100.attention_fwd_seq_scale, 2896), (0.898 + 0.961) / 2, 1e-3);
  // Backward: derived causal rates 193 .. 467 TFLOP/s in the 2.5x-forward convention.
  const auto bwd_tflops = [&](int64_t seq) {
    const Time t = h100.attention_time(f, Precision::kBf16, true, seq) - h100.gemm_launch_overhead;
    return f.count() * kFlashBackwardWork / t.to_seconds() / 1e12 / h100.attention_sustain;
  };
  EXPECT_NEAR(bwd_tflops(512), 193, 2);
  EXPECT_NEAR(bwd_tflops(4096), 424, 2);
  EXPECT_NEAR(bwd_tflops(16384), 467, 2);
  // Monotone: a shorter kernel is never faster per FLOP.
  for (int64_t s = 512; s < 16384; s *= 2) EXPECT_LT(fwd_tflops(s), fwd_tflops(2 * s));
  // Profiles without a curve keep one rate for every length.
  const DeviceProfile a100 = builtin("dgx-a100-80gb").gpu;
  EXPECT_EQ(a100.attention_time(f, Precision::kBf16, false, 512),
            a100.attention_time(f, Precision::kBf16, false, 16384));
}

// B200: cuDNN 9.13's causal head-dim-128 rates as NVIDIA's cudnn-frontend benchmark measured
// them (sdpa_bf16_benchmark_results_NVIDIA_B200.csv): forward 856 / 1171 / 1419 TFLOP/s at
// 4K / 8K / 32K, backward 701 / 943 / 1109; PyTorch SDPA's FlashAttention-2 373 forward at 8K.
TEST(DeviceProfile, B200AttentionFollowsCudnnMeasurement) {
  const DeviceProfile b200 = builtin("dgx-b200").gpu;
  EXPECT_EQ(b200.attention_kernel, AttentionKernel::kCudnn);
  EXPECT_TRUE(b200.has_attention_kernel(AttentionKernel::kFlash2));
  EXPECT_FALSE(b200.has_attention_kernel(AttentionKernel::kFlash3));  // a Hopper kernel
  const Flops f(1e12);
  const auto tflops = [&](int64_t seq, bool backward, AttentionKernel k) {
    const Time t =
        b200.attention_time(f, Precision::kBf16, backward, seq, b200.attention_rates(k)) -
        b200.gemm_launch_overhead;
    return f.count() * (backward ? kFlashBackwardWork : 1.0) / t.to_seconds() / 1e12 /
           b200.attention_sustain;  // the CSV's burst rates
  };
  EXPECT_NEAR(tflops(4096, false, AttentionKernel::kCudnn), 856, 3);
  EXPECT_NEAR(tflops(8192, false, AttentionKernel::kCudnn), 1171, 3);
  EXPECT_NEAR(tflops(32768, false, AttentionKernel::kCudnn), 1419, 3);
  EXPECT_NEAR(tflops(4096, true, AttentionKernel::kCudnn), 701, 3);
  EXPECT_NEAR(tflops(8192, true, AttentionKernel::kCudnn), 943, 3);
  EXPECT_NEAR(tflops(32768, true, AttentionKernel::kCudnn), 1109, 3);
  EXPECT_NEAR(tflops(8192, false, AttentionKernel::kFlash2), 373, 2);
  // Below the CSV's 2K row (a single short sequence there) the curve is clamped.
  EXPECT_NEAR(tflops(1024, false, AttentionKernel::kCudnn), 479, 3);
}

// Attention benchmarks are bursts; a training step holds the GPU at its power limit, where
// the Hopper parts sustain 0.88 of their burst tensor-core rate (the H200's BF16 MSMF over
// its MAMF) and a B200 attention kernel measurably falls to 0.86 of its burst rate. Every
// kernel's rates, the own and the alternatives, take the factor; 1 changes nothing.
TEST(DeviceProfile, AttentionRunsAtItsSustainedFraction) {
  EXPECT_DOUBLE_EQ(builtin("dgx-h100").gpu.attention_sustain, 0.88);
  EXPECT_DOUBLE_EQ(builtin("dgx-h200").gpu.attention_sustain, 0.88);
  EXPECT_DOUBLE_EQ(builtin("dgx-b200").gpu.attention_sustain, 0.86);
  EXPECT_DOUBLE_EQ(builtin("dgx-a100-80gb").gpu.attention_sustain, 1.0);
  const DeviceProfile h100 = builtin("dgx-h100").gpu;
  DeviceProfile burst = h100;
  burst.attention_sustain = 1.0;
  const Flops f(1e12);
  for (AttentionKernel k : {AttentionKernel::kCudnn, AttentionKernel::kFlash2}) {
    for (bool backward : {false, true}) {
      const auto kernel = [&](const DeviceProfile& d) {
        return (d.attention_time(f, Precision::kBf16, backward, 8192, d.attention_rates(k)) -
                d.gemm_launch_overhead)
            .to_seconds();
      };
      EXPECT_NEAR(kernel(h100) / kernel(burst), 1 / 0.88, 1e-9);
    }
  }
  // A GEMM's rate is a sustained measurement already: the factor leaves it alone.
  EXPECT_EQ(h100.gemm_time(8192, 8192, 8192, 1, Precision::kBf16),
            burst.gemm_time(8192, 8192, 8192, 1, Precision::kBf16));
}

// Other kernels' rates by name: FlashAttention-2 on an H100 (FlashAttention-3 paper,
// Figures 5 and 6): causal head-dim-128 forward 335 TFLOP/s at 16K and 333 at 8K, backward
// 286 at 8K (derived causal, 2.5x-forward convention); the profile's own kernel is cuDNN.
TEST(DeviceProfile, AttentionKernelsByName) {
  const DeviceProfile h100 = builtin("dgx-h100").gpu;
  EXPECT_EQ(h100.attention_kernel, AttentionKernel::kCudnn);
  EXPECT_EQ(h100.attention_rates(AttentionKernel::kCudnn), nullptr);
  EXPECT_EQ(h100.attention_rates(AttentionKernel::kDefault), nullptr);
  const AttentionRates* fa2 = h100.attention_rates(AttentionKernel::kFlash2);
  ASSERT_NE(fa2, nullptr);
  const Flops f(1e12);
  const auto tflops = [&](bool backward, int64_t seq) {
    const Time t =
        h100.attention_time(f, Precision::kBf16, backward, seq, fa2) - h100.gemm_launch_overhead;
    return f.count() * (backward ? kFlashBackwardWork : 1) / t.to_seconds() / 1e12 /
           h100.attention_sustain;  // the paper's burst rates
  };
  EXPECT_NEAR(tflops(false, 16384), 335, 1);
  EXPECT_NEAR(tflops(false, 8192), 333, 1);
  EXPECT_NEAR(tflops(true, 8192), 286, 1);
  EXPECT_TRUE(h100.has_attention_kernel(AttentionKernel::kFlash3));
  const DeviceProfile a100 = builtin("dgx-a100-80gb").gpu;
  EXPECT_EQ(a100.attention_kernel, AttentionKernel::kFlash2);
  EXPECT_TRUE(a100.has_attention_kernel(AttentionKernel::kFlash2));
  EXPECT_FALSE(a100.has_attention_kernel(AttentionKernel::kCudnn));
  EXPECT_EQ(parse_attention_kernel("flash3"), AttentionKernel::kFlash3);
  EXPECT_EQ(parse_attention_kernel("sdpa"), std::nullopt);
}

// A call without a mask runs at the paper's unmasked rate: on an H100, cuDNN's forward
// 609 TFLOP/s at 4K and 595 at 16K, where the causal one runs 518 and 539 (FlashAttention-3
// paper, Figure 5), its backward by the same factor; FlashAttention-2 unmasked 370 at 16K. A
// profile without the figure (the A100's) times both alike.
TEST(DeviceProfile, AnUnmaskedCallRunsAtTheUnmaskedRate) {
  const DeviceProfile h100 = builtin("dgx-h100").gpu;
  const Flops f(1e12);
  const auto tflops = [&](bool backward, int64_t seq, bool causal,
                          const AttentionRates* rates = nullptr) {
    const Time t = h100.attention_time(f, Precision::kBf16, backward, seq, rates, causal) -
                   h100.gemm_launch_overhead;
    return f.count() * (backward ? kFlashBackwardWork : 1) / t.to_seconds() / 1e12 /
           h100.attention_sustain;
  };
  EXPECT_NEAR(tflops(false, 4096, false), 609, 1);
  EXPECT_NEAR(tflops(false, 16384, false), 595, 1);
  EXPECT_NEAR(tflops(false, 16384, true), 539, 1);
  EXPECT_NEAR(tflops(true, 16384, false) / tflops(true, 16384, true), 595.0 / 539, 1e-3);
  EXPECT_NEAR(tflops(false, 16384, false, h100.attention_rates(AttentionKernel::kFlash2)), 370, 1);
  const DeviceProfile a100 = builtin("dgx-a100-80gb").gpu;
  EXPECT_EQ(a100.attention_time(f, Precision::kBf16, false, 4096, nullptr, false),
            a100.attention_time(f, Precision::kBf16, false, 4096));
}

// A smaller head runs the fused kernels slower per FLOP: on an H100, cuDNN's unmasked forward
// at 16K runs 413 TFLOP/s at head dim 64 against 595 at 128, FlashAttention-2 324 against
// 370, FlashAttention-3 497 against 648 (FlashAttention-3 paper, Figure 5), taken for both
// passes and masks; between 64 and 128 the factor follows log2(d), beyond them it holds; a
// caller that names no head dim gets 128's rates. A profile without the figure (the A100's)
// times every head dim alike.
TEST(DeviceProfile, SmallerHeadsRunSlowerPerFlop) {
  const DeviceProfile h100 = builtin("dgx-h100").gpu;
  const Flops f(1e12);
  const auto work = [&](bool backward, int64_t d, AttentionKernel k, bool causal = true) {
    return (h100.attention_time(f, Precision::kBf16, backward, 16384, h100.attention_rates(k),
                                causal, d) -
            h100.gemm_launch_overhead)
        .to_seconds();
  };
  for (bool backward : {false, true})
    for (bool causal : {true, false}) {
      EXPECT_NEAR(work(backward, 128, AttentionKernel::kCudnn, causal) /
                      work(backward, 64, AttentionKernel::kCudnn, causal),
                  413.0 / 595, 1e-3);
      EXPECT_EQ(work(backward, 0, AttentionKernel::kCudnn, causal),
                work(backward, 128, AttentionKernel::kCudnn, causal));
    }
  EXPECT_NEAR(
      work(false, 128, AttentionKernel::kFlash2) / work(false, 64, AttentionKernel::kFlash2),
      324.0 / 370, 1e-3);
  EXPECT_NEAR(
      work(false, 128, AttentionKernel::kFlash3) / work(false, 64, AttentionKernel::kFlash3),
      497.0 / 648, 1e-3);
  EXPECT_EQ(work(false, 32, AttentionKernel::kCudnn), work(false, 64, AttentionKernel::kCudnn));
  EXPECT_EQ(work(false, 256, AttentionKernel::kCudnn), work(false, 128, AttentionKernel::kCudnn));
  const double at96 =
      work(false, 128, AttentionKernel::kCudnn) / work(false, 96, AttentionKernel::kCudnn);
  EXPECT_GT(at96, 413.0 / 595);
  EXPECT_LT(at96, 1.0);
  const DeviceProfile a100 = builtin("dgx-a100-80gb").gpu;
  EXPECT_EQ(a100.attention_time(f, Precision::kBf16, false, 4096, nullptr, true, 64),
            a100.attention_time(f, Precision::kBf16, false, 4096, nullptr, true, 128));
}

// The time per score element (gpu.attention.fwd_element_ps / bwd_element_ps, a calibrated
// profile's): F / (4·d) elements forward, F / (8·d) of the backward's FLOPs, added for the
// profile's own kernel at a known head dim only; smaller heads pay more per FLOP. It
// round-trips through the profile JSON.
TEST(DeviceProfile, ScoreElementsCostTheirOwnTime) {
  SystemProfile p = builtin("dgx-h100");
  DeviceProfile& h100 = p.gpu;
  const DeviceProfile without = h100;
  const Flops f(1e12);
  const Time plain = h100.attention_time(f, Precision::kBf16, false, 4096);
  h100.attention_fwd_element_ps = 0.5;
  h100.attention_bwd_element_ps = 0.75;
  EXPECT_EQ(h100.attention_time(f, Precision::kBf16, false, 4096), plain);  // no head dim
  const double scale = h100.attention_sustain * h100.compute_scale;
  const auto extra = [&](bool backward, int64_t d) {
    return (h100.attention_time(f, Precision::kBf16, backward, 4096, nullptr, true, d) -
            without.attention_time(f, Precision::kBf16, backward, 4096, nullptr, true, d))
        .to_seconds();
  };
  EXPECT_NEAR(extra(false, 128) / (1e12 / (4 * 128) * 0.5e-12 / scale), 1.0, 1e-6);
  EXPECT_NEAR(extra(true, 128) / (1e12 / (8 * 128) * 0.75e-12 / scale), 1.0, 1e-6);
  EXPECT_NEAR(extra(false, 64) / extra(false, 128), 2.0, 1e-6);
  const AttentionRates* fa2 = h100.attention_rates(AttentionKernel::kFlash2);
  EXPECT_EQ(h100.attention_time(f, Precision::kBf16, false, 4096, fa2, true, 64),
            without.attention_time(f, Precision::kBf16, false, 4096, fa2, true, 64));  // another's
  Result<SystemProfile> back = parse_profile(profile_to_json(p), "");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, p);
}

// --- Profile JSON: round trip and the error corpus -------------------------------------

TEST(ProfileJson, RoundTripsEveryBuiltin) {
  for (const std::string& name : builtin_profile_names()) {
    SCOPED_TRACE(name);
    SystemProfile p = builtin(name);
    Result<SystemProfile> back = parse_profile(profile_to_json(p), "");
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(*back, p);
    Result<SystemProfile> text = parse_profile_text(profile_to_json_text(p), "text");
    ASSERT_TRUE(text.is_ok()) << text.status().to_string();
    EXPECT_EQ(*text, p);
  }
  // JSON carries the numbers as written in the profile files (no 1e-9 rounding noise).
  const nlohmann::json h100 = profile_to_json(builtin("dgx-h100"));
  EXPECT_EQ(h100["collectives"][0]["busbw_GBps"][0][1].get<double>(), 363.3);
  EXPECT_EQ(h100["collectives"][1]["alpha_us"].get<double>(), 10.8);
  EXPECT_EQ(h100["gpu"]["compute"]["fp8"]["peak_tflops"].get<double>(), 1978.9);
  EXPECT_EQ(h100["provenance"]["gpu.compute.bf16.eta_max"].get<std::string>().rfind("MSMF", 0), 0u);

  SystemProfile with_wan = builtin("rtx4090-node");
  with_wan.wan = WanLink{Bandwidth::gbit_per_s(0.02), Bandwidth::gbit_per_s(0.1), Time::ms(50)};
  with_wan.provenance["wan"] = "test";
  Result<SystemProfile> back = parse_profile(profile_to_json(with_wan), "");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, with_wan);
}

struct BadProfileCase {
  const char* label;
  void (*mutate)(nlohmann::json&);
  const char* expected;  // must appear in the error message
};

TEST(ProfileJson, RejectsBadProfilesNamingTheField) {
  const nlohmann::json base = profile_to_json(builtin("dgx-h100"));
  const BadProfileCase cases[] = {
      {"negative NIC bandwidth", [](nlohmann::json& j) { j["inter_node"]["nic_gbps"] = -400; },
       "inter_node.nic_gbps: must be > 0, got -400"},
      {"collective holding every SM",
       [](nlohmann::json& j) { j["inter_node"]["collective_sms"] = 132; },
       "inter_node.collective_sms: must be in [0, gpu.sm_count=132), got 132"},
      {"registered collective holding every SM",
       [](nlohmann::json& j) {
         j["intra_node"]["registered_collective_sms"]["reduce_scatter"] = 200;
       },
       "intra_node.registered_collective_sms.reduce_scatter: must be in [0, gpu.sm_count=132), "
       "got 200"},
      {"registered collective SMs not an object",
       [](nlohmann::json& j) { j["inter_node"]["registered_collective_sms"] = 4; },
       "inter_node.registered_collective_sms"},
      {"zero HBM bandwidth", [](nlohmann::json& j) { j["gpu"]["memory_GBps"] = 0; },
       "gpu.memory_GBps: must be > 0"},
      // A bus bandwidth of 1e300 GB/s became an infinite rate: the flow network's CHECK.
      {"absurd bus bandwidth",
       [](nlohmann::json& j) { j["collectives"][1]["busbw_GBps"][0][1] = 1e300; },
       "collectives[1].busbw_GBps[0]: must be <= 1e+09, got 1e+300"},
      {"ring figure on all_gather",
       [](nlohmann::json& j) {
         j["collectives"][1]["busbw_without_nvls_GBps"] = {{8, 300}};
       },
       "collectives.intra_node.all_gather.busbw_without_nvls_GBps: only the intra_node "
       "all_reduce runs NVLS"},
      {"ring ramp without its rates",
       [](nlohmann::json& j) { j["collectives"][0].erase("busbw_without_nvls_GBps"); },
       "collectives.intra_node.all_reduce.busbw_without_nvls_GBps: missing: "
       "size_scale_without_nvls is given without it"},
      {"ring figure without NVLS",
       [](nlohmann::json& j) {
         j["intra_node"]["nvls"] = false;
         j["intra_node"].erase("nvls_min_group");
       },
       "collectives.intra_node.all_reduce.busbw_without_nvls_GBps: needs intra_node.nvls"},
      {"absurd memory bandwidth", [](nlohmann::json& j) { j["gpu"]["memory_GBps"] = 1e300; },
       "gpu.memory_GBps: must be <= 1000000000, got 1e+300"},
      {"absurd peak", [](nlohmann::json& j) { j["gpu"]["compute"]["bf16"]["peak_tflops"] = 1e300; },
       "gpu.compute.bf16.peak_tflops: must be <= 1000000000, got 1e+300"},
      {"missing peak", [](nlohmann::json& j) { j["gpu"]["compute"]["bf16"].erase("peak_tflops"); },
       "gpu.compute.bf16.peak_tflops: missing required field"},
      {"missing bf16", [](nlohmann::json& j) { j["gpu"]["compute"].erase("bf16"); },
       "gpu.compute.bf16: missing required precision"},
      {"unknown precision",
       [](nlohmann::json& j) {
         j["gpu"]["compute"]["fp4"] = {{"peak_tflops", 1}, {"eta_max", 0.5}};
       },
       "gpu.compute.fp4: unknown precision"},
      {"unknown field", [](nlohmann::json& j) { j["gpu"]["hbm_gbps"] = 3; },
       "gpu.hbm_gbps: unknown field"},
      {"eta above one", [](nlohmann::json& j) { j["gpu"]["compute"]["fp8"]["eta_max"] = 1.5; },
       "gpu.compute.fp8.eta_max: must be in (0, 1]"},
      {"bad tile",
       [](nlohmann::json& j) {
         j["gpu"]["gemm"]["tiles"][1] = {128, 256};
       },
       "gpu.gemm.tiles[1]: expected [Tm, Tn, efficiency]"},
      {"descending K scale",
       [](nlohmann::json& j) {
         j["gpu"]["gemm"]["k_scale"] = {{"bf16", {{8192, 1.0}, {4096, 0.9}}}};
       },
       "gpu.gemm.k_scale.bf16[1]: K must be strictly ascending"},
      {"K scale of an unknown precision",
       [](nlohmann::json& j) {
         j["gpu"]["gemm"]["k_scale"] = {{"fp4", {{8192, 1.0}}}};
       },
       "gpu.gemm.k_scale.fp4: unknown precision"},
      {"an alternative of the profile's own kernel",
       [](nlohmann::json& j) {
         j["gpu"]["attention"]["alternatives"]["cudnn"] = {{"fwd_efficiency", 0.5},
                                                           {"bwd_efficiency", 0.4}};
       },
       "gpu.attention.alternatives.cudnn: is the profile's own kernel (attention.kernel)"},
      {"alternative above one",
       [](nlohmann::json& j) {
         j["gpu"]["attention"]["alternatives"]["flash2"]["fwd_efficiency"] = 1.2;
       },
       "gpu.attention.alternatives.flash2.fwd_efficiency: must be in (0, 1]"},
      {"sustain above one", [](nlohmann::json& j) { j["gpu"]["attention"]["sustain"] = 1.2; },
       "gpu.attention.sustain: must be in (0, 1]"},
      {"zero sustain", [](nlohmann::json& j) { j["gpu"]["attention"]["sustain"] = 0; },
       "gpu.attention.sustain: must be in (0, 1]"},
      {"descending head dims",
       [](nlohmann::json& j) {
         j["gpu"]["attention"]["head_dim_scale"] = {{128, 1.0}, {64, 0.7}};
       },
       "gpu.attention.head_dim_scale[1]: head dims must be strictly ascending"},
      {"negative element time",
       [](nlohmann::json& j) { j["gpu"]["attention"]["fwd_element_ps"] = -1; },
       "gpu.attention.fwd_element_ps: must be >= 0"},
      {"absurd element time",
       [](nlohmann::json& j) { j["gpu"]["attention"]["bwd_element_ps"] = 1e9; },
       "gpu.attention.bwd_element_ps"},
      {"descending seq scale",
       [](nlohmann::json& j) {
         j["gpu"]["attention"]["fwd_seq_scale"] = {{1024, 0.8}, {512, 0.9}};
       },
       "gpu.attention.fwd_seq_scale[1]: sequence lengths must be strictly ascending"},
      {"zero seq factor",
       [](nlohmann::json& j) {
         j["gpu"]["attention"]["bwd_seq_scale"] = {{512, 0.0}};
       },
       "gpu.attention.bwd_seq_scale[0]: factor 0 must be in (0, 1.5]"},
      {"unmasked factor above 3",
       [](nlohmann::json& j) {
         j["gpu"]["attention"]["noncausal_scale"] = {{512, 1.6}, {1024, 4.0}};
       },
       "gpu.attention.noncausal_scale[1]: factor 4 must be in (0, 3]"},
      {"an alternative's zero unmasked factor",
       [](nlohmann::json& j) {
         j["gpu"]["attention"]["alternatives"]["flash2"]["noncausal_scale"] = {{512, 0.0}};
       },
       "gpu.attention.alternatives.flash2.noncausal_scale[0]: factor 0 must be in (0, 3]"},
      {"fractional seq",
       [](nlohmann::json& j) {
         j["gpu"]["attention"]["fwd_seq_scale"] = {{512.5, 0.9}};
       },
       "gpu.attention.fwd_seq_scale: sequence lengths must be positive integers"},
      {"descending size scale",
       [](nlohmann::json& j) {
         j["collectives"][0]["size_scale"] = {{1 << 26, 0.8}, {1 << 24, 0.7}};
       },
       "collectives.intra_node.all_reduce.size_scale[1]: message sizes must be strictly ascending"},
      {"fractional message size",
       [](nlohmann::json& j) {
         j["collectives"][0]["size_scale"] = {{1.5, 0.8}};
       },
       "collectives[0].size_scale: message sizes must be positive integers"},
      {"unknown collective",
       [](nlohmann::json& j) { j["collectives"][2]["op"] = "all_reduce_scatter"; },
       "collectives[2].op: unknown value \"all_reduce_scatter\""},
      {"duplicate collective", [](nlohmann::json& j) { j["collectives"][1] = j["collectives"][0]; },
       "collectives[1].op: duplicate intra_node all_reduce"},
      {"missing collective",
       [](nlohmann::json& j) { j["collectives"].erase(j["collectives"].size() - 1); },
       "collectives: missing inter_node send_recv"},
      {"decreasing groups",
       [](nlohmann::json& j) {
         j["collectives"][0]["busbw_GBps"] = {{8, 400}, {4, 300}};
       },
       "collectives.intra_node.all_reduce.busbw_GBps[1]: group sizes must increase"},
      {"nvls on pcie", [](nlohmann::json& j) { j["intra_node"]["fabric"] = "pcie"; },
       "intra_node.nvls: needs fabric \"nvswitch\""},
      {"bad fabric", [](nlohmann::json& j) { j["intra_node"]["fabric"] = "infiniband"; },
       "intra_node.fabric: unknown value \"infiniband\""},
      {"bad WAN",
       [](nlohmann::json& j) {
         j["wan"] = {{"up_gbps", -1}, {"down_gbps", 1}, {"latency_ms", 5}};
       },
       "wan.up_gbps: must be > 0"},
      {"wrong type", [](nlohmann::json& j) { j["gpus_per_node"] = "eight"; },
       "gpus_per_node: expected an integer"},
      // Latencies past kMaxCallLatency would overflow integer-picosecond time once summed.
      {"host of an hour", [](nlohmann::json& j) { j["host"]["op_us"] = 3.6e9; },
       "host.op_us: must be <= 1000000, got 3600000000"},
      {"collective latency of days",
       [](nlohmann::json& j) { j["collectives"][1]["alpha_us"] = 1e12; },
       "collectives[1].alpha_us: must be <= 1000000"},
      {"negative launch", [](nlohmann::json& j) { j["gpu"]["gemm"]["launch_us"] = -1; },
       "gpu.gemm.launch_us: must be >= 0, got -1"},
      {"clock spread of a half", [](nlohmann::json& j) { j["gpu"]["clock_spread"] = 0.5; },
       "gpu.clock_spread: must be <= 0.2, got 0.5"},
      {"WAN of a minute",
       [](nlohmann::json& j) {
         j["wan"] = {{"up_gbps", 1}, {"down_gbps", 1}, {"latency_ms", 60000}};
       },
       "wan.latency_ms: must be <= 10000"},
  };
  for (const BadProfileCase& c : cases) {
    SCOPED_TRACE(c.label);
    nlohmann::json j = base;
    c.mutate(j);
    Result<SystemProfile> p = parse_profile_text(j.dump(), "bad.json");
    ASSERT_FALSE(p.is_ok());
    EXPECT_NE(p.status().message().find(c.expected), std::string::npos) << p.status().message();
    EXPECT_EQ(p.status().message().rfind("bad.json: ", 0), 0u) << p.status().message();
  }
  Result<SystemProfile> malformed = parse_profile_text("{\"name\": \"x\",", "broken.json");
  ASSERT_FALSE(malformed.is_ok());
  EXPECT_NE(malformed.status().message().find("broken.json: malformed JSON"), std::string::npos);

  // A JSON path given by the caller prefixes the field.
  nlohmann::json j = base;
  j["gpu"]["memory_efficiency"] = 0;
  Result<SystemProfile> nested = parse_profile(j, "hardware.profiles[0]");
  ASSERT_FALSE(nested.is_ok());
  EXPECT_NE(nested.status().message().find("hardware.profiles[0].gpu.memory_efficiency"),
            std::string::npos)
      << nested.status().message();
}

TEST(ProfileJson, UnknownProfileNameListsBuiltins) {
  Result<SystemProfile> p = load_profile("h300");
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), Status::Code::kNotFound);
  EXPECT_EQ(p.status().message(),
            "unknown profile \"h300\" (built-ins: dgx-a100-80gb, dgx-b200, dgx-h100, dgx-h200, "
            "rtx4090-node) and no such file");
}

// --- ClusterSpec ----------------------------------------------------------------------

TEST(Cluster, ShortFormAndHelpers) {
  ClusterSpec c = cluster_of(R"({"profile": "dgx-h100", "nodes": 8})");
  EXPECT_EQ(c.num_nodes(), 8);
  EXPECT_EQ(c.total_gpus(), 64);
  EXPECT_TRUE(c.homogeneous());
  EXPECT_EQ(c.node_of_gpu(17), NodeId(2));
  EXPECT_EQ(c.local_index(17), 1);
  EXPECT_EQ(c.first_gpu_of_node(NodeId(3)), 24);
  EXPECT_EQ(c.gpus_per_node_of(63), 8);
  EXPECT_EQ(c.profile_of_node(NodeId(7)).name, "dgx-h100");
}

// The slowest of n GPUs whose rates spread normally: z_n standard deviations below the
// mean, z_n the expected largest of n standard normals (Blom's approximation; the exact
// values 1.4236 for 8 and 3.2414 for 1000 are tabulated order statistics).
TEST(ClockSpread, TheSlowestOfNGpusSetsTheJobsRate) {
  EXPECT_EQ(slowest_rate_share(0.01, 1), 1.0);
  EXPECT_EQ(slowest_rate_share(0.0, 4096), 1.0);
  EXPECT_NEAR((1 - slowest_rate_share(0.01, 8)) / 0.01, 1.4236, 0.015);
  EXPECT_NEAR((1 - slowest_rate_share(0.01, 1000)) / 0.01, 3.2414, 0.03);
  double last = 1.0;  // more GPUs, a slower slowest
  for (int64_t n : {2, 8, 64, 512, 4096, 32768}) {
    const double share = slowest_rate_share(0.0046, n);
    EXPECT_LT(share, last) << n;
    last = share;
  }
  EXPECT_GT(last, 0.97);
}

// A cluster's GPUs of one model run their tensor-core work at the slowest of all of them
// (gpu.clock_spread): GEMMs and attention take 1 / share as long, memory-bound kernels
// keep the HBM's rate; each model counts its own GPUs; a profile without a spread is alone.
TEST(ClockSpread, AClusterRunsEachModelAtItsSlowestGpu) {
  const SystemProfile h100 = builtin("dgx-h100");
  ASSERT_GT(h100.gpu.clock_spread, 0);
  EXPECT_EQ(h100.gpu.compute_scale, 1.0);                     // a profile on its own
  EXPECT_EQ(builtin("dgx-a100-80gb").gpu.clock_spread, 0.0);  // not measured
  const ClusterSpec c = cluster_of(R"({"node_groups": [{"profile": "dgx-h100", "nodes": 2},
                                                       {"profile": "dgx-a100-80gb", "nodes": 4},
                                                       {"profile": "dgx-h100", "nodes": 30}]})");
  EXPECT_EQ(c.gpus_of_model(h100.gpu.model), 32 * 8);
  EXPECT_EQ(c.gpus_of_model("A100-SXM4-80GB"), 4 * 8);
  const double share = slowest_rate_share(h100.gpu.clock_spread, 32 * 8);
  const DeviceProfile& job = c.groups()[0].profile.gpu;
  EXPECT_EQ(job.compute_scale, share);
  EXPECT_EQ(c.groups()[2].profile.gpu.compute_scale, share);
  EXPECT_EQ(c.groups()[1].profile.gpu.compute_scale, 1.0);
  EXPECT_NEAR(share, 1 - 0.0046 * 2.8, 0.001);
  // A compute-bound GEMM and the attention: the rate times the share (the launch aside).
  const Time launch = h100.gpu.gemm_launch_overhead;
  const Time alone = h100.gpu.gemm_time(8192, 8192, 8192, 1, Precision::kBf16) - launch;
  const Time slowest = job.gemm_time(8192, 8192, 8192, 1, Precision::kBf16) - launch;
  EXPECT_NEAR(alone.to_seconds() / slowest.to_seconds(), share, 1e-9);
  const Flops f(1e15);
  EXPECT_NEAR((h100.gpu.attention_time(f, Precision::kBf16, true, 8192) - launch).to_seconds() /
                  (job.attention_time(f, Precision::kBf16, true, 8192) - launch).to_seconds(),
              share, 1e-9);
  EXPECT_EQ(job.memory_kernel_time(Bytes::GiB(1)), h100.gpu.memory_kernel_time(Bytes::GiB(1)));
  // A measured table (a calibrated profile) holds one GPU's rates: the job's slowest still
  // runs below them.
  SystemProfile measured = h100;
  measured.gpu.gemm_measured[precision_index(Precision::kBf16)] = {
      {8192, 8192, 8192, FlopRate::tflops(700)}};
  DeviceProfile measured_job = measured.gpu;
  measured_job.compute_scale = share;
  EXPECT_NEAR(measured.gpu.gemm_time(8192, 8192, 8192, 1, Precision::kBf16).to_seconds(),
              2.0 * 8192 * 8192 * 8192 / 700e12, 1e-9);
  EXPECT_LT(measured_job.gemm_time(8192, 8192, 8192, 1, Precision::kBf16).to_seconds() * share,
            2.0 * 8192 * 8192 * 8192 / 700e12 + 1e-9);
  EXPECT_GT(measured_job.gemm_time(8192, 8192, 8192, 1, Precision::kBf16),
            measured.gpu.gemm_time(8192, 8192, 8192, 1, Precision::kBf16));
  // The field round-trips through a profile file.
  Result<SystemProfile> back = parse_profile_text(profile_to_json_text(h100), "h100.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->gpu.clock_spread, h100.gpu.clock_spread);
}

TEST(Cluster, MixedGroupsFromBuiltinsAndFiles) {
  // A user profile file: a 4-GPU H100 box, referenced relative to base_dir.
  SystemProfile small = builtin("dgx-h100");
  small.name = "h100x4";
  small.gpus_per_node = 4;
  small.intra_node.nvls_min_group = 4;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "hetpar_hw_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "h100x4.json") << profile_to_json_text(small);

  Result<ClusterSpec> r = parse_cluster_text(
      R"({"node_groups": [{"profile": "dgx-a100-80gb", "nodes": 2},
                          {"profile": "h100x4.json", "nodes": 3}]})",
      "scenario.json", dir.string());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ClusterSpec& c = *r;
  EXPECT_FALSE(c.homogeneous());
  EXPECT_EQ(c.num_nodes(), 5);
  EXPECT_EQ(c.total_gpus(), 2 * 8 + 3 * 4);
  EXPECT_EQ(c.node_of_gpu(15), NodeId(1));
  EXPECT_EQ(c.node_of_gpu(16), NodeId(2));
  EXPECT_EQ(c.node_of_gpu(27), NodeId(4));
  EXPECT_EQ(c.local_index(21), 1);
  EXPECT_EQ(c.gpus_per_node_of(3), 8);
  EXPECT_EQ(c.gpus_per_node_of(20), 4);
  EXPECT_EQ(c.first_gpu_of_node(NodeId(3)), 20);
  EXPECT_EQ(c.profile_of_gpu(20).name, "h100x4");
  EXPECT_EQ(c.groups()[1].profile_ref, "h100x4.json");
  std::filesystem::remove_all(dir);
}

TEST(Cluster, OverridesApplyToEveryNode) {
  ClusterSpec c = cluster_of(R"({"node_groups": [{"profile": "dgx-h100", "nodes": 2},
                                                 {"profile": "dgx-a100-80gb", "nodes": 1}],
                                 "nics_per_node": 4, "nic_gbps": 100,
                                 "wan": {"up_gbps": 0.02, "down_gbps": 0.1, "latency_ms": 50}})");
  const SystemProfile h100 = builtin("dgx-h100");
  for (const NodeGroup& g : c.groups()) {
    EXPECT_EQ(g.profile.inter_node.nics_per_node, 4);
    EXPECT_DOUBLE_EQ(g.profile.inter_node.nic_bandwidth.to_GBps(), 12.5);
    ASSERT_TRUE(g.profile.wan.has_value());
    EXPECT_DOUBLE_EQ(g.profile.wan->up.bytes_per_s(), 2.5e6);
    EXPECT_DOUBLE_EQ(g.profile.wan->down.bytes_per_s(), 12.5e6);
    EXPECT_EQ(g.profile.wan->latency, Time::ms(50));
    EXPECT_TRUE(missing_provenance(g.profile).empty());
  }
  // 8 x 400G -> 4 x 100G: ring collectives see 1/8 of the aggregate, all_to_all 1/4 of a NIC.
  const SystemProfile& o = c.groups()[0].profile;
  EXPECT_NEAR(
      o.collective(CollectiveScope::kInterNode, Collective::kAllReduce).bus_bandwidth(2) /
          h100.collective(CollectiveScope::kInterNode, Collective::kAllReduce).bus_bandwidth(2),
      1.0 / 8, 1e-12);
  EXPECT_NEAR(
      o.collective(CollectiveScope::kInterNode, Collective::kAllToAll).bus_bandwidth(2) /
          h100.collective(CollectiveScope::kInterNode, Collective::kAllToAll).bus_bandwidth(2),
      1.0 / 4, 1e-12);
  EXPECT_EQ(o.collective(CollectiveScope::kIntraNode, Collective::kAllReduce),
            h100.collective(CollectiveScope::kIntraNode, Collective::kAllReduce));
  // The overridden numbers name the override as their source.
  EXPECT_EQ(o.provenance.count("collectives.inter_node.all_reduce"), 0u);
  EXPECT_NE(o.provenance.at("collectives.inter_node").find("cluster override"), std::string::npos);
  EXPECT_EQ(o.provenance.at("wan"), "cluster override");
  // NCCL's two channels per NIC: 4 NICs hold 8 SMs where the profile's 8 held 16.
  for (const NodeGroup& g : c.groups()) EXPECT_EQ(g.profile.inter_node.collective_sms, 8);
  EXPECT_NE(o.provenance.at("inter_node.collective_sms").find("cluster override"),
            std::string::npos);
}

// NCCL_NVLS_ENABLE=0: an NVLS profile's intra-node all_reduce becomes its measured ring;
// a profile without NVLS is unchanged, and one with NVLS but no ring figure is refused.
TEST(Cluster, NvlsOffRunsTheIntraNodeAllReduceAsTheProfilesRing) {
  ClusterSpec c = cluster_of(R"({"node_groups": [{"profile": "dgx-h100", "nodes": 1},
                                                 {"profile": "dgx-a100-80gb", "nodes": 1}],
                                 "nvls": false})");
  const SystemProfile h100 = builtin("dgx-h100");
  const CollectiveFigure& nvls =
      h100.collective(CollectiveScope::kIntraNode, Collective::kAllReduce);
  const SystemProfile& off = c.groups()[0].profile;
  const CollectiveFigure& ring =
      off.collective(CollectiveScope::kIntraNode, Collective::kAllReduce);
  EXPECT_FALSE(off.intra_node.nvls);
  EXPECT_TRUE(h100.intra_node.nvls);
  EXPECT_EQ(ring.busbw, nvls.busbw_without_nvls);
  EXPECT_EQ(ring.size_scale, nvls.size_scale_without_nvls);
  EXPECT_TRUE(ring.busbw_without_nvls.empty());
  EXPECT_NEAR(ring.bus_bandwidth(8).to_GBps(), 368.3, 1e-9);  // NVLS's: 473.1
  EXPECT_NEAR(ring.bus_bandwidth(6).to_GBps(), 363.3, 1e-9);  // 5-7 take 4 GPUs' rate
  EXPECT_NEAR(nvls.bus_bandwidth(8).to_GBps(), 473.1, 1e-9);
  EXPECT_TRUE(validate_profile(off).is_ok());
  EXPECT_TRUE(missing_provenance(off).empty());
  EXPECT_NE(off.provenance.at("collectives.intra_node.all_reduce.busbw_GBps").find("nvls false"),
            std::string::npos);
  // Everything else as the profile has it.
  EXPECT_EQ(off.collective(CollectiveScope::kIntraNode, Collective::kAllGather),
            h100.collective(CollectiveScope::kIntraNode, Collective::kAllGather));
  EXPECT_EQ(c.groups()[1].profile, builtin("dgx-a100-80gb"));  // no NVLS to switch off
  // nvls true (or unset) keeps NVLS; the one node's 8 GPUs run at their slowest's rate.
  SystemProfile h100_node = h100;
  h100_node.gpu.compute_scale = slowest_rate_share(h100.gpu.clock_spread, 8);
  EXPECT_EQ(cluster_of(R"({"profile": "dgx-h100", "nodes": 1, "nvls": true})").groups()[0].profile,
            h100_node);
  // The B200 profile has NVLS and no ring figure (no NVLink 5 ring sweep was found):
  // refused, naming what is missing.
  Result<ClusterSpec> r = parse_cluster(
      nlohmann::json::parse(R"({"profile": "dgx-b200", "nodes": 1, "nvls": false})"), "cluster");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            "cluster.nvls: false, but profile dgx-b200 (node_groups[0]) gives no all_reduce "
            "without NVLS (collectives.intra_node.all_reduce.busbw_without_nvls_GBps)");
}

TEST(Cluster, DefaultConstructedIsEmpty) {
  ClusterSpec c;
  EXPECT_EQ(c.num_nodes(), 0);
  EXPECT_EQ(c.total_gpus(), 0);
  EXPECT_EQ(build_topology(c).num_gpus(), 0);
  EXPECT_EQ(Topology().devices().size(), 0u);
}

struct BadClusterCase {
  const char* json;
  const char* expected;
};

TEST(Cluster, HoldsAtMostTheGpusAPlanCanLayOut) {
  const ClusterSpec c = cluster_of(R"({"profile": "dgx-h100", "nodes": 131072})");
  EXPECT_EQ(c.total_gpus(), kMaxClusterGpus);
}

TEST(Cluster, RejectsBadClustersNamingThePath) {
  const BadClusterCase cases[] = {
      {R"({"node_groups": [{"profile": "dgx-h100", "nodes": 1}, {"profile": "h300", "nodes": 2}]})",
       "cluster.node_groups[1].profile: unknown profile \"h300\" (built-ins: dgx-a100-80gb, "
       "dgx-b200, dgx-h100, dgx-h200, rtx4090-node) and no such file"},
      {R"({"profile": "dgx-h100", "nodes": 0})", "cluster.nodes: must be >= 1, got 0"},
      {R"({"node_groups": [{"profile": "dgx-h100", "nodes": -2}]})",
       "cluster.node_groups[0].nodes: must be >= 1"},
      {R"({"node_groups": []})", "cluster.node_groups: must list at least one group"},
      {R"({"profile": "dgx-h100"})", "cluster.nodes: missing required field"},
      {R"({"profile": "dgx-h100", "nodes": 2, "gpus": 8})", "cluster.gpus: unknown field"},
      {R"({"profile": "dgx-h100", "nodes": 2, "node_groups": [{"profile": "dgx-h100", "nodes": 1}]})",
       "cluster.node_groups: give either"},
      {R"({"profile": "dgx-h100", "nodes": 2, "wan": {"up_gbps": 0.02, "latency_ms": 50}})",
       "cluster.wan.down_gbps: missing required field"},
      {R"({"profile": "dgx-h100", "nodes": 2, "wan": {"up_gbps": 0, "down_gbps": 1, "latency_ms": 5}})",
       "cluster.wan.up_gbps: must be > 0"},
      {R"({"profile": "dgx-h100", "nodes": 2, "wan": {"up_gbps": 1, "down_gbps": 1, "latency_ms": -5}})",
       "cluster.wan.latency_ms: must be >= 0"},
      {R"({"profile": "dgx-h100", "nodes": 2, "nic_gbps": -1})", "cluster.nic_gbps: must be > 0"},
      {R"({"profile": "dgx-h100", "nodes": 2, "nics_per_node": 0})",
       "cluster.nics_per_node: must be >= 1"},
      {R"([1, 2])", "cluster: expected an object"},
      // 131073 eight-GPU nodes: one node past 2^20 GPUs, the most a plan can lay out.
      {R"({"profile": "dgx-h100", "nodes": 131073})",
       "cluster.node_groups[0]: too many GPUs (1048584, at most 1048576 in a cluster)"},
      {R"({"node_groups": [{"profile": "dgx-h100", "nodes": 131072},
                            {"profile": "dgx-a100-80gb", "nodes": 1}]})",
       "cluster.node_groups[1]: too many GPUs (1048584"},
  };
  for (const BadClusterCase& c : cases) {
    SCOPED_TRACE(c.json);
    Result<ClusterSpec> r = parse_cluster(nlohmann::json::parse(c.json), "cluster");
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find(c.expected), std::string::npos) << r.status().message();
  }
}

// --- Topology -------------------------------------------------------------------------

std::vector<LinkKind> kinds(const Topology& t, const std::vector<LinkId>& route) {
  std::vector<LinkKind> out;
  for (LinkId l : route) out.push_back(t.link(l).kind);
  return out;
}

TEST(Topology, IntraNodeRouteCrossesTheSwitchAtNvlinkBandwidth) {
  const Topology t = build_topology(cluster_of(R"({"profile": "dgx-h100", "nodes": 2})"));
  EXPECT_EQ(t.num_gpus(), 16);
  EXPECT_EQ(t.num_nodes(), 2);
  const std::vector<LinkId> r = t.route(t.gpu(1), t.gpu(6));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(t.link(r[0]).src, t.gpu(1));
  EXPECT_EQ(t.device(t.link(r[0]).dst).kind, DeviceKind::kSwitch);
  EXPECT_EQ(t.link(r[0]).dst, t.link(r[1]).src);
  EXPECT_EQ(t.link(r[1]).dst, t.gpu(6));
  EXPECT_EQ(kinds(t, r), (std::vector{LinkKind::kNvLink, LinkKind::kNvLink}));
  EXPECT_DOUBLE_EQ(t.bottleneck(r).to_GBps(), 450);
  EXPECT_EQ(t.latency(r), Time::us(0.6));
  EXPECT_TRUE(t.route(t.gpu(3), t.gpu(3)).empty());
}

TEST(Topology, InterNodeRouteUsesTheRailNics) {
  const Topology t = build_topology(cluster_of(R"({"profile": "dgx-h100", "nodes": 2})"));
  const std::vector<LinkId> r = t.route(t.gpu(3), t.gpu(8 + 5));
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(kinds(t, r),
            (std::vector{LinkKind::kPcie, LinkKind::kNic, LinkKind::kNic, LinkKind::kPcie}));
  const Device& src_nic = t.device(t.link(r[0]).dst);
  EXPECT_EQ(src_nic.kind, DeviceKind::kNic);
  EXPECT_EQ(src_nic.node, NodeId(0));
  EXPECT_EQ(src_nic.index, 3);
  EXPECT_EQ(t.link(r[1]).dst, t.core());
  const Device& dst_nic = t.device(t.link(r[2]).dst);
  EXPECT_EQ(dst_nic.node, NodeId(1));
  EXPECT_EQ(dst_nic.index, 5);
  EXPECT_DOUBLE_EQ(t.bottleneck(r).to_GBps(), 50);
  EXPECT_EQ(t.latency(r), Time::us(2.7));
  // Consecutive links chain.
  for (size_t i = 1; i < r.size(); ++i) EXPECT_EQ(t.link(r[i - 1]).dst, t.link(r[i]).src);
}

TEST(Topology, NicsAreSharedRoundRobinWhenFewerThanGpus) {
  const Topology t = build_topology(
      cluster_of(R"({"profile": "dgx-h100", "nodes": 2, "nics_per_node": 2, "nic_gbps": 200})"));
  const std::vector<LinkId> r = t.route(t.gpu(5), t.gpu(8 + 2));
  EXPECT_EQ(t.device(t.link(r[0]).dst).index, 1);  // 5 mod 2
  EXPECT_EQ(t.device(t.link(r[2]).dst).index, 0);  // 2 mod 2
  EXPECT_DOUBLE_EQ(t.bottleneck(r).to_GBps(), 25);
}

TEST(Topology, WanRouteGoesUpThenDownWithAsymmetricBandwidth) {
  const Topology t = build_topology(cluster_of(
      R"({"profile": "rtx4090-node", "nodes": 3,
          "wan": {"up_gbps": 0.02, "down_gbps": 0.1, "latency_ms": 50}})"));
  const std::vector<LinkId> r = t.route(t.gpu(2), t.gpu(8 + 7));
  EXPECT_EQ(kinds(t, r), (std::vector{LinkKind::kPcie, LinkKind::kNic, LinkKind::kWan,
                                      LinkKind::kWan, LinkKind::kNic, LinkKind::kPcie}));
  const Link& up = t.link(r[2]);
  const Link& down = t.link(r[3]);
  EXPECT_EQ(t.device(up.src).kind, DeviceKind::kWanGateway);
  EXPECT_EQ(t.device(up.src).node, NodeId(0));
  EXPECT_EQ(up.dst, t.core());
  EXPECT_EQ(t.device(down.dst).node, NodeId(1));
  EXPECT_DOUBLE_EQ(up.bandwidth.bytes_per_s(), 2.5e6);     // 20 Mb/s up
  EXPECT_DOUBLE_EQ(down.bandwidth.bytes_per_s(), 12.5e6);  // 100 Mb/s down
  EXPECT_EQ(t.bottleneck(r), up.bandwidth);
  // The WAN latency plus the 10 GbE hop of both nodes.
  EXPECT_EQ(t.latency(r), Time::ms(50) + Time::us(20));
  // The reverse direction uses the other node's up link.
  const std::vector<LinkId> back = t.route(t.gpu(8 + 7), t.gpu(2));
  EXPECT_EQ(t.device(t.link(back[2]).src).node, NodeId(1));
  // Inside a node the WAN is not involved: GPU -> host bridge -> GPU over PCIe.
  EXPECT_EQ(kinds(t, t.route(t.gpu(0), t.gpu(1))), (std::vector{LinkKind::kPcie, LinkKind::kPcie}));
}

TEST(Topology, MixedDatacenterAndWanNodes) {
  SystemProfile home = builtin("rtx4090-node");
  home.wan = WanLink{Bandwidth::gbit_per_s(0.05), Bandwidth::gbit_per_s(0.5), Time::ms(40)};
  home.provenance["wan"] = "test";
  Result<ClusterSpec> c =
      ClusterSpec::create({{"dgx-h100", builtin("dgx-h100"), 1}, {"home", home, 1}});
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const Topology t = build_topology(*c);
  // Datacenter node -> home node: its NIC into the core, then the home node's WAN down link.
  EXPECT_EQ(kinds(t, t.route(t.gpu(0), t.gpu(9))),
            (std::vector{LinkKind::kPcie, LinkKind::kNic, LinkKind::kWan, LinkKind::kNic,
                         LinkKind::kPcie}));
  EXPECT_DOUBLE_EQ(t.bottleneck(t.route(t.gpu(0), t.gpu(9))).bytes_per_s(), 0.5e9 / 8);
  EXPECT_DOUBLE_EQ(t.bottleneck(t.route(t.gpu(9), t.gpu(0))).bytes_per_s(), 0.05e9 / 8);
}

TEST(Topology, ClosedFormRoutesMatchDijkstra) {
  for (
      const char* json :
      {R"({"node_groups": [{"profile": "dgx-h100", "nodes": 2}, {"profile": "rtx4090-node", "nodes": 1}]})",
       R"({"profile": "rtx4090-node", "nodes": 2, "wan": {"up_gbps": 1, "down_gbps": 2, "latency_ms": 5}})"}) {
    SCOPED_TRACE(json);
    const Topology t = build_topology(cluster_of(json));
    for (int a = 0; a < t.num_gpus(); a += 3)
      for (int b = 0; b < t.num_gpus(); b += 5)
        EXPECT_EQ(t.route(t.gpu(a), t.gpu(b)), t.shortest_path(t.gpu(a), t.gpu(b)))
            << a << "->" << b;
  }
}

TEST(Topology, LargeClusterHasTheExpectedShape) {
  const Topology t = build_topology(cluster_of(R"({"profile": "dgx-h100", "nodes": 128})"));
  EXPECT_EQ(t.num_gpus(), 1024);
  // Core + per node 8 GPUs, 1 NVSwitch, 8 NICs.
  EXPECT_EQ(t.devices().size(), 1u + 128 * 17);
  // Per node: 2 x 8 NVLink, 2 x 8 GPU-NIC, 2 x 8 NIC-core.
  EXPECT_EQ(t.links().size(), 128u * 48);
  std::set<int> gpu_ids;
  for (int i = 0; i < t.num_gpus(); ++i) {
    const Device& d = t.device(t.gpu(i));
    EXPECT_EQ(d.kind, DeviceKind::kGpu);
    EXPECT_EQ(d.index, i);
    EXPECT_EQ(d.node, NodeId(i / 8));
    gpu_ids.insert(t.gpu(i).value());
  }
  EXPECT_EQ(gpu_ids.size(), 1024u);
  const std::vector<LinkId> r = t.route(t.gpu(0), t.gpu(1023));
  EXPECT_EQ(r, t.shortest_path(t.gpu(0), t.gpu(1023)));
  EXPECT_EQ(t.device(t.link(r.back()).src).index, 7);
}

}  // namespace
}  // namespace hetpar::hardware
