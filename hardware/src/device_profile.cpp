#include "hetpar/hardware/device_profile.h"

#include <algorithm>
#include <array>
#include <boost/math/distributions/normal.hpp>
#include <cmath>
#include <limits>

#include "hetpar/core/check.h"

namespace hetpar::hardware {

namespace {
// Split-K never cuts K below this many elements per split (one split must still stream
// several K-tiles to amortize its prologue and the partial-sum write).
constexpr int64_t kMinSplitK = 256;

constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
}  // namespace

FlopRate DeviceProfile::peak(Precision p) const {
  HETPAR_CHECK(supports(p), "{} does not support {}", model, to_string(p));
  return compute[precision_index(p)]->peak;
}

double DeviceProfile::eta_max(Precision p) const {
  HETPAR_CHECK(supports(p), "{} does not support {}", model, to_string(p));
  return compute[precision_index(p)]->eta_max;
}

double DeviceProfile::model_gemm_seconds(int64_t m, int64_t n, int64_t k, int64_t batch,
                                         Precision p, double rate_scale) const {
  const PrecisionRate& rate = *compute[precision_index(p)];
  const double sm_flops = rate.peak.per_second() * rate.eta_max * rate_scale *
                          curve_factor(gemm_k_scale[precision_index(p)], k) / sm_count;
  const double mem_bps = memory_bandwidth.bytes_per_s() * memory_efficiency;
  const double b = static_cast<double>(batch);
  const double md = static_cast<double>(m), nd = static_cast<double>(n),
               kd = static_cast<double>(k);
  const double operand_bytes =
      static_cast<double>(bytes_per_element(p)) * b * (md * kd + kd * nd + md * nd);

  double best = std::numeric_limits<double>::infinity();
  for (const GemmTile& t : gemm_tiles) {
    const int64_t tiles = ceil_div(m, t.m) * ceil_div(n, t.n) * batch;
    int64_t split = 1;
    if (gemm_split_k)
      while (tiles * split * 2 <= sm_count && k / (split * 2) >= kMinSplitK) split *= 2;
    const int64_t waves = ceil_div(tiles * split, sm_count);
    const double tile_s =
        2.0 * t.m * t.n * static_cast<double>(ceil_div(k, split)) / (sm_flops * t.efficiency);
    // Split-K writes fp32 partial sums and reads them back for the final reduction.
    const double partial_bytes =
        split > 1 ? 2.0 * 4.0 * static_cast<double>(split) * md * nd * b : 0;
    best = std::min(best, std::max(static_cast<double>(waves) * tile_s,
                                   (operand_bytes + partial_bytes) / mem_bps));
  }
  return best;
}

Time DeviceProfile::gemm_time(int64_t m, int64_t n, int64_t k, int64_t batch, Precision p,
                              bool accumulate_fp32) const {
  HETPAR_CHECK(m >= 1 && n >= 1 && k >= 1 && batch >= 1, "gemm {}x{}x{} batch {}", m, n, k, batch);
  HETPAR_CHECK(supports(p), "{} does not support {}", model, to_string(p));
  const std::vector<GemmMeasurement>& accumulating = gemm_accumulate_measured[precision_index(p)];
  const bool accumulate_table = accumulate_fp32 && !accumulating.empty();
  // The fp32 output's read and write, the part the main loop leaves exposed.
  const auto exposed_output_s = [&](int64_t om, int64_t on, int64_t ob) {
    return gemm_accumulate_exposed * 8.0 * static_cast<double>(om) * static_cast<double>(on) *
           static_cast<double>(ob) / (memory_bandwidth.bytes_per_s() * memory_efficiency);
  };
  const Time modelled = Time::seconds(model_gemm_seconds(m, n, k, batch, p, compute_scale) +
                                      (accumulate_fp32 ? exposed_output_s(m, n, batch) : 0.0)) +
                        gemm_launch_overhead;
  const std::vector<GemmMeasurement>& measured =
      accumulate_table ? accumulating : gemm_measured[precision_index(p)];
  if (measured.empty()) return modelled;
  const double t = modelled.to_seconds();

  // The kNearest measured shapes closest in log2 space (insertion into a fixed array: no
  // allocation on this hot path).
  constexpr int kNearest = 4;
  std::array<std::pair<double, const GemmMeasurement*>, kNearest> near{};
  int found = 0;
  const double lm = std::log2(static_cast<double>(m)), ln = std::log2(static_cast<double>(n)),
               lk = std::log2(static_cast<double>(k));
  for (const GemmMeasurement& g : measured) {
    const double dm = std::log2(static_cast<double>(g.m)) - lm,
                 dn = std::log2(static_cast<double>(g.n)) - ln,
                 dk = std::log2(static_cast<double>(g.k)) - lk;
    const double d2 = dm * dm + dn * dn + dk * dk;
    int i = std::min(found, kNearest - 1);
    if (found == kNearest && d2 >= near[i].first) continue;
    while (i > 0 && near[i - 1].first > d2) {
      near[i] = near[i - 1];
      --i;
    }
    near[i] = {d2, &g};
    found = std::min(found + 1, kNearest);
  }
  auto log_ratio = [&](const GemmMeasurement& g) {
    const double measured_s = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) *
                              static_cast<double>(g.k) / g.rate.per_second();
    // The measurement is of one GPU, so against the model of one GPU (no job's slowest).
    const double model_s = model_gemm_seconds(g.m, g.n, g.k, 1, p, 1.0) +
                           (accumulate_table ? exposed_output_s(g.m, g.n, 1) : 0.0) +
                           gemm_launch_overhead.to_seconds();
    return std::log(measured_s / model_s);
  };
  if (near[0].first < 1e-12) return Time::seconds(t * std::exp(log_ratio(*near[0].second)));
  double sum_w = 0, sum = 0;
  for (int i = 0; i < found; ++i) {
    const double w = 1.0 / near[i].first;
    sum_w += w;
    sum += w * log_ratio(*near[i].second);
  }
  return Time::seconds(t * std::exp(sum / sum_w));
}

