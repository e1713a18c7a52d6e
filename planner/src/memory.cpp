#include "hetpar/planner/memory.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "hetpar/core/check.h"
#include "hetpar/models/op_graph.h"
#include "hetpar/planner/boundary.h"
#include "hetpar/planner/deepep.h"
#include "hetpar/planner/schedule.h"

namespace hetpar::planner {

Bytes MemoryBreakdown::total() const {
  return weights + gradients + optimizer_state + activations + communication_buffers + workspace;
}

double in_flight_micro_batches(Schedule sch, int stage, int pp, int vpp, int64_t m,
                               int extra_warmup, int64_t group) {
  if (group == 0) group = pp;
  HETPAR_CHECK(0 <= stage && stage < pp && vpp >= 1 && m >= 1, "stage {} of {}, vpp {}, m {}",
               stage, pp, vpp, m);
  switch (sch) {
    case Schedule::kGpipe:
      return static_cast<double>(m);
    case Schedule::k1F1B:
    case Schedule::kZeroBubble:
      return static_cast<double>(std::min<int64_t>(pp - stage, m));
    case Schedule::kInterleaved: {
      const int64_t chunks = m * vpp;
      const int64_t warmup =
          m == pp && group == pp ? chunks : 2 * (pp - stage - 1) + (vpp - 1) * group + extra_warmup;
      return static_cast<double>(std::min(warmup + 1, chunks)) / vpp;
    }
  }
  return 0;
}

int gradient_bytes(hardware::Precision p, GradReduceDtype d) {
  switch (d) {
    case GradReduceDtype::kDefault:
      return p == hardware::Precision::kFp16 ? 2 : 4;
    case GradReduceDtype::kFp32:
      return 4;
    case GradReduceDtype::kBf16:
    case GradReduceDtype::kFp16:
      return 2;
  }
  return 4;
}

bool is_fp8_linear(const models::Op& op) {
  return op.kind == models::OpKind::kGemm && op.layer >= 0 && op.name != "router";
}

double held_weight_bytes(double params, double fp8_params, hardware::Precision p, const Layout& l) {
  const double wb = weight_bytes(p);
  return params * wb - (l.fp8_param_gather ? fp8_params * (wb - 1) : 0);
}

int weight_bytes(hardware::Precision p) {
  return p == hardware::Precision::kFp32 || p == hardware::Precision::kTf32 ? 4 : 2;
}

namespace {

// What one rank of a stage accumulates, before the conversion to bytes.
struct Tally {
  double params = 0;            // local parameters
  double optimizer_params = 0;  // local parameters over their optimizer shard count
  double activations = 0;       // bytes held across micro-batches
  double working_set = 0;       // bytes a recomputed layer re-materialises (one at a time)
  double p2p = 0;               // pipeline send and receive buffers
  double gathered = 0;          // the largest SP all-gather of a layer input
  double frozen_params = 0;     // of params: frozen (no gradient)
  double unit_params = 0;       // FSDP: the largest block's local parameters (one gathered unit)
  double sharded_params = 0;    // FSDP: local parameters over their shard group (dp x cp,
                                // routed experts dp x cp / ep), as the optimizer state's
  double sharded_frozen = 0;    // of sharded_params: frozen
  double fp8_params = 0;        // of params: TE Linear weights (held in FP8 with
  double sharded_fp8 = 0;       // Layout::fp8_param_gather); of sharded_params the same
  double unit_bytes = 0;        // FSDP: the largest block's local weights, in bytes as held
  double layer_unit_bytes = 0;  // FSDP: the same of the layers only
  double end_unit_bytes[2]{};   // FSDP: the weights of the blocks before / after the layers
};

Bytes to_bytes(double b) {
  return Bytes(std::llround(b));
}

// Parameters of `op` one rank holds. `stem`: an encoder op ahead of its layers (patch
// embedding, audio convolutions), run on full tensors. `vocab_params`: the LLM's token table.
double local_params(const models::Op& op, const OpNameTraits& t, bool stem, const Layout& l,
                    double vocab_params) {
  const double all = static_cast<double>(op.params);
  // (A multi-token-prediction depth's lookup owns none: it shares the table.)
  if (op.kind == models::OpKind::kEmbedding && op.params > 0)
    return all - vocab_params + vocab_params / l.tp;
  if (op.kind != models::OpKind::kGemm || t.router || stem) return all;
  return all / (t.routed_expert ? l.expert_tp() * l.ep : l.tp);
}

// Share of op's saved activations one rank keeps: CP splits every token; TP splits the
// tensors inside its region (heads, MLP width, vocabulary), and with SP the rest too, except
// encoder stems, the routed experts' first GEMM, whose input is the permuted tokens of the
// whole TP group (cost_model.cpp: gathered after the EP all-to-all), and the overlapped
// shared experts' first (Layout::moe_shared_expert_overlap: a Linear without parallel mode
// saves the input Megatron's mapping gathered).
double activation_share(const models::Op& op, const OpNameTraits& t, bool stem, const Layout& l) {
  const bool gathered_experts =
      (t.routed_fc1 && l.expert_tp() > 1) ||
      (l.overlaps_shared_experts() && op.layer >= 0 && t.shared_expert_fc1);
  const int tp = !stem && !gathered_experts && (l.sequence_parallel || t.inside_tp) ? l.tp : 1;
  return 1.0 / (static_cast<double>(tp) * l.cp);
}

// Share of a GEMM's saved input one rank keeps in memory under the workload precision:
// Transformer Engine's FP8 Linear modules (the layers' GEMMs except the MoE router, which is
// not a TE module) save the FP8 transpose of their input for the weight gradient, 1 byte per
// element instead of the 16-bit input (transformer_engine/pytorch/module/linear.py,
// layernorm_linear.py: ctx.save_for_backward(inputmat_t if fp8_wgrad ...)). The output
// layer is Megatron's own ColumnParallelLinear and keeps its bf16 input.
double precision_share(const OpNameTraits& t, hardware::Precision p, int dtype_bytes) {
  return p == hardware::Precision::kFp8 && t.fp8_linear ? 1.0 / dtype_bytes : 1.0;
}

// Model chunk of each layer: pp * vpp chunks of consecutive layers, as the layout splits
// them (layers_per_virtual_stage); when it cannot, the first chunks take one more layer.
std::vector<int> layer_chunks(int64_t layers, const Layout& l) {
  const int64_t chunks = int64_t{l.pp} * l.vpp, q = layers / chunks, r = layers % chunks;
  std::vector<int64_t> split = layers_per_virtual_stage(l, layers, nullptr);
  if (split.empty())
    for (int64_t c = 0; c < chunks; ++c) split.push_back(q + (c < r ? 1 : 0));
  std::vector<int> out;
  out.reserve(static_cast<size_t>(layers));
  for (int64_t c = 0; c < chunks; ++c)
    out.insert(out.end(), static_cast<size_t>(split[c]), static_cast<int>(c));
  return out;
}

// Stage of each layer: chunk c is on stage c % pp.
std::vector<int> layer_stages(int64_t layers, const Layout& l) {
  std::vector<int> out = layer_chunks(layers, l);
  for (int& c : out) c %= l.pp;
  return out;
}

class Estimator {
 public:
  Estimator(const Scenario& s, const Plan& p, const MemoryOptions& opts)
      : Estimator(s, p.layout, p.schedule, opts, {}, false) {
    plan_layout_ = true;
  }
  // `in_flight` >= 0: the micro-batches the (single-stage) module holds instead of the
  // schedule's count. `frozen`: no gradients, optimizer state or saved activations.
  Estimator(const Scenario& s, const Layout& l, Schedule sch, const MemoryOptions& opts,
            const std::vector<double>& in_flight, bool frozen)
      : s_(s), l_(l), opts_(opts), frozen_(frozen), stages_(static_cast<size_t>(l_.pp)) {
    const int64_t m = num_micro_batches(l_, s.workload.global_batch);
    HETPAR_CHECK(m >= 1, "global batch {} gives no micro-batch to dp {} x micro-batch {}",
                 s.workload.global_batch, l_.dp, l_.micro_batch);
    for (int st = 0; st < l_.pp; ++st) {
      // Layout::ep_comm_overlap: the interleaved schedule's extra warm-up forward holds one
      // more chunk; merged passes hold what they held (the backward frees a layer as the
      // forward fills one).
      in_flight_.push_back(!in_flight.empty()
                               ? in_flight[static_cast<size_t>(st)]
                               : in_flight_micro_batches(sch, st, l_.pp, l_.vpp, m,
                                                         extra_warmup(l_), microbatch_group(l_)));
      // ZB-H1's stage st defers up to st weight-gradient passes past their B: up to
      // min(pp, m) micro-batches in flight on every stage, the extra ones holding only the
      // GEMM inputs W needs.
      w_pending_.push_back(sch == Schedule::kZeroBubble && in_flight.empty()
                               ? static_cast<double>(std::min<int64_t>(l_.pp, m)) - in_flight_[st]
                               : 0);
    }
    // The output layer and loss live in the last model chunk, which behaves as the last
    // stage of a pipeline without virtual stages.
    head_in_flight_ = in_flight_micro_batches(sch, l_.pp - 1, l_.pp, 1, m);
    // Layout::defer_embedding_wgrad: the micro-batches whose output-layer wgrad waits for the
    // pipeline's flush.
    deferred_wgrads_ = !l_.defer_embedding_wgrad ? 0
                       : l_.wgrad_deferral_limit > 0
                           ? static_cast<double>(std::min<int64_t>(l_.wgrad_deferral_limit, m))
                           : static_cast<double>(m);
  }

