#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "builtin_profiles.h"
#include "hetpar/core/json_reader.h"
#include "hetpar/hardware/hardware_json.h"

namespace hetpar::hardware {

namespace {

// Unit conversions round to whole bytes/s, FLOP/s and bytes, so that writing a profile
// in JSON units and reading it back reproduces the same values exactly.
Bandwidth from_GBps(double v) {
  return Bandwidth::bytes_per_s(std::round(v * 1e9));
}
Bandwidth from_gbps(double v) {
  return Bandwidth::bytes_per_s(std::round(v * 1e9 / 8.0));
}
// JSON units by division (not by multiplying with 1e-9), so 234.6e9 B/s prints as 234.6.
double to_gbps(Bandwidth b) {
  return b.bytes_per_s() * 8.0 / 1e9;
}
double to_GBps(Bandwidth b) {
  return b.bytes_per_s() / 1e9;
}
double to_tflops(FlopRate r) {
  return r.per_second() / 1e12;
}
double to_us(Time t) {
  return static_cast<double>(t.count_ps()) / 1e6;
}
double to_ms(Time t) {
  return static_cast<double>(t.count_ps()) / 1e9;
}
Bytes from_scaled_bytes(double v, double unit) {
  return Bytes(std::llround(v * unit));
}
constexpr double kMiB = 1048576.0;
constexpr double kGiB = 1073741824.0;
constexpr int64_t kMaxCount = int64_t{1} << 30;
// Latencies are bounded above here (kMaxCallLatency), and sizes and rates
// (kMaxProfileQuantity), before the conversions to picoseconds, bytes and B/s, whose
// overflow would be reported as "inf" instead of the value written; negative ones pass
// here and get validate_profile()'s message.
constexpr double kMaxLatencyUs = kMaxCallLatency.to_us();
constexpr double kMaxQuantity = kMaxProfileQuantity;
constexpr double kNoMin = -1e308;
// The largest time per attention score element a profile may hold: a microsecond, far above
// any kernel's (a CPU backend's softmax takes nanoseconds).
constexpr double kMaxElementPs = 1e6;

int read_count(JsonReader& r, std::string_view key) {
  return static_cast<int>(r.required_int(key, -kMaxCount, kMaxCount));
}

// An optional "registered_collective_sms" object of `r` (absent: zeros, not modelled).
RegisteredCollectiveSms read_registered_sms(JsonReader& r) {
  RegisteredCollectiveSms out;
  if (!r.has("registered_collective_sms")) return out;
  JsonReader o = r.object("registered_collective_sms");
  out.all_gather = static_cast<int>(o.optional_int("all_gather", 0, -kMaxCount, kMaxCount));
  out.reduce_scatter = static_cast<int>(o.optional_int("reduce_scatter", 0, -kMaxCount, kMaxCount));
  o.finish();
  r.merge(o.status());
  return out;
}

// A size or rate in its field's unit, at most kMaxQuantity (non-positive ones get
// validate_profile()'s message).
double read_quantity(JsonReader& r, std::string_view key) {
  return r.required_double(key, kNoMin, kMaxQuantity);
}

// `[[a, b, ...], ...]`: arrays of `width` numbers.
std::vector<std::vector<double>> read_rows(JsonReader& r, std::string_view key, size_t width,
                                           std::string_view shape) {
  std::vector<std::vector<double>> rows;
  const nlohmann::json& arr = r.array(key, /*required=*/true);
  for (size_t i = 0; i < arr.size() && r.ok(); ++i) {
    const nlohmann::json& row = arr[i];
    bool good = row.is_array() && row.size() == width &&
                std::all_of(row.begin(), row.end(), [](const auto& v) { return v.is_number(); });
    if (!good) {
      r.fail(fmt::format("{}[{}]", key, i), fmt::format("expected {}, got {}", shape, row.dump()));
      break;
    }
    rows.emplace_back();
    for (const auto& v : row) rows.back().push_back(v.get<double>());
  }
  return rows;
}

bool is_whole(double v) {
  return v == std::floor(v) && std::fabs(v) < 1e9;
}

// An efficiency curve, rows [size, factor] under r's `key`; `column` names the size in the
// row shape, `sizes` in the message when one is not a positive integer.
void read_curve(JsonReader& r, std::string_view key, std::string_view column,
                std::string_view sizes, std::vector<CurvePoint>& out) {
  for (const auto& row : read_rows(r, key, 2, fmt::format("[{}, factor]", column))) {
    // Sizes may be bytes (collectives' messages up to GiBs): whole numbers below 2^53.
    if (row[0] != std::floor(row[0]) || row[0] < 1 || row[0] > 9e15) {
      r.fail(key, fmt::format("{} must be positive integers, got {}", sizes, row[0]));
      return;
    }
    out.push_back({static_cast<int64_t>(row[0]), row[1]});
  }
}

nlohmann::json curve_json(const std::vector<CurvePoint>& curve) {
  nlohmann::json rows = nlohmann::json::array();
  for (const CurvePoint& pt : curve) rows.push_back({pt.at, pt.factor});
  return rows;
}

void read_gpu(JsonReader r, DeviceProfile& g, JsonReader& parent) {
  g.model = r.required_string("model");
  g.sm_count = read_count(r, "sm_count");
  g.l2 = from_scaled_bytes(read_quantity(r, "l2_MiB"), kMiB);
  g.memory_capacity = from_scaled_bytes(read_quantity(r, "memory_GiB"), kGiB);
  g.memory_bandwidth = from_GBps(read_quantity(r, "memory_GBps"));
  g.memory_efficiency = r.required_double("memory_efficiency");
  g.host_link = from_GBps(read_quantity(r, "host_link_GBps"));
  g.collective_overlap_slowdown = r.optional_double("collective_overlap_slowdown", 0, 0, 1);
  g.clock_spread = r.optional_double("clock_spread", 0, 0, 0.2);

  JsonReader compute = r.object("compute");
  if (const nlohmann::json* cj = r.raw("compute"); cj && cj->is_object()) {
    for (auto it = cj->begin(); it != cj->end() && compute.ok(); ++it) {
      if (!it.key().empty() && it.key()[0] == '$') continue;
      std::optional<Precision> prec = parse_precision(it.key());
      compute.raw(it.key());
      if (!prec) {
        compute.fail(it.key(), "unknown precision (expected fp32|tf32|bf16|fp16|fp8)");
        break;
      }
      JsonReader pr(it.value(), compute.path_of(it.key()));
      PrecisionRate rate;
      rate.peak = FlopRate::per_second(std::round(read_quantity(pr, "peak_tflops") * 1e12));
      rate.eta_max = pr.required_double("eta_max");
      pr.finish();
      compute.merge(pr.status());
      g.compute[precision_index(*prec)] = rate;
    }
  }
  compute.finish();
  r.merge(compute.status());

  JsonReader gemm = r.object("gemm");
  for (const auto& row : read_rows(gemm, "tiles", 3, "[Tm, Tn, efficiency]")) {
    if (!is_whole(row[0]) || !is_whole(row[1])) {
      gemm.fail("tiles", fmt::format("tile sizes must be integers, got {}x{}", row[0], row[1]));
      break;
    }
    g.gemm_tiles.push_back({static_cast<int>(row[0]), static_cast<int>(row[1]), row[2]});
  }
  g.gemm_launch_overhead = Time::us(gemm.required_double("launch_us", kNoMin, kMaxLatencyUs));
  g.gemm_split_k = gemm.optional_bool("split_k", true);
  g.gemm_accumulate_exposed = gemm.optional_double("accumulate_exposed", 0.0, 0.0, 1.0);
  // gpu.gemm.<key>: an object of precision -> rows; `each` takes one precision's key.
  auto per_precision = [&gemm](std::string_view key, auto&& each) {
    if (!gemm.has(key)) return;
    JsonReader table = gemm.object(key);
    const nlohmann::json* tj = gemm.raw(key);
    for (auto it = tj->begin(); tj->is_object() && it != tj->end() && table.ok(); ++it) {
      if (!it.key().empty() && it.key()[0] == '$') continue;
      std::optional<Precision> prec = parse_precision(it.key());
      if (!prec) {
        table.fail(it.key(), "unknown precision (expected fp32|tf32|bf16|fp16|fp8)");
        break;
      }
      each(table, it.key(), *prec);
    }
    table.finish();
    gemm.merge(table.status());
  };
  // gemm.measured (plain GEMMs) and gemm.measured_accumulate (adding into an fp32 output):
  // rows of [m, n, k, tflops] per precision.
  auto measured_rows = [](auto& table) {
    return [&table](JsonReader& measured, const std::string& key, Precision prec) {
      for (const auto& row : read_rows(measured, key, 4, "[m, n, k, tflops]")) {
        if (!is_whole(row[0]) || !is_whole(row[1]) || !is_whole(row[2])) {
          measured.fail(key, fmt::format("GEMM sizes must be integers, got {}x{}x{}", row[0],
                                         row[1], row[2]));
          break;
        }
        if (row[3] > kMaxQuantity) {
          measured.fail(key,
                        fmt::format("must be <= {:g} TFLOP/s, got {:g}", kMaxQuantity, row[3]));
          break;
        }
        table[precision_index(prec)].push_back(
            {static_cast<int64_t>(row[0]), static_cast<int64_t>(row[1]),
             static_cast<int64_t>(row[2]), FlopRate::per_second(std::round(row[3] * 1e12))});
      }
    };
  };
  per_precision("measured", measured_rows(g.gemm_measured));
  per_precision("measured_accumulate", measured_rows(g.gemm_accumulate_measured));
  per_precision("k_scale", [&g](JsonReader& ks, const std::string& key, Precision prec) {
    read_curve(ks, key, "K", "K values", g.gemm_k_scale[precision_index(prec)]);
  });
  gemm.finish();
  r.merge(gemm.status());

  JsonReader att = r.object("attention");
  const auto read_rates = [](JsonReader& a, AttentionRates& out) {
    out.fwd_efficiency = a.required_double("fwd_efficiency");
    out.bwd_efficiency = a.required_double("bwd_efficiency");
    for (const auto& [key, curve] : {std::pair{"fwd_seq_scale", &out.fwd_seq_scale},
                                     std::pair{"bwd_seq_scale", &out.bwd_seq_scale},
                                     std::pair{"noncausal_scale", &out.noncausal_scale}})
      if (a.has(key)) read_curve(a, key, "seq", "sequence lengths", *curve);
    if (a.has("head_dim_scale"))
      read_curve(a, "head_dim_scale", "head dim", "head dims", out.head_dim_scale);
  };
  AttentionRates own;
  read_rates(att, own);
  g.attention_fwd_efficiency = own.fwd_efficiency;
  g.attention_bwd_efficiency = own.bwd_efficiency;
  g.attention_fwd_seq_scale = std::move(own.fwd_seq_scale);
  g.attention_bwd_seq_scale = std::move(own.bwd_seq_scale);
  g.attention_noncausal_scale = std::move(own.noncausal_scale);
  g.attention_head_dim_scale = std::move(own.head_dim_scale);
  g.attention_sustain = att.optional_double("sustain", 1.0);
  g.attention_fwd_element_ps = att.optional_double("fwd_element_ps", 0, kNoMin, kMaxElementPs);
  g.attention_bwd_element_ps = att.optional_double("bwd_element_ps", 0, kNoMin, kMaxElementPs);
  if (att.has("kernel"))
    g.attention_kernel =
        *parse_attention_kernel(att.required_enum("kernel", {"cudnn", "flash2", "flash3"}));
  if (att.has("alternatives")) {
    JsonReader alts = att.object("alternatives");
    for (AttentionKernel k : kAttentionKernels) {
      if (k == AttentionKernel::kDefault || !alts.has(to_string(k))) continue;
      if (k == g.attention_kernel) {
        alts.fail(to_string(k), "is the profile's own kernel (attention.kernel)");
        continue;
      }
      JsonReader a = alts.object(to_string(k));
      read_rates(a, g.attention_alternatives[k]);
      a.finish();
      alts.merge(a.status());
    }
    alts.finish();
    att.merge(alts.status());
  }
  att.finish();
  r.merge(att.status());

  r.finish();
  parent.merge(r.status());
}

// Rows [group size, GB/s] under `key`.
void read_busbw(JsonReader& c, const std::string& key,
                std::vector<std::pair<int, Bandwidth>>& out) {
  const auto rows = read_rows(c, key, 2, "[group size, GB/s]");
  for (size_t k = 0; k < rows.size(); ++k) {
    const std::vector<double>& row = rows[k];
    if (!is_whole(row[0])) {
      c.fail(key, fmt::format("group size must be an integer, got {}", row[0]));
      break;
    }
    if (row[1] > kMaxQuantity) {
      c.fail(fmt::format("{}[{}]", key, k),
             fmt::format("must be <= {:g}, got {:g}", kMaxQuantity, row[1]));
      break;
    }
    out.emplace_back(static_cast<int>(row[0]), from_GBps(row[1]));
  }
}

void read_collectives(JsonReader& r, std::vector<CollectiveFigure>& out) {
  const nlohmann::json& arr = r.array("collectives", /*required=*/true);
  for (size_t i = 0; i < arr.size() && r.ok(); ++i) {
    JsonReader c(arr[i], json_index_path(r.path(), "collectives", i));
    CollectiveFigure f;
    std::string scope = c.required_enum("scope", {"intra_node", "inter_node"});
    std::string op = c.required_enum("op", {"all_reduce", "all_gather", "reduce_scatter",
                                            "all_to_all", "broadcast", "send_recv"});
    f.alpha = Time::us(c.required_double("alpha_us", kNoMin, kMaxLatencyUs));
    read_busbw(c, "busbw_GBps", f.busbw);
    if (c.has("size_scale")) read_curve(c, "size_scale", "bytes", "message sizes", f.size_scale);
    if (c.has("busbw_without_nvls_GBps"))
      read_busbw(c, "busbw_without_nvls_GBps", f.busbw_without_nvls);
    if (c.has("size_scale_without_nvls"))
      read_curve(c, "size_scale_without_nvls", "bytes", "message sizes", f.size_scale_without_nvls);
    c.finish();
    if (c.ok()) {
      f.scope = *parse_collective_scope(scope);
      f.op = *parse_collective(op);
      if (std::any_of(out.begin(), out.end(),
                      [&](const auto& o) { return o.scope == f.scope && o.op == f.op; }))
        c.fail("op", fmt::format("duplicate {} {}", scope, op));
    }
    r.merge(c.status());
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::pair(a.scope, a.op) < std::pair(b.scope, b.op);
  });
}

nlohmann::json rows_json(const std::vector<std::pair<int, Bandwidth>>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [g, bw] : rows) j.push_back({g, to_GBps(bw)});
  return j;
}

}  // namespace

