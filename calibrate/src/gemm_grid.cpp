#include "hetpar/calibrate/gemm_grid.h"

#include <algorithm>
#include <cmath>

#include "hetpar/core/check.h"
#include "hetpar/models/load.h"
#include "hetpar/models/op_graph.h"

namespace hetpar::calibrate {

namespace {

constexpr int64_t kLlmTokens = 4096;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

void add_passes(std::vector<GemmDims>& out, int64_t m, int64_t n, int64_t k) {
  out.push_back({m, n, k});  // forward
  out.push_back({m, k, n});  // dgrad
  out.push_back({k, n, m});  // wgrad
}

}  // namespace

int64_t round_pow2(int64_t v) {
  HETPAR_CHECK(v >= 1);
  return int64_t{1} << static_cast<int>(std::lround(std::log2(static_cast<double>(v))));
}

std::vector<GemmDims> zoo_gemm_shapes(int max_tp) {
  std::vector<GemmDims> out;
  for (const models::ZooEntry& e : models::zoo_entries()) {
    if (e.kind != "model" && e.kind != "llm") continue;
    Result<models::ModelSpec> model = models::load_zoo_model(e.name);
    HETPAR_CHECK(model.is_ok(), "zoo model {}: {}", e.name, model.status().message());
    models::ModuleInput in;
    in.seq_len = kLlmTokens;
    for (size_t i = 0; i < model->modules.size(); ++i) {
      const models::OpGraph g =
          models::build_op_graph(model->modules[i].spec, models::module_input(*model, i, in));
      for (const models::Op& op : g.ops) {
        if (op.kind != models::OpKind::kGemm) continue;
        for (const models::GemmShape& s : op.gemms) {
          for (int tp = 1; tp <= max_tp; tp *= 2) {
            add_passes(out, s.m, ceil_div(s.n, tp), s.k);
            if (tp > 1) add_passes(out, s.m, s.n, ceil_div(s.k, tp));
          }
        }
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<GemmDims> zoo_gemm_grid(int64_t max_dim, int max_tp) {
  std::vector<GemmDims> out;
  auto cap = [&](int64_t v) { return max_dim > 0 ? std::min(v, max_dim) : v; };
  for (const GemmDims& d : zoo_gemm_shapes(max_tp))
    out.push_back({cap(round_pow2(d.m)), cap(round_pow2(d.n)), cap(round_pow2(d.k))});
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace hetpar::calibrate