double DeviceProfile::gemm_efficiency(int64_t m, int64_t n, int64_t k, int64_t batch,
                                      Precision p) const {
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) *
                       static_cast<double>(k) * static_cast<double>(batch);
  return flops / (gemm_time(m, n, k, batch, p).to_seconds() * peak(p).per_second());
}

std::string_view to_string(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kDefault:
      return "default";
    case AttentionKernel::kCudnn:
      return "cudnn";
    case AttentionKernel::kFlash2:
      return "flash2";
    case AttentionKernel::kFlash3:
      return "flash3";
  }
  return "?";
}

std::optional<AttentionKernel> parse_attention_kernel(std::string_view s) {
  for (AttentionKernel k : kAttentionKernels)
    if (to_string(k) == s) return k;
  return std::nullopt;
}

bool DeviceProfile::has_attention_kernel(AttentionKernel k) const {
  return k == AttentionKernel::kDefault || k == attention_kernel ||
         attention_alternatives.contains(k);
}

const AttentionRates* DeviceProfile::attention_rates(AttentionKernel k) const {
  if (k == AttentionKernel::kDefault || k == attention_kernel) return nullptr;
  auto it = attention_alternatives.find(k);
  HETPAR_CHECK(it != attention_alternatives.end(), "profile {} has no {} attention rates", model,
               to_string(k));
  return &it->second;
}

Time DeviceProfile::attention_time(Flops flops, Precision p, bool backward, int64_t seq_kv,
                                   const AttentionRates* rates, bool causal,
                                   int64_t head_dim) const {
  const double unmasked =
      causal ? 1.0
             : curve_factor(rates ? rates->noncausal_scale : attention_noncausal_scale, seq_kv);
  const double head =
      head_dim > 0
          ? curve_factor(rates ? rates->head_dim_scale : attention_head_dim_scale, head_dim)
          : 1.0;
  const double fwd_eff =
      (rates ? rates->fwd_efficiency : attention_fwd_efficiency) * unmasked * head;
  const double bwd_eff =
      (rates ? rates->bwd_efficiency : attention_bwd_efficiency) * unmasked * head;
  const std::vector<CurvePoint>& fwd_scale = rates ? rates->fwd_seq_scale : attention_fwd_seq_scale;
  const std::vector<CurvePoint>& bwd_scale = rates ? rates->bwd_seq_scale : attention_bwd_seq_scale;
  const FlopRate sustained = peak(p) * (attention_sustain * compute_scale);
  // The score matrix's elements, at the clock the tensor work runs at.
  const double per_element =
      (backward ? attention_bwd_element_ps : attention_fwd_element_ps) * 1e-12;
  Time softmax;
  if (rates == nullptr && head_dim > 0 && per_element > 0)
    softmax = Time::seconds(attention_score_elements(flops.count(), backward, head_dim) *
                            per_element / (attention_sustain * compute_scale));
  if (!backward)
    return flops / (sustained * fwd_eff * curve_factor(fwd_scale, seq_kv)) + softmax +
           gemm_launch_overhead;
  // The backward efficiency is quoted as FlashAttention's benchmarks count it: 2.5x the
  // forward FLOPs (dQ, dK, dV plus the recomputed QK^T), not the model-FLOP 2x the caller
  // passes, so the kernel does 2.5 / 2 times the work `flops` names.
  return flops * kFlashBackwardWork / (sustained * bwd_eff * curve_factor(bwd_scale, seq_kv)) +
         softmax + gemm_launch_overhead;
}

Time DeviceProfile::memory_time(Bytes bytes) const {
  return bytes / effective_memory_bandwidth();
}

Time DeviceProfile::memory_kernel_time(Bytes bytes) const {
  if (bytes.count() <= 0) return Time::zero();
  return memory_time(bytes) + gemm_launch_overhead;
}

double slowest_rate_share(double spread, int64_t n) {
  HETPAR_CHECK(n >= 1 && spread >= 0 && spread <= 0.2, "{} GPUs, spread {}", n, spread);
  if (n == 1 || spread == 0) return 1.0;
  const double nd = static_cast<double>(n);
  const double z = boost::math::quantile(boost::math::normal(), (nd - 0.375) / (nd + 0.25));
  return 1.0 - spread * z;
}

}  // namespace hetpar::hardware