Result<WanLink> parse_wan(const nlohmann::json& j, const std::string& path) {
  JsonReader r(j, path);
  WanLink w;
  w.up = from_gbps(read_quantity(r, "up_gbps"));
  w.down = from_gbps(read_quantity(r, "down_gbps"));
  w.latency = Time::ms(r.required_double("latency_ms", kNoMin, kMaxWanLatency.to_ms()));
  r.finish();
  if (!r.ok()) return r.status();
  if (!(w.up.bytes_per_s() > 0))
    r.fail("up_gbps", fmt::format("must be > 0, got {}", to_gbps(w.up)));
  if (!(w.down.bytes_per_s() > 0))
    r.fail("down_gbps", fmt::format("must be > 0, got {}", to_gbps(w.down)));
  if (w.latency < Time::zero())
    r.fail("latency_ms", fmt::format("must be >= 0, got {}", to_ms(w.latency)));
  if (!r.ok()) return r.status();
  return w;
}

nlohmann::json wan_to_json(const WanLink& w) {
  return {
      {"up_gbps", to_gbps(w.up)}, {"down_gbps", to_gbps(w.down)}, {"latency_ms", to_ms(w.latency)}};
}

Result<SystemProfile> parse_profile(const nlohmann::json& j, const std::string& path) {
  JsonReader r(j, path);
  SystemProfile p;
  p.name = r.required_string("name");
  p.description = r.optional_string("description", "");
  p.gpus_per_node = read_count(r, "gpus_per_node");
  p.shared_compute_units = static_cast<int>(r.optional_int("shared_compute_units", 0, 0, 1 << 20));
  read_gpu(r.object("gpu"), p.gpu, r);
  if (r.has("host")) {
    JsonReader host = r.object("host");
    p.host_op = Time::us(host.required_double("op_us", kNoMin, kMaxLatencyUs));
    host.finish();
    r.merge(host.status());
  }

  JsonReader intra = r.object("intra_node");
  p.intra_node.kind = parse_fabric_kind(intra.required_enum("fabric", {"nvswitch", "pcie", "none"}))
                          .value_or(FabricKind::kNone);
  p.intra_node.bandwidth = from_GBps(intra.optional_double("GBps", 0, kNoMin, kMaxQuantity));
  p.intra_node.latency = Time::us(intra.optional_double("latency_us", 0, kNoMin, kMaxLatencyUs));
  p.intra_node.nvls = intra.optional_bool("nvls", false);
  p.intra_node.nvls_min_group =
      static_cast<int>(intra.optional_int("nvls_min_group", 0, -kMaxCount, kMaxCount));
  p.intra_node.registered_collective_sms = read_registered_sms(intra);
  intra.finish();
  r.merge(intra.status());

  JsonReader inter = r.object("inter_node");
  p.inter_node.nics_per_node = read_count(inter, "nics_per_node");
  p.inter_node.nic_bandwidth = from_gbps(read_quantity(inter, "nic_gbps"));
  p.inter_node.latency = Time::us(inter.required_double("latency_us", kNoMin, kMaxLatencyUs));
  p.inter_node.collective_sms =
      static_cast<int>(inter.optional_int("collective_sms", 0, 0, kMaxCount));
  p.inter_node.registered_collective_sms = read_registered_sms(inter);
  inter.finish();
  r.merge(inter.status());

  if (const nlohmann::json* wan = r.raw("wan"); wan && r.ok()) {
    Result<WanLink> w = parse_wan(*wan, r.path_of("wan"));
    r.merge(w.status());
    if (w) p.wan = *w;
  }
  read_collectives(r, p.collectives);

  if (const nlohmann::json* prov = r.raw("provenance"); prov && r.ok()) {
    if (!prov->is_object()) r.fail("provenance", "expected an object of field -> source strings");
    for (auto it = prov->begin(); prov->is_object() && it != prov->end() && r.ok(); ++it) {
      if (!it.value().is_string())
        r.fail(fmt::format("provenance.{}", it.key()), "expected a source string");
      else
        p.provenance[it.key()] = it.value().get<std::string>();
    }
  }
  r.finish();
  if (!r.ok()) return r.status();
  if (Status st = validate_profile(p); !st.is_ok())
    return path.empty() ? st : Status::invalid_argument(fmt::format("{}.{}", path, st.message()));
  return p;
}