  void add_module(size_t i) {
    const models::ModuleSpec& spec = s_.model.modules[i].spec;
    const models::ModuleKind kind = models::kind_of(spec);
    const ModuleGraphCache::WithTraits c =
        (opts_.graphs ? *opts_.graphs : own_graphs_).get_with_traits(s_, i, l_, ExpertLoad::kMean);
    const models::OpGraph& g = c.graph;
    const std::span<const OpNameTraits> traits = c.traits;
    const auto* llm = std::get_if<models::LlmSpec>(&spec);
    const double vocab_params =
        llm ? static_cast<double>(llm->vocab) * static_cast<double>(llm->block.hidden) : 0;
    // An encoder's own pipeline (non-colocated, pp > 1, lower.cpp): its layers split over
    // its stages, its last norm and its projectors on the last one.
    const bool encoder = models::is_encoder(kind) && !plan_layout_;
    const int last = l_.pp - 1;
    // The layers' stages; multi-token-prediction layers (after them) on the last.
    const int64_t layers = g.layers + g.mtp_layers;
    std::vector<int> stage_of = llm || encoder ? layer_stages(g.layers, l_)
                                               : std::vector<int>(static_cast<size_t>(g.layers), 0);
    stage_of.resize(static_cast<size_t>(layers), last);
    const int home = plan_layout_ ? 0 : last;  // an encoder's own projector: its last stage

    std::vector<double> rework(static_cast<size_t>(layers));  // one micro-batch, per layer
    // FSDP units: each layer, the ops before the layers, the ops after them.
    std::vector<double> unit(static_cast<size_t>(layers) + 2), unit_bytes(unit.size());
    bool before_layers = true;
    std::vector<bool> dispatches(stages_.size());  // stages holding a MoE layer's dispatch
    for (size_t oi = 0; oi < g.ops.size(); ++oi) {
      const models::Op& op = g.ops[oi];
      const OpNameTraits& tr = traits[oi];
      if (op.layer >= 0) before_layers = false;
      if (op.layer >= 0 && tr.moe_dispatch)
        dispatches[static_cast<size_t>(stage_of[op.layer])] = true;
      const bool head = (llm || encoder) && op.layer < 0 && !before_layers;
      const bool stem = before_layers && models::is_encoder(kind);
      const int st = op.layer >= 0 ? stage_of[op.layer] : head ? last : home;
      const double params = local_params(op, tr, stem, l_, vocab_params);
      const bool fp8 = tr.fp8_linear;
      add_params(st, params, tr.routed_expert, fp8);
      const size_t u = op.layer >= 0 ? static_cast<size_t>(op.layer) + 2 : before_layers ? 0 : 1;
      unit[u] += params;
      const double bytes = held_weight_bytes(params, fp8 ? params : 0, s_.workload.precision, l_);
      unit_bytes[u] += bytes;
      Tally& t = stages_[st];
      t.unit_params = std::max(t.unit_params, unit[u]);
      t.unit_bytes = std::max(t.unit_bytes, unit_bytes[u]);
      if (u < 2)
        t.end_unit_bytes[u] += bytes;
      else
        t.layer_unit_bytes = std::max(t.layer_unit_bytes, unit_bytes[u]);
      // Transformer Engine's cross-entropy keeps the logits' own tensor (the gradient written
      // into it), a compiled one the logits and per-row statistics, where Megatron's keep an
      // fp32 copy (op.saved counts 4 bytes per logit).
      const bool keeps_logits = l_.cross_entropy_fusion == CrossEntropy::kTe ||
                                l_.cross_entropy_fusion == CrossEntropy::kCompiled;
      const double loss_share =
          op.kind == models::OpKind::kLoss && keeps_logits ? g.dtype_bytes / 4.0 : 1.0;
      const double share = activation_share(op, tr, stem, l_) *
                           precision_share(tr, s_.workload.precision, g.dtype_bytes) * loss_share;
      // selective_op keeps outputs, which FP8 does not shrink (precision_share is the FP8
      // input copy Transformer Engine keeps).
      const double kept_share = l_.recompute == models::Recompute::kSelectiveOp && op.layer >= 0
                                    ? activation_share(op, tr, stem, l_)
                                    : share;
      const double kept =
          frozen_ ? 0 : models::kept_bytes(op, l_.recompute_policy(), g.dtype_bytes) * kept_share;
      stages_[st].activations += kept * (head ? head_in_flight_ : in_flight_[st]);
      if (op.kind == models::OpKind::kGemm)
        stages_[st].activations += op.saved.as_double() * share * w_pending_[st];
      if (op.layer >= 0 && !frozen_) rework[op.layer] += op.saved.as_double() * share - kept;
    }
    // The last stage's copy of the token table: for a tied output layer, or for the
    // multi-token-prediction depths' embeddings (Megatron-Core builds the embedding there).
    if (llm && (llm->tied_embeddings || llm->mtp_layers > 0) && l_.pp > 1)
      add_params(last, vocab_params / l_.tp, false, false);
    // Deferred output-layer wgrads (Layout::defer_embedding_wgrad): the last stage keeps each
    // deferred micro-batch's logits gradient (tokens x vocab / tp) and the output layer's
    // input (its SP slice) until the flush (Megatron-Core's grad_output_buffer and
    // embedding_activation_buffer).
    if (llm && deferred_wgrads_ > 0 && !frozen_)
      stages_[last].activations +=
          deferred_wgrads_ * static_cast<double>(g.layer_tokens) / l_.cp * g.dtype_bytes *
          (static_cast<double>(llm->vocab) / l_.tp +
           static_cast<double>(g.hidden) / (l_.sequence_parallel ? l_.tp : 1));

    // A layer's input s*b*h on one CP rank; where stored for backward, SP splits it by TP.
    const double layer_input =
        static_cast<double>(g.layer_tokens) * g.hidden * g.dtype_bytes / l_.cp;
    const double sp = l_.sequence_parallel ? l_.tp : 1;
    // Full recompute beside the EP overlap re-runs a whole model chunk before its backward
    // (lower.cpp): the working set is the chunk's layers together.
    const bool chunk_replay =
        l_.recompute == models::Recompute::kFull && l_.ep_comm_overlap && (llm || encoder);
    std::vector<int> chunk_of = chunk_replay ? layer_chunks(g.layers, l_) : std::vector<int>();
    if (chunk_replay) chunk_of.resize(static_cast<size_t>(layers), l_.pp * l_.vpp - 1);
    std::vector<double> chunk_rework(chunk_replay ? static_cast<size_t>(l_.pp) * l_.vpp : 0);
    for (int64_t layer = 0; layer < layers; ++layer) {
      Tally& t = stages_[stage_of[layer]];
      // A multi-token-prediction depth checkpoints its two inputs (hidden states and the
      // next token's embedding).
      const double inputs = layer < g.layers ? 1 : 2;
      if (models::keeps_layer_input(l_.recompute) && !frozen_)
        t.activations += inputs * layer_input / sp * in_flight_[stage_of[layer]];
      const double set = chunk_replay
                             ? chunk_rework[static_cast<size_t>(chunk_of[layer])] += rework[layer]
                             : rework[layer];
      t.working_set = std::max(t.working_set, set);
      if (l_.sequence_parallel && l_.tp > 1) t.gathered = std::max(t.gathered, layer_input);
    }
    if ((llm || encoder) && l_.pp > 1)
      for (Tally& t : stages_) t.p2p = 2 * layer_input / sp;
    // Userbuffers (Layout::tp_comm_overlap): Transformer Engine's initialize_ub registers a
    // communication buffer of the layer's (s·b, h) for each of its ten overlap names (qkv,
    // proj, fc1, fc2 forward; proj, fc2 dgrad; qkv, fc1 dgrad and wgrad), allocated once.
    // An allowance at the activations' dtype, per CP rank's tokens.
    if (l_.tp_comm_overlap && l_.sequence_parallel && l_.tp > 1 && g.layers > 0 &&
        (llm || models::is_encoder(kind)))
      for (Tally& t : stages_) t.p2p += 10 * layer_input;
    // Layout::moe_dispatcher deepep / hybridep: the one buffer of every rank with a MoE
    // layer, allocated at its first dispatch (Megatron-Core's fused_a2a.get_buffer,
    // init_hybrid_ep_buffer) and kept. HybridEP's is sized by the tokens a rank dispatches
    // (its SP and CP share of a micro-batch) over the group's nodes, whose ranks per NVLink
    // domain are the group's own inside a node and kDeepEpNvlPeers across nodes (infeasibility
    // takes whole nodes of that many).
    double dispatcher_buffer = 0;
    if (llm && l_.ep > 1 && l_.moe_dispatcher == MoeDispatcher::kDeepEp && deepep_supports(l_.ep))
      dispatcher_buffer = deepep_buffer_bytes(l_.ep, g.hidden).as_double();
    if (llm && llm->moe && l_.ep > 1 && l_.moe_dispatcher == MoeDispatcher::kHybridEp) {
      const int64_t ranks_per_node = std::min(l_.ep, kDeepEpNvlPeers);
      dispatcher_buffer =
          hybridep_buffer_bytes(
              std::max<int64_t>(g.layer_tokens / (l_.cp * static_cast<int64_t>(sp)), 1), g.hidden,
              std::max<int64_t>(llm->moe->experts / l_.ep, 1), ranks_per_node,
              l_.ep / ranks_per_node)
              .as_double();
    }
    for (size_t st = 0; st < stages_.size(); ++st)
      if (dispatches[st]) stages_[st].p2p += dispatcher_buffer;
  }

