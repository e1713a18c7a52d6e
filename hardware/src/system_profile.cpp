#include "hetpar/hardware/system_profile.h"

#include <fmt/format.h>

#include <algorithm>

#include "builtin_profiles.h"
#include "hetpar/core/check.h"

namespace hetpar::hardware {

std::string_view to_string(FabricKind k) {
  switch (k) {
    case FabricKind::kNvSwitch:
      return "nvswitch";
    case FabricKind::kPcie:
      return "pcie";
    case FabricKind::kNone:
      return "none";
  }
  return "?";
}

std::string_view to_string(CollectiveScope s) {
  return s == CollectiveScope::kIntraNode ? "intra_node" : "inter_node";
}

std::string_view to_string(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllToAll:
      return "all_to_all";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kSendRecv:
      return "send_recv";
  }
  return "?";
}

namespace {
template <class E, size_t N>
std::optional<E> parse_enum(std::string_view name, const std::array<E, N>& all) {
  for (E e : all)
    if (to_string(e) == name) return e;
  return std::nullopt;
}
}  // namespace

std::optional<FabricKind> parse_fabric_kind(std::string_view name) {
  return parse_enum(name, std::array{FabricKind::kNvSwitch, FabricKind::kPcie, FabricKind::kNone});
}
std::optional<CollectiveScope> parse_collective_scope(std::string_view name) {
  return parse_enum(name, kAllScopes);
}
std::optional<Collective> parse_collective(std::string_view name) {
  return parse_enum(name, kAllCollectives);
}

Bandwidth CollectiveFigure::bus_bandwidth(int group_size) const {
  HETPAR_CHECK(!busbw.empty());
  Bandwidth bw = busbw.front().second;
  for (const auto& [g, b] : busbw)
    if (g <= group_size) bw = b;
  return bw;
}

double SystemProfile::cross_node_collective_slowdown() const {
  const int held = inter_node.collective_sms;
  if (held <= 0 || held >= gpu.sm_count) return 0;
  return static_cast<double>(held) / static_cast<double>(gpu.sm_count - held);
}

double SystemProfile::registered_collective_slowdown(bool in_node, bool gather) const {
  const RegisteredCollectiveSms& r =
      in_node ? intra_node.registered_collective_sms : inter_node.registered_collective_sms;
  const int held = gather ? r.all_gather : r.reduce_scatter;
  if (held <= 0 || held >= gpu.sm_count)
    return in_node ? gpu.collective_overlap_slowdown : cross_node_collective_slowdown();
  return static_cast<double>(held) / static_cast<double>(gpu.sm_count - held);
}

bool SystemProfile::has_collective(CollectiveScope scope, Collective op) const {
  return std::any_of(collectives.begin(), collectives.end(),
                     [&](const CollectiveFigure& f) { return f.scope == scope && f.op == op; });
}

const CollectiveFigure& SystemProfile::collective(CollectiveScope scope, Collective op) const {
  for (const CollectiveFigure& f : collectives)
    if (f.scope == scope && f.op == op) return f;
  HETPAR_CHECK(false, "profile {} has no {} {} figure", name, to_string(scope), to_string(op));
  return collectives.front();
}