nlohmann::json profile_to_json(const SystemProfile& p) {
  const DeviceProfile& g = p.gpu;
  nlohmann::json compute = nlohmann::json::object();
  for (Precision prec : kAllPrecisions)
    if (g.supports(prec))
      compute[std::string(to_string(prec))] = {{"peak_tflops", to_tflops(g.peak(prec))},
                                               {"eta_max", g.eta_max(prec)}};
  nlohmann::json tiles = nlohmann::json::array();
  for (const GemmTile& t : g.gemm_tiles) tiles.push_back({t.m, t.n, t.efficiency});
  nlohmann::json gemm = {
      {"tiles", tiles}, {"launch_us", to_us(g.gemm_launch_overhead)}, {"split_k", g.gemm_split_k}};
  if (g.gemm_accumulate_exposed != 0) gemm["accumulate_exposed"] = g.gemm_accumulate_exposed;
  for (const auto& [key, table] : {std::pair{"measured", &g.gemm_measured},
                                   std::pair{"measured_accumulate", &g.gemm_accumulate_measured}})
    for (Precision prec : kAllPrecisions) {
      const std::vector<GemmMeasurement>& pts = (*table)[precision_index(prec)];
      if (pts.empty()) continue;
      nlohmann::json rows = nlohmann::json::array();
      for (const GemmMeasurement& m : pts) rows.push_back({m.m, m.n, m.k, to_tflops(m.rate)});
      gemm[key][std::string(to_string(prec))] = rows;
    }
  for (Precision prec : kAllPrecisions)
    if (const auto& curve = g.gemm_k_scale[precision_index(prec)]; !curve.empty())
      gemm["k_scale"][std::string(to_string(prec))] = curve_json(curve);

  const auto rates_json = [](const AttentionRates& a) {
    nlohmann::json j = {{"fwd_efficiency", a.fwd_efficiency}, {"bwd_efficiency", a.bwd_efficiency}};
    if (!a.fwd_seq_scale.empty()) j["fwd_seq_scale"] = curve_json(a.fwd_seq_scale);
    if (!a.bwd_seq_scale.empty()) j["bwd_seq_scale"] = curve_json(a.bwd_seq_scale);
    if (!a.noncausal_scale.empty()) j["noncausal_scale"] = curve_json(a.noncausal_scale);
    if (!a.head_dim_scale.empty()) j["head_dim_scale"] = curve_json(a.head_dim_scale);
    return j;
  };
  nlohmann::json attention = rates_json({g.attention_fwd_efficiency, g.attention_bwd_efficiency,
                                         g.attention_fwd_seq_scale, g.attention_bwd_seq_scale,
                                         g.attention_noncausal_scale, g.attention_head_dim_scale});
  if (g.attention_kernel != AttentionKernel::kDefault)
    attention["kernel"] = to_string(g.attention_kernel);
  if (g.attention_sustain != 1.0) attention["sustain"] = g.attention_sustain;
  if (g.attention_fwd_element_ps > 0) attention["fwd_element_ps"] = g.attention_fwd_element_ps;
  if (g.attention_bwd_element_ps > 0) attention["bwd_element_ps"] = g.attention_bwd_element_ps;
  for (const auto& [k, a] : g.attention_alternatives)
    attention["alternatives"][std::string(to_string(k))] = rates_json(a);

  nlohmann::json j = {
      {"name", p.name},
      {"description", p.description},
      {"gpus_per_node", p.gpus_per_node},
      {"shared_compute_units", p.shared_compute_units},
      {"gpu",
       {{"model", g.model},
        {"sm_count", g.sm_count},
        {"l2_MiB", g.l2.as_double() / kMiB},
        {"memory_GiB", g.memory_capacity.as_double() / kGiB},
        {"memory_GBps", to_GBps(g.memory_bandwidth)},
        {"memory_efficiency", g.memory_efficiency},
        {"host_link_GBps", to_GBps(g.host_link)},
        {"collective_overlap_slowdown", g.collective_overlap_slowdown},
        {"compute", compute},
        {"gemm", gemm},
        {"attention", attention}}},
      {"intra_node",
       {{"fabric", to_string(p.intra_node.kind)},
        {"GBps", to_GBps(p.intra_node.bandwidth)},
        {"latency_us", to_us(p.intra_node.latency)},
        {"nvls", p.intra_node.nvls},
        {"nvls_min_group", p.intra_node.nvls_min_group}}},
      {"inter_node",
       {{"nics_per_node", p.inter_node.nics_per_node},
        {"nic_gbps", to_gbps(p.inter_node.nic_bandwidth)},
        {"latency_us", to_us(p.inter_node.latency)}}},
      {"provenance", p.provenance},
  };
  if (p.inter_node.collective_sms > 0)
    j["inter_node"]["collective_sms"] = p.inter_node.collective_sms;
  auto registered = [](const RegisteredCollectiveSms& r) {
    return nlohmann::json{{"all_gather", r.all_gather}, {"reduce_scatter", r.reduce_scatter}};
  };
  if (p.intra_node.registered_collective_sms != RegisteredCollectiveSms{})
    j["intra_node"]["registered_collective_sms"] =
        registered(p.intra_node.registered_collective_sms);
  if (p.inter_node.registered_collective_sms != RegisteredCollectiveSms{})
    j["inter_node"]["registered_collective_sms"] =
        registered(p.inter_node.registered_collective_sms);
  if (p.gpu.clock_spread > 0) j["gpu"]["clock_spread"] = p.gpu.clock_spread;
  if (p.wan) j["wan"] = wan_to_json(*p.wan);
  if (p.host_op > Time::zero()) j["host"] = {{"op_us", to_us(p.host_op)}};
  nlohmann::json colls = nlohmann::json::array();
  for (const CollectiveFigure& f : p.collectives) {
    nlohmann::json c = {{"scope", to_string(f.scope)},
                        {"op", to_string(f.op)},
                        {"alpha_us", to_us(f.alpha)},
                        {"busbw_GBps", rows_json(f.busbw)}};
    if (!f.size_scale.empty()) c["size_scale"] = curve_json(f.size_scale);
    if (!f.busbw_without_nvls.empty())
      c["busbw_without_nvls_GBps"] = rows_json(f.busbw_without_nvls);
    if (!f.size_scale_without_nvls.empty())
      c["size_scale_without_nvls"] = curve_json(f.size_scale_without_nvls);
    colls.push_back(std::move(c));
  }
  j["collectives"] = colls;
  return j;
}