  // Adds `bytes` held by every rank of stage `st` (communication buffers).
  void add_buffer(int st, double bytes) { stages_[st].p2p += bytes; }
  void merge_into_all(const Estimator& o) {  // colocated: o's (single-stage) ranks are all ours
    for (Tally& t : stages_) {
      const Tally& u = o.stages_[0];
      t.params += u.params;
      t.optimizer_params += u.optimizer_params;
      t.activations += u.activations;
      t.working_set = std::max(t.working_set, u.working_set);
      t.p2p += u.p2p;
      t.gathered = std::max(t.gathered, u.gathered);
      t.frozen_params += u.frozen_params;
      t.unit_params = std::max(t.unit_params, u.unit_params);
      t.sharded_params += u.sharded_params;
      t.sharded_frozen += u.sharded_frozen;
      t.fp8_params += u.fp8_params;
      t.sharded_fp8 += u.sharded_fp8;
      t.unit_bytes = std::max(t.unit_bytes, u.unit_bytes);
      t.layer_unit_bytes = std::max(t.layer_unit_bytes, u.layer_unit_bytes);
      for (int e = 0; e < 2; ++e) t.end_unit_bytes[e] += u.end_unit_bytes[e];
    }
  }

  // `first_rank`: where the module's ranks start (stage st holds the tp·cp·dp ranks from
  // first_rank + st·tp·cp·dp), for the device memory of each stage's GPUs.
  MemoryReport report(int first_rank = 0) const {
    const bool fp32 = s_.workload.precision == hardware::Precision::kFp32 ||
                      s_.workload.precision == hardware::Precision::kTf32;
    const double optimizer_bytes = fp32 ? 8 : 12;
    const double grad_bytes = gradient_bytes(s_.workload.precision, l_.grad_reduce_dtype);
    MemoryReport r;
    auto held = [&](double params, double fp8) {
      return held_weight_bytes(params, fp8, s_.workload.precision, l_);
    };
    for (const Tally& t : stages_) {
      MemoryBreakdown b;
      b.weights = to_bytes(held(t.params, t.fp8_params));
      b.gradients = to_bytes((t.params - t.frozen_params) * grad_bytes);
      if (l_.fsdp) {
        // This rank's shards, plus what is gathered: resharded after the forward, the
        // running block and the one prefetched; else every block of the stage, held from
        // its forward to its backward. FSDP2 keeps [final norm, output] gathered from their
        // forward to their backward, and with its root unit the blocks before the layers and
        // the last layer too, beside two layers. One block's full gradient before its
        // reduce-scatter.
        const double stage = held(t.params, t.fp8_params);
        double gathered = stage;
        if (l_.fsdp_reshard_after_forward && l_.torch_fsdp2()) {
          const double kept = t.end_unit_bytes[1] +
                              (l_.fsdp_root_unit ? t.end_unit_bytes[0] + t.layer_unit_bytes : 0);
          gathered = std::min(kept + 2 * t.layer_unit_bytes, stage);
        } else if (l_.fsdp_reshard_after_forward) {
          gathered = std::min(2 * t.unit_bytes, stage);
        }
        b.weights = to_bytes(held(t.sharded_params, t.sharded_fp8) + gathered);
        b.gradients = to_bytes((t.sharded_params - t.sharded_frozen + t.unit_params) * grad_bytes);
      }
      b.optimizer_state = to_bytes(t.optimizer_params * optimizer_bytes);
      b.activations = to_bytes(t.activations + t.working_set);
      b.communication_buffers = to_bytes(t.p2p + t.gathered);
      b.workspace =
          opts_.fixed_workspace + to_bytes(opts_.fragmentation * b.activations.as_double());
      r.per_stage.push_back(b);
    }
    const int n = l_.tp * l_.cp * l_.dp;
    for (int st = 0; st < static_cast<int>(r.per_stage.size()); ++st) {
      Bytes cap;
      const hardware::ClusterSpec::GroupRange on =
          s_.cluster.groups_of_gpus(first_rank + st * n, n);
      for (size_t g = on.begin; g < on.end; ++g) {
        const Bytes c = s_.cluster.groups()[g].profile.gpu.memory_capacity;
        if (cap == Bytes() || c < cap) cap = c;
      }
      r.stage_capacity.push_back(cap);
    }
    r.summarise();
    return r;
  }