namespace {

std::string collective_key(const CollectiveFigure& f) {
  return fmt::format("collectives.{}.{}", to_string(f.scope), to_string(f.op));
}

// First violation wins; messages name the JSON field.
class Checker {
 public:
  // A size or rate, in the field's unit: positive and at most kMaxProfileQuantity (a
  // non-finite or absurd figure would overflow the byte counts and rates derived from it).
  void positive(const std::string& field, double v) {
    if (!(v > 0)) fail(field, fmt::format("must be > 0, got {}", v));
    if (v > kMaxProfileQuantity)
      fail(field, fmt::format("must be <= {:g}, got {:g}", kMaxProfileQuantity, v));
  }
  void non_negative(const std::string& field, double v) {
    if (!(v >= 0)) fail(field, fmt::format("must be >= 0, got {}", v));
  }
  // A latency in [0, max].
  void latency(const std::string& field, Time t, Time max = kMaxCallLatency) {
    if (t < Time::zero()) fail(field, fmt::format("must be >= 0, got {}", value_in(field, t)));
    if (t > max)
      fail(field, fmt::format("must be <= {}, got {}", value_in(field, max), value_in(field, t)));
  }
  // t in the field's unit (its name ends in _us or _ms).
  static double value_in(const std::string& field, Time t) {
    return field.ends_with("_ms") ? t.to_ms() : t.to_us();
  }
  void fraction(const std::string& field, double v) {
    if (!(v > 0 && v <= 1)) fail(field, fmt::format("must be in (0, 1], got {}", v));
  }
  void fail(const std::string& field, std::string message) {
    if (status.is_ok()) status = Status::invalid_argument(fmt::format("{}: {}", field, message));
  }
  Status status;
};

// Rows [group size, bus bandwidth] of a collective figure under `key`: increasing group
// sizes, rates within Checker::positive's bounds.
void check_busbw(Checker& c, const std::string& key,
                 const std::vector<std::pair<int, Bandwidth>>& rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", key, i);
    if (rows[i].first < 1)
      c.fail(at, fmt::format("group size must be >= 1, got {}", rows[i].first));
    if (i > 0 && rows[i].first <= rows[i - 1].first) c.fail(at, "group sizes must increase");
    c.positive(at, rows[i].second.to_GBps());
  }
}

// An efficiency curve: factors in (0, max], sizes strictly ascending (`what` names them).
void check_curve(Checker& c, const std::string& key, const std::vector<CurvePoint>& curve,
                 std::string_view what, double max = 1.5) {
  for (size_t i = 0; i < curve.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", key, i);
    if (curve[i].factor <= 0 || curve[i].factor > max)
      c.fail(at, fmt::format("factor {} must be in (0, {}]", curve[i].factor, max));
    if (i > 0 && curve[i].at <= curve[i - 1].at)
      c.fail(at, fmt::format("{} must be strictly ascending", what));
  }
}

}  // namespace