Result<SystemProfile> parse_profile_text(std::string_view text, std::string_view source) {
  Result<nlohmann::json> j = parse_json(text, source);
  if (!j) return j.status();
  Result<SystemProfile> p = parse_profile(*j, "");
  if (!p) return p.status().with_context(source);
  return p;
}

std::string profile_to_json_text(const SystemProfile& p) {
  return profile_to_json(p).dump(2);
}

Result<SystemProfile> load_profile(std::string_view name_or_path, std::string_view base_dir) {
  for (const EmbeddedFile& f : detail::builtin_profile_files())
    if (f.name == name_or_path)
      return parse_profile_text(f.text, fmt::format("built-in profile {}", f.name));
  std::filesystem::path file(name_or_path);
  if (file.is_relative() && !base_dir.empty()) file = std::filesystem::path(base_dir) / file;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    return Status::not_found(fmt::format("unknown profile \"{}\" (built-ins: {}) and no such file",
                                         name_or_path, fmt::join(builtin_profile_names(), ", ")));
  }
  Result<nlohmann::json> j = read_json_file(file.string());
  if (!j) return j.status();
  Result<SystemProfile> p = parse_profile(*j, "");
  if (!p) return p.status().with_context(file.string());
  return p;
}

}  // namespace hetpar::hardware