 private:
  // Routed experts' optimizer state is sharded over their own data-parallel group.
  void add_params(int stage, double params, bool routed_expert, bool fp8_linear) {
    // Routed experts: their expert-DP group (Layout::expert_ranks).
    const double group = routed_expert ? static_cast<double>(l_.expert_ranks()) / l_.ep
                                       : static_cast<double>(l_.dp) * l_.cp;
    stages_[stage].params += params;
    stages_[stage].sharded_params += params / group;
    if (fp8_linear) {
      stages_[stage].fp8_params += params;
      stages_[stage].sharded_fp8 += params / group;
    }
    if (frozen_) {
      stages_[stage].frozen_params += params;
      stages_[stage].sharded_frozen += params / group;
      return;
    }
    stages_[stage].optimizer_params += l_.shards_optimizer_state() ? params / group : params;
  }

  const Scenario& s_;
  const Layout l_;
  const MemoryOptions& opts_;
  ModuleGraphCache own_graphs_;  // where opts_.graphs is null
  const bool frozen_;
  bool plan_layout_ = false;  // the plan's layout (else an encoder's own, its own pipeline)
  std::vector<Tally> stages_;
  std::vector<double> in_flight_;
  std::vector<double> w_pending_;  // ZB-H1 micro-batches holding only their GEMM inputs
  double head_in_flight_ = 0;
  double deferred_wgrads_ = 0;  // micro-batches whose output-layer wgrad is deferred
};

}  // namespace

MemoryReport estimate_memory(const Scenario& s, const Plan& p, const MemoryOptions& opts) {
  if (p.placement == Placement::kHomogeneous) {
    Estimator e(s, p, opts);
    for (size_t i = 0; i < s.model.modules.size(); ++i) e.add_module(i);
    return e.report();
  }
  // Heterogeneous: the LLM under its layout; each encoder (with its projectors) under its
  // own, holding the encoder steps its program (boundary.h) keeps in flight, plus the
  // boundary's buffers: the received (gathered) encoder output of the LLM micro-batches of
  // one encoder step and, non-colocated, the encoder's send buffer.
  const bool colocated = p.placement == Placement::kColocated;
  const Layout& L = p.layout;
  Estimator llm(s, p, opts);
  llm.add_module(s.model.llm_index());
  const std::vector<PipelineOp> llm0 = stage_order(
      p.schedule, 0, L.pp, L.vpp, s.workload.global_batch / (int64_t{L.micro_batch} * L.dp),
      extra_warmup(L), microbatch_group(L));
  const bool frozen = s.workload.frozen_encoders;
  std::vector<MemoryReport> enc_reports;
  for (const ModulePlan& mp : p.modules) {
    const Boundary b = make_boundary(s, p, mp);
    const std::vector<PipelineOp> prog = colocated && L.pp > 1 ? three_phase_program(b, frozen)
                                         : colocated           ? encoder_program(b, llm0, frozen)
                                                     : leading_stage_program(b, llm0, L.pp, frozen);
    // Per encoder stage (non-colocated encoders may be pipelined).
    std::vector<double> in_flight;
    for (int st = 0; st < mp.layout.pp; ++st)
      in_flight.push_back(frozen ? 0
                                 : static_cast<double>(peak_in_flight(
                                       colocated ? prog
                                                 : leading_stage_program(b, llm0, L.pp, frozen,
                                                                         mp.layout.pp, st))));
    Estimator enc(s, mp.layout, Schedule::k1F1B, opts, in_flight, frozen);
    enc.add_module(b.encoder);
    for (const models::Edge& e : s.model.edges)
      if (e.from == b.encoder &&
          models::kind_of(s.model.modules[e.to].spec) == models::ModuleKind::kProjector)
        enc.add_module(e.to);
    const double step = b.bytes_per_micro_batch.as_double() * static_cast<double>(b.llm_per_step);
    // Three-phase: the LLM's first stage holds every micro-batch's encoder output.
    llm.add_buffer(0, colocated && L.pp > 1 ? step * static_cast<double>(b.enc_steps) : step);
    if (colocated) {
      llm.merge_into_all(enc);
    } else {
      enc.add_buffer(mp.layout.pp - 1, step * b.fan_out / static_cast<double>(b.llm_per_step));
      enc_reports.push_back(enc.report(mp.first_rank));
    }
  }
  MemoryReport r = llm.report(colocated ? 0 : p.llm_first_rank);
  if (enc_reports.empty()) return r;
  // Non-colocated: the encoders' ranks first, then the LLM's pipeline stages.
  MemoryReport out;
  enc_reports.push_back(std::move(r));
  for (const MemoryReport& e : enc_reports) {
    out.per_stage.insert(out.per_stage.end(), e.per_stage.begin(), e.per_stage.end());
    out.stage_capacity.insert(out.stage_capacity.end(), e.stage_capacity.begin(),
                              e.stage_capacity.end());
  }
  out.summarise();
  return out;
}

void MemoryReport::summarise() {
  peak = Bytes();
  peak_stage = tightest_stage = 0;
  Bytes worst;  // the tightest stage's total over its capacity
  for (size_t st = 0; st < per_stage.size(); ++st) {
    const Bytes total = per_stage[st].total();
    if (total > peak) {
      peak = total;
      peak_stage = static_cast<int>(st);
    }
    const Bytes over = total - stage_capacity[st];
    if (st == 0 || over > worst) {
      worst = over;
      tightest_stage = static_cast<int>(st);
    }
  }
}

}  // namespace hetpar::planner