Status validate_profile(const SystemProfile& p) {
  Checker c;
  if (p.name.empty()) c.fail("name", "must not be empty");
  if (p.gpus_per_node < 1)
    c.fail("gpus_per_node", fmt::format("must be >= 1, got {}", p.gpus_per_node));

  const DeviceProfile& g = p.gpu;
  if (g.model.empty()) c.fail("gpu.model", "must not be empty");
  if (g.sm_count < 1) c.fail("gpu.sm_count", fmt::format("must be >= 1, got {}", g.sm_count));
  c.positive("gpu.l2_MiB", g.l2.as_double() / 1048576.0);
  c.positive("gpu.memory_GiB", g.memory_capacity.to_GiB());
  c.positive("gpu.memory_GBps", g.memory_bandwidth.to_GBps());
  c.fraction("gpu.memory_efficiency", g.memory_efficiency);
  c.positive("gpu.host_link_GBps", g.host_link.to_GBps());
  if (!(g.collective_overlap_slowdown >= 0 && g.collective_overlap_slowdown <= 1))
    c.fail("gpu.collective_overlap_slowdown",
           fmt::format("must be in [0, 1], got {}", g.collective_overlap_slowdown));
  if (!(g.clock_spread >= 0 && g.clock_spread <= 0.2))
    c.fail("gpu.clock_spread", fmt::format("must be in [0, 0.2], got {}", g.clock_spread));
  if (!(g.compute_scale > 0 && g.compute_scale <= 1))
    c.fail("gpu.compute_scale", fmt::format("must be in (0, 1], got {}", g.compute_scale));
  if (!g.supports(Precision::kBf16)) c.fail("gpu.compute.bf16", "missing required precision");
  for (Precision prec : kAllPrecisions) {
    if (!g.supports(prec)) continue;
    const std::string key = fmt::format("gpu.compute.{}", to_string(prec));
    c.positive(key + ".peak_tflops", g.peak(prec).to_tflops());
    c.fraction(key + ".eta_max", g.eta_max(prec));
  }
  if (g.gemm_tiles.empty()) c.fail("gpu.gemm.tiles", "must list at least one tile");
  for (size_t i = 0; i < g.gemm_tiles.size(); ++i) {
    const GemmTile& t = g.gemm_tiles[i];
    const std::string key = fmt::format("gpu.gemm.tiles[{}]", i);
    if (t.m < 1 || t.n < 1) c.fail(key, fmt::format("tile {}x{} must be at least 1x1", t.m, t.n));
    c.fraction(key + "[2]", t.efficiency);
  }
  c.latency("gpu.gemm.launch_us", g.gemm_launch_overhead);
  c.latency("host.op_us", p.host_op);
  for (const auto& [name, table] : {std::pair{"measured", &g.gemm_measured},
                                    std::pair{"measured_accumulate", &g.gemm_accumulate_measured}})
    for (Precision prec : kAllPrecisions) {
      const std::vector<GemmMeasurement>& pts = (*table)[precision_index(prec)];
      const std::string key = fmt::format("gpu.gemm.{}.{}", name, to_string(prec));
      if (!pts.empty() && !g.supports(prec))
        c.fail(key, fmt::format("measured rates for {}, which gpu.compute does not list",
                                to_string(prec)));
      for (size_t i = 0; i < pts.size(); ++i) {
        const GemmMeasurement& m = pts[i];
        const std::string at = fmt::format("{}[{}]", key, i);
        if (m.m < 1 || m.n < 1 || m.k < 1)
          c.fail(at, fmt::format("GEMM {}x{}x{} must be at least 1x1x1", m.m, m.n, m.k));
        c.positive(at + "[3]", m.rate.to_tflops());
      }
    }
  for (Precision prec : kAllPrecisions) {
    const std::vector<CurvePoint>& curve = g.gemm_k_scale[precision_index(prec)];
    const std::string key = fmt::format("gpu.gemm.k_scale.{}", to_string(prec));
    if (!curve.empty() && !g.supports(prec))
      c.fail(key,
             fmt::format("a K curve for {}, which gpu.compute does not list", to_string(prec)));
    check_curve(c, key, curve, "K");
  }
  c.fraction("gpu.attention.fwd_efficiency", g.attention_fwd_efficiency);
  c.fraction("gpu.attention.bwd_efficiency", g.attention_bwd_efficiency);
  c.fraction("gpu.attention.sustain", g.attention_sustain);
  c.non_negative("gpu.attention.fwd_element_ps", g.attention_fwd_element_ps);
  c.non_negative("gpu.attention.bwd_element_ps", g.attention_bwd_element_ps);
  for (const auto& [key, curve] :
       {std::pair{"gpu.attention.fwd_seq_scale", &g.attention_fwd_seq_scale},
        std::pair{"gpu.attention.bwd_seq_scale", &g.attention_bwd_seq_scale}})
    check_curve(c, key, *curve, "sequence lengths");
  check_curve(c, "gpu.attention.noncausal_scale", g.attention_noncausal_scale, "sequence lengths",
              kMaxNoncausalScale);
  check_curve(c, "gpu.attention.head_dim_scale", g.attention_head_dim_scale, "head dims");
  for (const auto& [k, a] : g.attention_alternatives) {
    const std::string key = fmt::format("gpu.attention.alternatives.{}", to_string(k));
    c.fraction(key + ".fwd_efficiency", a.fwd_efficiency);
    c.fraction(key + ".bwd_efficiency", a.bwd_efficiency);
    check_curve(c, key + ".fwd_seq_scale", a.fwd_seq_scale, "sequence lengths");
    check_curve(c, key + ".bwd_seq_scale", a.bwd_seq_scale, "sequence lengths");
    check_curve(c, key + ".noncausal_scale", a.noncausal_scale, "sequence lengths",
                kMaxNoncausalScale);
    check_curve(c, key + ".head_dim_scale", a.head_dim_scale, "head dims");
  }

  const IntraNodeFabric& f = p.intra_node;
  if (p.gpus_per_node > 1) {
    if (f.kind == FabricKind::kNone)
      c.fail("intra_node.fabric", "\"none\" needs gpus_per_node == 1");
    c.positive("intra_node.GBps", f.bandwidth.to_GBps());
  }
  c.latency("intra_node.latency_us", f.latency);
  if (f.nvls && f.kind != FabricKind::kNvSwitch)
    c.fail("intra_node.nvls", "needs fabric \"nvswitch\"");
  if (f.nvls && (f.nvls_min_group < 2 || f.nvls_min_group > p.gpus_per_node))
    c.fail("intra_node.nvls_min_group", fmt::format("must be in [2, gpus_per_node={}], got {}",
                                                    p.gpus_per_node, f.nvls_min_group));

  if (p.inter_node.nics_per_node < 1)
    c.fail("inter_node.nics_per_node",
           fmt::format("must be >= 1, got {}", p.inter_node.nics_per_node));
  c.positive("inter_node.nic_gbps", p.inter_node.nic_bandwidth.bytes_per_s() * 8e-9);
  c.latency("inter_node.latency_us", p.inter_node.latency);
  if (p.inter_node.collective_sms < 0 ||
      (p.inter_node.collective_sms > 0 && p.inter_node.collective_sms >= p.gpu.sm_count))
    c.fail("inter_node.collective_sms", fmt::format("must be in [0, gpu.sm_count={}), got {}",
                                                    p.gpu.sm_count, p.inter_node.collective_sms));

  auto registered = [&](std::string_view where, const RegisteredCollectiveSms& r) {
    for (auto [kind, sms] :
         {std::pair{"all_gather", r.all_gather}, std::pair{"reduce_scatter", r.reduce_scatter}})
      if (sms < 0 || (sms > 0 && sms >= p.gpu.sm_count))
        c.fail(fmt::format("{}.registered_collective_sms.{}", where, kind),
               fmt::format("must be in [0, gpu.sm_count={}), got {}", p.gpu.sm_count, sms));
  };
  registered("intra_node", p.intra_node.registered_collective_sms);
  registered("inter_node", p.inter_node.registered_collective_sms);

  if (p.wan) {
    c.positive("wan.up_gbps", p.wan->up.bytes_per_s() * 8e-9);
    c.positive("wan.down_gbps", p.wan->down.bytes_per_s() * 8e-9);
    c.latency("wan.latency_ms", p.wan->latency, kMaxWanLatency);
  }

  for (const CollectiveFigure& fig : p.collectives) {
    const std::string key = collective_key(fig);
    c.latency(key + ".alpha_us", fig.alpha);
    if (fig.busbw.empty())
      c.fail(key + ".busbw_GBps", "must list at least one [group, GB/s] entry");
    check_busbw(c, key + ".busbw_GBps", fig.busbw);
    check_curve(c, key + ".size_scale", fig.size_scale, "message sizes");
    if (fig.busbw_without_nvls.empty() && fig.size_scale_without_nvls.empty()) continue;
    const std::string ring = key + ".busbw_without_nvls_GBps";
    if (fig.scope != CollectiveScope::kIntraNode || fig.op != Collective::kAllReduce)
      c.fail(ring, "only the intra_node all_reduce runs NVLS");
    else if (!p.intra_node.nvls)
      c.fail(ring, "needs intra_node.nvls (the figure is what NCCL runs with NVLS disabled)");
    else if (fig.busbw_without_nvls.empty())
      c.fail(ring, "missing: size_scale_without_nvls is given without it");
    check_busbw(c, ring, fig.busbw_without_nvls);
    check_curve(c, key + ".size_scale_without_nvls", fig.size_scale_without_nvls, "message sizes");
  }
  for (CollectiveScope scope : kAllScopes) {
    if (scope == CollectiveScope::kIntraNode && p.gpus_per_node == 1) continue;
    for (Collective op : kAllCollectives)
      if (!p.has_collective(scope, op))
        c.fail("collectives", fmt::format("missing {} {}", to_string(scope), to_string(op)));
  }
  return c.status;
}

