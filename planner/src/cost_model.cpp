#include "hetpar/planner/cost_model.h"

#include <algorithm>

#include "hetpar/core/check.h"

namespace hetpar::planner {

PassCost& PassCost::operator+=(const PassCost& o) {
  forward += o.forward;
  dgrad += o.dgrad;
  wgrad += o.wgrad;
  recompute += o.recompute;
  forward_flops += o.forward_flops;
  dgrad_flops += o.dgrad_flops;
  wgrad_flops += o.wgrad_flops;
  recompute_flops += o.recompute_flops;
  return *this;
}

namespace {

enum class Split { kNone, kColumn, kRow };

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool is_expert(const models::Op& op) {
  return op.name.starts_with("expert_");
}

// How tensor parallelism splits a GEMM (see cost_model.h).
Split gemm_split(const models::Op& op, const models::OpGraph& g) {
  if (g.kind == models::ModuleKind::kProjector) {
    const bool two_layers = std::any_of(g.ops.begin(), g.ops.end(),
                                        [](const models::Op& o) { return o.name == "fc2"; });
    if (!two_layers) return Split::kNone;
  }
  if (op.name == "qkv" || op.name == "logits" || ends_with(op.name, "fc1")) return Split::kColumn;
  if (op.name == "attn_out" || ends_with(op.name, "fc2")) return Split::kRow;
  return Split::kNone;
}

// Whether a pointwise op runs on a tp-sharded tensor.
bool pointwise_tp_sharded(const models::Op& op, const Layout& l, models::ModuleKind kind) {
  if (op.kind == models::OpKind::kLoss || op.name == "rope") return true;
  if (ends_with(op.name, "act") && (op.layer >= 0 || kind == models::ModuleKind::kProjector))
    return true;
  return l.sequence_parallel && (op.layer >= 0 || op.name == "final_norm");
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

PassCost op_cost(const models::Op& op, const models::OpGraph& g, const Layout& l,
                 bool context_parallel, const hardware::DeviceProfile& dev, hardware::Precision p) {
  const int64_t cp = context_parallel ? l.cp : 1;
  PassCost c;
  switch (op.kind) {
    case models::OpKind::kGemm: {
      const Split split = gemm_split(op, g);
      double shard = split == Split::kNone ? 1.0 : l.tp;
      std::vector<models::GemmShape> shapes = op.gemms;
      if (is_expert(op)) {
        // E / ep local experts share the tokens the ep group routes to them.
        int64_t rows = 0, experts = 0;
        for (const auto& s : shapes) {
          rows += s.m * s.batch;
          experts += s.batch;
        }
        shapes = {{ceil_div(rows, experts) * l.ep, shapes[0].n, shapes[0].k, experts / l.ep}};
        shard *= l.ep;
      }
      for (models::GemmShape s : shapes) {
        s.m = ceil_div(s.m, cp);
        if (split == Split::kColumn) s.n = ceil_div(s.n, l.tp);
        if (split == Split::kRow) s.k = ceil_div(s.k, l.tp);
        c.forward += dev.gemm_time(s.m, s.n, s.k, s.batch, p);
        c.dgrad += dev.gemm_time(s.m, s.k, s.n, s.batch, p);
        c.wgrad += dev.gemm_time(s.k, s.n, s.m, s.batch, p);
      }
      const double per_rank = shard * static_cast<double>(cp);
      c.forward_flops = op.forward / per_rank;
      c.dgrad_flops = op.dgrad / per_rank;
      c.wgrad_flops = op.wgrad / per_rank;
      break;
    }
    case models::OpKind::kAttention: {
      const double per_rank = static_cast<double>(l.tp * cp);
      c.forward_flops = op.forward / per_rank;
      c.dgrad_flops = op.dgrad / per_rank;
      c.forward = dev.attention_time(c.forward_flops, p, false);
      c.dgrad = dev.attention_time(c.dgrad_flops, p, true);
      if (op.saved > op.read) {  // no flash attention: the score matrix goes through HBM
        const Bytes traffic = (op.read + op.written) / static_cast<int64_t>(per_rank);
        c.forward += dev.memory_time(traffic);
        c.dgrad += dev.memory_time(traffic * 2);
      }
      break;
    }
    default: {
      int64_t shard = cp;
      if (pointwise_tp_sharded(op, l, g.kind)) shard *= l.tp;
      const Bytes traffic = (op.read + op.written) / shard;
      c.forward = dev.memory_time(traffic);
      (op.kind == models::OpKind::kEmbedding ? c.wgrad : c.dgrad) = dev.memory_time(traffic * 2);
      break;
    }
  }
  if (l.recompute == models::Recompute::kSelective && models::is_recomputed(op, l.recompute)) {
    c.recompute = c.forward;
    c.recompute_flops = c.forward_flops;
  }
  return c;
}

namespace {

class BlockBuilder {
 public:
  explicit BlockBuilder(Block& b) : b_(b) {}
  void compute(const PassCost& c) {
    if (b_.steps.empty() || b_.steps.back().kind != StepKind::kCompute)
      b_.steps.push_back({StepKind::kCompute, {}, {}});
    b_.steps.back().cost += c;
  }
  void comm(StepKind kind, Bytes bytes, const PassCost& cost = {}) {
    b_.steps.push_back({kind, cost, bytes});
  }

 private:
  Block& b_;
};

int64_t local_params(const models::Op& op, const models::OpGraph& g, const Layout& l) {
  if (op.kind == models::OpKind::kEmbedding) return op.params / l.tp;  // vocab-parallel
  if (op.kind != models::OpKind::kGemm || gemm_split(op, g) == Split::kNone) return op.params;
  return op.params / l.tp / (is_expert(op) ? l.ep : 1);
}

}  // namespace

ModuleCost module_cost(const models::OpGraph& g, const Layout& l, bool context_parallel,
                       const hardware::DeviceProfile& dev, hardware::Precision p) {
  const int64_t cp = context_parallel ? l.cp : 1;
  ModuleCost m;
  m.layers = g.layers;
  // Tokens a module's activations span: layers see layer_tokens; a projector its output.
  int64_t tokens = g.layer_tokens;
  if (g.kind == models::ModuleKind::kProjector) {
    const models::Op& last = g.ops.back();
    tokens = last.gemms.front().m * last.gemms.front().batch;
  }
  const Bytes activation = Bytes(tokens / cp * g.hidden * g.dtype_bytes);
  m.boundary_bytes = activation;
  const bool tp = l.tp > 1;

  bool seen_layer = false;
  for (const models::Op& op : g.ops) {
    if (op.layer > 0) continue;  // every layer is alike: build layer 0 only
    if (op.layer == 0) seen_layer = true;
    Block& block = op.layer == 0 ? m.layer : (seen_layer ? m.post : m.pre);
    BlockBuilder b(block);
    const bool expert = op.kind == models::OpKind::kGemm && is_expert(op);
    (expert ? block.expert_params : block.dense_params) += local_params(op, g, l);

    if (tp && (op.name == "attn_residual" || op.name == "mlp_residual"))
      b.comm(StepKind::kTpExit, activation);
    if (tp && op.name == "logits") b.comm(StepKind::kTpEntry, activation);
    if (l.ep > 1 && op.name == "moe_combine") {
      const int64_t routed = tokens / cp / (l.sequence_parallel ? l.tp : 1) *
                             static_cast<int64_t>(op.read.count() / op.written.count());
      b.comm(StepKind::kEpAllToAll, Bytes(routed * g.hidden * g.dtype_bytes));
    }

    const PassCost c = op_cost(op, g, l, context_parallel, dev, p);
    if (op.kind == models::OpKind::kAttention && cp > 1) {
      const auto& s = *op.attention;
      const int64_t kv = 2 * (s.batch * s.seq_q / cp) * (s.kv_heads / l.tp) * s.head_dim;
      b.comm(StepKind::kCpAttention, Bytes(kv * g.dtype_bytes), c);
    } else {
      b.compute(c);
    }

    if (tp && (op.name == "attn_norm" || op.name == "mlp_norm"))
      b.comm(StepKind::kTpEntry, activation);
    if (tp && op.kind == models::OpKind::kEmbedding) b.comm(StepKind::kTpExit, activation);
    if (tp && g.kind == models::ModuleKind::kProjector && op.name == "fc2")
      b.comm(StepKind::kTpExit, activation);
    if (l.ep > 1 && op.name == "moe_dispatch") {
      const int64_t routed = tokens / cp / (l.sequence_parallel ? l.tp : 1) *
                             static_cast<int64_t>(op.written.count() / op.read.count());
      b.comm(StepKind::kEpAllToAll, Bytes(routed * g.hidden * g.dtype_bytes));
    }
  }
  HETPAR_CHECK(m.layers == 0 || seen_layer, "module graph without its layer 0");
  return m;
}

}  // namespace hetpar::planner