std::vector<std::string> missing_provenance(const SystemProfile& p) {
  std::vector<std::string> fields = {"gpu.sm_count",
                                     "gpu.l2_MiB",
                                     "gpu.memory_GiB",
                                     "gpu.memory_GBps",
                                     "gpu.memory_efficiency",
                                     "gpu.host_link_GBps",
                                     "gpu.gemm.tiles",
                                     "gpu.gemm.launch_us",
                                     "gpu.attention.fwd_efficiency",
                                     "gpu.attention.bwd_efficiency",
                                     "intra_node.GBps",
                                     "intra_node.latency_us",
                                     "inter_node.nics_per_node",
                                     "inter_node.nic_gbps",
                                     "inter_node.latency_us"};
  for (Precision prec : kAllPrecisions) {
    if (!p.gpu.supports(prec)) continue;
    fields.push_back(fmt::format("gpu.compute.{}.peak_tflops", to_string(prec)));
    fields.push_back(fmt::format("gpu.compute.{}.eta_max", to_string(prec)));
  }
  for (const auto& [k, a] : p.gpu.attention_alternatives)
    fields.push_back(fmt::format("gpu.attention.alternatives.{}", to_string(k)));
  if (p.intra_node.nvls) fields.push_back("intra_node.nvls_min_group");
  if (p.gpu.collective_overlap_slowdown > 0) fields.push_back("gpu.collective_overlap_slowdown");
  if (p.gpu.clock_spread > 0) fields.push_back("gpu.clock_spread");
  if (p.inter_node.collective_sms > 0) fields.push_back("inter_node.collective_sms");
  if (p.intra_node.registered_collective_sms != RegisteredCollectiveSms{})
    fields.push_back("intra_node.registered_collective_sms");
  if (p.inter_node.registered_collective_sms != RegisteredCollectiveSms{})
    fields.push_back("inter_node.registered_collective_sms");
  if (p.gpu.attention_sustain != 1.0) fields.push_back("gpu.attention.sustain");
  if (p.gpu.attention_fwd_element_ps > 0 || p.gpu.attention_bwd_element_ps > 0)
    fields.push_back("gpu.attention.element_ps");
  if (!p.gpu.attention_noncausal_scale.empty()) fields.push_back("gpu.attention.noncausal_scale");
  if (!p.gpu.attention_head_dim_scale.empty()) fields.push_back("gpu.attention.head_dim_scale");
  if (p.gpu.gemm_accumulate_exposed != 0) fields.push_back("gpu.gemm.accumulate_exposed");
  if (p.shared_compute_units > 0) fields.push_back("shared_compute_units");
  if (p.host_op > Time::zero()) fields.push_back("host.op_us");
  for (Precision prec : kAllPrecisions) {
    if (!p.gpu.gemm_measured[precision_index(prec)].empty())
      fields.push_back(fmt::format("gpu.gemm.measured.{}", to_string(prec)));
    if (!p.gpu.gemm_accumulate_measured[precision_index(prec)].empty())
      fields.push_back(fmt::format("gpu.gemm.measured_accumulate.{}", to_string(prec)));
    if (!p.gpu.gemm_k_scale[precision_index(prec)].empty())
      fields.push_back(fmt::format("gpu.gemm.k_scale.{}", to_string(prec)));
  }
  if (p.wan) {
    fields.push_back("wan.up_gbps");
    fields.push_back("wan.down_gbps");
    fields.push_back("wan.latency_ms");
  }
  for (const CollectiveFigure& f : p.collectives) {
    fields.push_back(collective_key(f) + ".alpha_us");
    fields.push_back(collective_key(f) + ".busbw_GBps");
    if (!f.size_scale.empty()) fields.push_back(collective_key(f) + ".size_scale");
    if (!f.busbw_without_nvls.empty())
      fields.push_back(collective_key(f) + ".busbw_without_nvls_GBps");
    if (!f.size_scale_without_nvls.empty())
      fields.push_back(collective_key(f) + ".size_scale_without_nvls");
  }
  auto covered = [&](std::string field) {
    for (;;) {
      if (p.provenance.count(field)) return true;
      const size_t dot = field.rfind('.');
      if (dot == std::string::npos) return false;
      field.resize(dot);
    }
  };
  std::vector<std::string> missing;
  for (const std::string& f : fields)
    if (!covered(f)) missing.push_back(f);
  return missing;
}

std::vector<std::string> builtin_profile_names() {
  std::vector<std::string> names;
  for (const EmbeddedFile& f : detail::builtin_profile_files()) names.emplace_back(f.name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace hetpar::hardware
