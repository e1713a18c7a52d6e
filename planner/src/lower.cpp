#include "hetpar/planner/lower.h"

#include "lowering.h"

namespace hetpar::planner {

OptimizerTraffic optimizer_traffic(const Layout& l, hardware::Precision p) {
  constexpr int64_t kAdam = 28, kNorm = 4;
  if (l.torch_fsdp2()) return {kNorm + 8 + kAdam, 0};
  const int64_t gb = gradient_bytes(p, l.grad_reduce_dtype);
  if (p == hardware::Precision::kFp32 || p == hardware::Precision::kTf32)
    return {kNorm + kAdam, gb};
  int64_t owned = kNorm + kAdam + 4 + weight_bytes(p);
  if (gb != 4) owned += gb + 4;                     // main grads cast to fp32
  if (p == hardware::Precision::kFp16) owned += 8;  // unscale and inf check
  // FSDP's gradient buffer is the shard itself.
  return l.fsdp ? OptimizerTraffic{owned + gb, 0} : OptimizerTraffic{owned, gb};
}

namespace lowering {

Block for_direction(const Block& b, bool backward, bool sp) {
  Block out = b;
  out.steps.clear();
  for (const WorkStep& s : b.steps) {
    if (!sp && s.kind == (backward ? StepKind::kTpExit : StepKind::kTpEntry)) continue;
    // Backward keeps a linear that overlaps its TP entry's collective a task of its own;
    // both directions a ring-exchange linear (userbuffers).
    const bool after_ring = !out.steps.empty() && out.steps.back().ring_exchange;
    const bool apart =
        s.ring_exchange || after_ring ||
        (!out.steps.empty() && out.steps.back().beside_all_to_all != s.beside_all_to_all) ||
        (backward &&
         (s.overlaps_tp_entry || (!out.steps.empty() && out.steps.back().overlaps_tp_entry)));
    if (s.kind == StepKind::kCompute && !out.steps.empty() &&
        out.steps.back().kind == StepKind::kCompute && !apart) {
      out.steps.back().cost += s.cost;
      out.steps.back().ops.insert(out.steps.back().ops.end(), s.ops.begin(), s.ops.end());
    } else
      out.steps.push_back(s);
  }
  // Backward runs the list from its end: a run beside an all-to-all goes before it.
  if (backward)
    for (size_t i = 0; i + 1 < out.steps.size(); ++i)
      if (out.steps[i].kind == StepKind::kEpAllToAll && out.steps[i + 1].beside_all_to_all) {
        size_t end = i + 1;
        while (end < out.steps.size() && out.steps[end].beside_all_to_all) ++end;
        std::rotate(out.steps.begin() + static_cast<std::ptrdiff_t>(i),
                    out.steps.begin() + static_cast<std::ptrdiff_t>(i + 1),
                    out.steps.begin() + static_cast<std::ptrdiff_t>(end));
        i = end - 1;
      }
  return out;
}

ModuleCost for_direction(const ModuleCost& m, bool backward, bool sp) {
  ModuleCost out = m;
  out.pre = for_direction(m.pre, backward, sp);
  out.layer = for_direction(m.layer, backward, sp);
  out.dense_layer = for_direction(m.dense_layer, backward, sp);
  out.window_layer = for_direction(m.window_layer, backward, sp);
  out.window_dense_layer = for_direction(m.window_dense_layer, backward, sp);
  out.mtp = for_direction(m.mtp, backward, sp);
  out.post = for_direction(m.post, backward, sp);
  return out;
}

std::vector<int> owners(const Layout& l, const Reduction& r) {
  const int block = l.tp * l.cp;
  std::vector<int> first_of_class;
  std::vector<int> rep(static_cast<size_t>(l.dp));
  for (int d = 0; d < l.dp; ++d) {
    const int c = r.replica_class[static_cast<size_t>(d)];
    if (c >= static_cast<int>(first_of_class.size())) first_of_class.resize(c + 1, -1);
    if (first_of_class[c] < 0) first_of_class[c] = d;
    rep[d] = first_of_class[c];
  }
  std::vector<int> out(static_cast<size_t>(block) * l.dp);
  for (int j = 0; j < static_cast<int>(out.size()); ++j)
    out[j] = rep[j / block] * block + (r.whole_replicas ? j % block : 0);
  return out;
}

bool run_aligned(const Scenario& s, const Layout& l, size_t g, int first, int n,
                 bool whole_replicas) {
  const int block = l.tp * l.cp;
  const int gpn = s.cluster.groups()[g].profile.gpus_per_node;
  if (n % gpn != 0 && gpn % n != 0) return false;
  if ((first - s.cluster.group_first_gpu(g)) % std::min(n, gpn) != 0) return false;
  if (n <= gpn) return true;
  const int per_node = gpn / l.tp;  // (cp, dp) positions per node
  if (whole_replicas && block % gpn != 0 && gpn % block != 0) return false;
  if (!whole_replicas && l.cp > 1 && per_node % l.cp != 0 && per_node != 1) return false;
  if (l.ep > 1 && per_node % l.ep != 0 && l.ep % per_node != 0) return false;
  return true;
}

std::optional<std::vector<int>> replica_classes(const Scenario& s, const Layout& l, int offset,
                                                bool whole_replicas) {
  const int n = l.tp * l.cp * l.dp;
  const int block = l.tp * l.cp;
  bool spans = false;  // some stage over several groups: replicas may differ
  for (int st = 0; st < l.pp; ++st) {
    const int first = offset + st * n;
    const hardware::ClusterSpec::GroupRange on = s.cluster.groups_of_gpus(first, n);
    if (on.size() == 0) return std::nullopt;
    spans = spans || on.size() > 1;
    for (size_t g = on.begin; g < on.end; ++g) {
      const int from = std::max(first, s.cluster.group_first_gpu(g));
      const int to = g + 1 < s.cluster.groups().size()
                         ? std::min(first + n, s.cluster.group_first_gpu(g + 1))
                         : first + n;
      // A replica's block straddling two groups, or EP groups (of replicas) that might.
      if (on.size() > 1 && (l.ep > 1 || (from - first) % block != 0 || (to - first) % block != 0))
        return std::nullopt;
      if (!run_aligned(s, l, g, from, to - from, whole_replicas)) return std::nullopt;
    }
  }
  // Every stage on one group (the usual case, evaluated plan after plan): one class.
  if (!spans) return std::vector<int>(static_cast<size_t>(l.dp), 0);
  std::map<std::vector<size_t>, int> ids;  // the group of each stage -> class
  std::vector<int> out;
  std::vector<size_t> key(static_cast<size_t>(l.pp));
  for (int d = 0; d < l.dp; ++d) {
    for (int st = 0; st < l.pp; ++st) key[st] = s.cluster.group_of_gpu(offset + st * n + d * block);
    out.push_back(ids.emplace(key, static_cast<int>(ids.size())).first->second);
  }
  return out;
}
void Lowering::run() {
  setup();
  for (int st = 0; st < l_.pp; ++st) {
    begin_stage(st);
    for (size_t i = 0; i < orders_[st].size(); ++i) op(i);
    end_stage();
  }
  finish();
}

void Lowering::setup() {
  static constexpr std::string_view kEncName[] = {"enc_fwd", "enc_bwd", "enc_wgrad",
                                                  "enc_recompute"};
  for (int pass = 0; pass < 4; ++pass)
    cat_[pass] = g_.label(role_.encoder_categories ? kEncName[pass] : kPassName[pass]);
  cat_tp_ = g_.label("tp_comm");
  cat_cp_ = g_.label("cp_comm");
  cat_pp_ = g_.label("pp_comm");
  cat_dp_ = g_.label("dp_comm");
  cat_ep_ = g_.label("ep_comm");
  cat_amax_ = g_.label("amax_comm");
  amax_fwd_ = g_.label(fmt::format("{}fp8 amax all_reduce fwd", role_.prefix));
  amax_bwd_ = g_.label(fmt::format("{}fp8 amax all_reduce bwd", role_.prefix));
  amax_tp_ = g_.label(fmt::format("{}fp8 amax all_reduce tp", role_.prefix));
  cat_opt_ = g_.label("optimizer");
  // What each comm stream carries, for the trace's track names.
  const std::pair<int32_t, std::string_view> streams[] = {
      {kTpStream, l_.ep > 1 && !l_.ep_comm_overlap && !l_.overlaps_shared_experts()
                      ? "tp / ep collectives"
                      : "tp collectives"},
      {kCpSend, "cp ring send"},
      {kCpRecv, "cp ring recv"},
      {kFwdSend, "pp activations send"},
      {kFwdRecv, "pp activations recv"},
      {kBwdSend, "pp gradients send"},
      {kBwdRecv, "pp gradients recv"},
      {kDpStream, "dp / fsdp gradient reductions"},
      {kFsdpGather, "fsdp parameter gathers"},
      {kEpStream, "ep all-to-alls"},
      {kEmbeddingStream, "tied embedding gradient all-reduce"},
      {kEpRailStream, "ep flex dispatcher transfers across nodes"}};
  for (const auto& [index, what] : streams)
    g_.set_stream_name(sim::StreamKind::kComm, index, fmt::format("{}{}", role_.prefix, what));
  m_ = s_.workload.global_batch / (static_cast<int64_t>(l_.micro_batch) * l_.dp);
  vstages_ = l_.pp * l_.vpp;
  split_w_ = role_.orders.empty() && splits_weight_gradient(p_.schedule);
  if (role_.modules.empty()) {  // the homogeneous plan: the whole world
    out_.world = l_.world();
    out_.micro_batches = m_;
    out_.network = build_network(s_.cluster);
  }
  const int n = stage_ranks();
  std::optional<std::vector<int>> classes;
  if (role_.modules.empty()) {
    if (!o_.full_ranks) classes = replica_classes(s_, l_, 0);
    reduced_ = classes.has_value();
    out_.representatives = reduced_;
  } else {
    reduced_ = role_.reduction.has_value();  // lower_heterogeneous sets multiplicities
  }
  if (reduced_) {
    owner_ = owners(l_, role_.modules.empty() ? Reduction{*classes, false} : *role_.reduction);
  } else {
    owner_.resize(n);
    for (int j = 0; j < n; ++j) owner_[j] = j;
  }
  slot_.assign(n, -1);
  actives_.clear();
  for (int j = 0; j < n; ++j)
    if (owner_[j] == j) {
      slot_[j] = static_cast<int>(actives_.size());
      actives_.push_back(j);
    }
  if (reduced_ && role_.modules.empty()) {  // each owner stands for the ranks it owns
    std::vector<int32_t> count(static_cast<size_t>(n), 0);
    for (int j = 0; j < n; ++j) ++count[static_cast<size_t>(owner_[j])];
    for (int st = 0; st < l_.pp; ++st)
      for (int j = 0; j < n; ++j) g_.set_multiplicity(rank_of(j, st), count[j]);
  }
  build_costs();
  place_blocks();
  orders_.resize(l_.pp);
  spans_.resize(l_.pp);
  for (int st = 0; st < l_.pp; ++st)
    orders_[st] = !role_.orders.empty() ? role_.orders[st]
                                        : stage_order(p_.schedule, st, l_.pp, l_.vpp, m_,
                                                      extra_warmup(l_), microbatch_group(l_));
}

void Lowering::begin_stage(int stage) {
  stage_ = stage;
  deferred_.clear();
  build_stage();
  buckets_ = gathers_params_in_forward() ? dp_buckets() : std::vector<Bucket>();
  bucket_gathered_.assign(buckets_.size(), std::vector<TaskId>(stage_ranks()));
  // Interleaved: chunks 0 and 1 gathered at the step's start, before (and so outside) the
  // first op, whose first task the pipeline's receive would otherwise hold back.
  param_syncs_.clear();
  if (!buckets_.empty() && l_.vpp > 1) {
    const std::vector<TaskId> start(stage_ranks());
    gather_chunk_params(0, start);
    gather_chunk_params(1, start);
    std::vector<const PipelineOp*> forwards;
    for (const PipelineOp& op : orders_[stage])
      if (op.kind == PassKind::kForward) forwards.push_back(&op);
    for (int c = 1; c + 1 < l_.vpp; ++c)
      for (size_t f = 0; f < forwards.size(); ++f)
        if (forwards[f]->chunk == c && forwards[f]->micro_batch == 0) {
          const PipelineOp& at = *forwards[f - std::min<size_t>(f, static_cast<size_t>(stage))];
          param_syncs_.push_back({at.chunk, at.micro_batch, c + 1});
          break;
        }
  }
  // Megatron-Core's combined 1F1B (Layout::ep_comm_overlap): each forward that the
  // schedule puts next to a backward of another micro-batch runs merged with it (the
  // steady state; pp 1: the backward of micro-batch k with the forward of k + 1).
  const std::vector<PipelineOp>& order = orders_[stage];
  merge_.assign(order.size(), 0);
  if (l_.ep_comm_overlap && !role_.frozen)
    for (size_t i = 0; i + 1 < order.size();) {
      const PipelineOp &a = order[i], &b = order[i + 1];
      const bool pair = a.kind != b.kind && a.kind != PassKind::kWeight &&
                        b.kind != PassKind::kWeight && a.micro_batch != b.micro_batch;
      if (!pair) {
        ++i;
        continue;
      }
      merge_[i] = 1;
      merge_[i + 1] = 2;
      i += 2;
    }
}

void Lowering::end_stage() {
  drain_deferred_wgrads();
  if (!role_.frozen) gradients_and_optimizer();
  if (stage_ == 0 && l_.pp > 1) {  // stages are alike in size: room for the rest
    const double scale = 1.05 * l_.pp;
    g_.reserve(static_cast<size_t>(g_.num_tasks() * scale),
               static_cast<size_t>(static_cast<double>(g_.num_stream_refs()) * scale),
               static_cast<size_t>(static_cast<double>(g_.num_dependencies()) * scale * 1.2));
  }
}

void Lowering::op(size_t i) {
  if (merge_[i] == 2) return;  // run_merged(i - 1) ran it
  if (merge_[i] == 1) return run_merged(i);
  run_op(orders_[stage_][i], spans_[stage_][i]);
}

void Lowering::finish() {
  if (blocking()) {  // pipeline_p2p records the transfers the calls move
    const size_t na = actives_.size();
    sent_.resize(l_.pp);
    received_.resize(l_.pp);
    for (int st = 0; st < l_.pp; ++st) {
      sent_[st].assign(orders_[st].size() * na, TaskId());
      received_[st].assign(orders_[st].size() * na, TaskId());
    }
  }
  for (int stage = 0; stage < l_.pp; ++stage) pipeline_p2p(stage);
  if (blocking())
    for (int stage = 0; stage < l_.pp; ++stage) blocking_calls(stage);
}

// Reduced: a group without a member that runs tasks is a copy of the group holding the
// owner of its first member (groups of one set partition the stage's ranks).
void Lowering::make_groups(GroupSet& gs, const std::vector<std::vector<int>>& locals) {
  gs.ids.clear();
  gs.locals = locals;
  gs.emitted.assign(locals.size(), !reduced_);
  gs.copies.assign(locals.size(), GroupId());
  for (size_t k = 0; k < locals.size(); ++k) {
    members_.clear();
    for (int j : locals[k]) members_.push_back(rank_of(j, stage_));
    gs.ids.push_back(g_.add_group(members_));
  }
  if (!reduced_) return;
  std::vector<int> group_of(static_cast<size_t>(stage_ranks()), -1);
  for (size_t k = 0; k < locals.size(); ++k)
    for (int j : locals[k]) {
      group_of[j] = static_cast<int>(k);
      if (active(j)) gs.emitted[k] = true;
    }
  std::vector<std::vector<RankId>> copies(locals.size());
  for (size_t k = 0; k < locals.size(); ++k) {
    if (gs.emitted[k]) continue;
    const int o = group_of[owner_[locals[k][0]]];
    HETPAR_CHECK(o >= 0 && gs.emitted[o], "a copied group without an emitted owner");
    for (int j : locals[k]) copies[o].push_back(rank_of(j, stage_));
  }
  for (size_t k = 0; k < locals.size(); ++k)
    if (!copies[k].empty()) gs.copies[k] = g_.add_group(copies[k]);
}

// Modules in execution order (encoders the workload feeds, each followed by its
// projector, then the LLM); their graphs give the model FLOPs and, per GPU type, costs.
void Lowering::build_costs() {
  const models::ModelSpec& model = s_.model;
  std::vector<size_t> order;
  for (size_t i = 0; i < model.modules.size() && role_.modules.empty(); ++i) {
    if (!models::is_encoder(models::kind_of(model.modules[i].spec))) continue;
    if (module_input(s_, i, l_.micro_batch).items_per_sample < 1) continue;
    order.push_back(i);
    for (const models::Edge& e : model.edges)
      if (e.from == i &&
          models::kind_of(model.modules[e.to].spec) == models::ModuleKind::kProjector)
        order.push_back(e.to);
  }
  if (role_.modules.empty())
    order.push_back(model.llm_index());
  else
    order = role_.modules;
  has_llm_ = order.back() == model.llm_index();

  std::vector<models::OpGraph> graphs;
  for (size_t i : order) {
    graphs.push_back(module_graph(s_, i, l_));
    // Model FLOPs count the routed tokens, not a token-dropping layout's padding nor the
    // hottest rank's excess.
    const Flops flops = l_.moe_capacity_factor > 0 || l_.moe_rank_load() > 1
                            ? models::model_flops(module_graph(s_, i, l_, ExpertLoad::kRouted))
                            : models::model_flops(graphs.back());
    out_.model_flops_per_iteration += flops * static_cast<double>(m_ * l_.dp);
    module_names_.push_back(model.modules[i].name);
    cp_split_.push_back(i == model.llm_index());
  }
  for (const hardware::NodeGroup& group : s_.cluster.groups()) {
    host_op_.push_back(group.profile.host_op);
    host_ = host_ || group.profile.host_op > Time::zero();
    std::vector<ModuleCost>& fwd = costs_[0].emplace_back();
    std::vector<ModuleCost>& bwd = costs_[1].emplace_back();
    for (size_t k = 0; k < graphs.size(); ++k) {
      const ModuleCost mc = module_cost(graphs[k], l_, order[k] == model.llm_index(),
                                        group.profile.gpu, s_.workload.precision);
      fwd.push_back(for_direction(mc, false, l_.sequence_parallel));
      bwd.push_back(for_direction(mc, true, l_.sequence_parallel));
    }
  }
  graphs_ = std::move(graphs);
  group_of_rank_.clear();
  const auto& groups = s_.cluster.groups();
  for (size_t gi = 0; gi < groups.size(); ++gi)
    group_of_rank_.insert(group_of_rank_.end(),
                          static_cast<size_t>(groups[gi].nodes) * groups[gi].profile.gpus_per_node,
                          static_cast<int>(gi));
}

void Lowering::place_blocks() {
  chunks_.assign(vstages_, {});
  const std::vector<ModuleCost>& mc = costs_[0][0];  // the block structure is GPU-independent
  const size_t llm = has_llm_ ? mc.size() - 1 : mc.size();
  auto place = [&](int v, size_t module, Part part, std::string name, int kind = 0) {
    PlacedBlock pb{module, part, std::move(name), kind};
    if (!cost_block(mc[module], pb).empty()) chunks_[v].push_back(std::move(pb));
  };
  // The LLM's layers over the virtual stages (even or uneven split, schedule.h); other
  // modules whole on the first. An encoder's own pipeline (non-colocated, pp > 1): its
  // layers split evenly over its stages (the first ones taking one more when pp does not
  // divide them, as memory.h), its stem on the first, its last norm and projectors on the
  // last (the boundary leaves from there).
  const size_t split_module = has_llm_ ? llm : 0;
  const int64_t split_layers = mc[split_module].layers;
  std::vector<int64_t> split;
  if (has_llm_) {
    split = layers_per_virtual_stage(l_, split_layers, nullptr);
  } else {
    for (int v = 0; v < vstages_; ++v)
      split.push_back(split_layers / vstages_ + (v < split_layers % vstages_ ? 1 : 0));
  }
  HETPAR_CHECK(!split.empty(), "infeasible pipeline split reached lower()");
  for (size_t k = 0; k < mc.size(); ++k) {
    const std::string& name = module_names_[k];
    const bool split_here = k == split_module;
    const int home = !has_llm_ && k > 0 ? vstages_ - 1 : 0;  // projectors: the last stage
    place(home, k, Part::kPre, name + " pre");
    int v = split_here ? 0 : home;
    int64_t end = split_here ? split[0] : mc[k].layers;
    for (int64_t i = 0; i < mc[k].layers; ++i) {
      while (split_here && i >= end && v + 1 < vstages_) end += split[++v];
      place(v, k, Part::kLayer, fmt::format("{} L{}", name, i), mc[k].layer_kind(i));
    }
    place(split_here ? vstages_ - 1 : home, k, Part::kPost, name + " post");
    place(split_here ? vstages_ - 1 : home, k, Part::kMtp, name + " mtp");  // empty: none
  }
  labels_.assign(vstages_, {});
  for (int v = 0; v < vstages_; ++v) labels_[v].resize(chunks_[v].size() * 4);
}

// Names per (virtual stage, block, pass), not per micro-batch: the trace's timeline tells
// micro-batches apart, and a graph does not hold a string per task.
const Lowering::Labels& Lowering::labels(int v, size_t block, int pass) {
  Labels& lb = labels_[v][block * 4 + pass];
  if (lb.ready) return lb;
  const std::string base = fmt::format("{} {}", chunks_[v][block].name, kPassName[pass]);
  lb.compute = g_.label(base);
  lb.tp = g_.label(base + " tp");
  lb.ep = g_.label(base + " all-to-all");
  lb.cp = g_.label(base + " kv ring");
  if (l_.overlaps_shared_experts()) {
    lb.shared = g_.label(base + " shared experts");
    lb.shared_tp = g_.label(base + " shared experts tp");
  }
  lb.ready = true;
  return lb;
}

sim::KernelListId Lowering::kernels(const PlacedBlock& pb, size_t s, bool backward, Use use) {
  if (!o_.kernels && !host_) return {};
  const auto key = std::make_tuple(pb.module, static_cast<int>(pb.cost_index()), s, backward,
                                   static_cast<int>(use));
  if (auto it = kernel_ids_.find(key); it != kernel_ids_.end()) return it->second;
  const models::OpGraph& g = graphs_[pb.module];
  const bool cp_split = cp_split_[pb.module];
  std::vector<sim::Kernel> list;
  // One ring step's share of an attention kernel (the local queries against one rank's K,V
  // chunk, 1/cp_ring() of the keys) or of a memory pass (1/cp_ring() of its bytes); false
  // for a GEMM, which each use below sizes itself.
  const int ring_steps = l_.cp_ring();
  auto ring_share = [&](sim::Kernel& k) {
    if (k.kind == sim::KernelKind::kGemm) return false;
    if (k.kind == sim::KernelKind::kMemory)
      k.bytes /= ring_steps;
    else
      k.seq_kv /= ring_steps;
    return true;
  };
  // A causal ring's step off the diagonal (op_cost): as many FLOPs as the diagonal's masked
  // call, all the queries against the first half of the arrived chunk, no mask. False for a
  // kernel that is not such an attention call (kept as it is).
  auto unmask = [](sim::Kernel& k) {
    const bool attention = k.kind == sim::KernelKind::kAttentionForward ||
                           k.kind == sim::KernelKind::kAttentionBackward;
    if (!attention || !k.causal) return false;
    k.causal = false;
    k.seq_kv = (k.seq_kv + 1) / 2;
    return true;
  };
  const bool ring = cp_split && l_.cp > 1 && ring_steps > 1;
  auto add = [&](const WorkStep& step) {
    for (int32_t i : step.ops) {
      const OpKernels k = op_kernels(g.ops[i], g, l_, cp_split, s_.workload.precision);
      if (use == Use::kRecompute && ring && g.ops[i].kind == models::OpKind::kAttention) {
        // Recomputed attention re-runs the ring: cp calls, each with its own memory passes
        // (the cost model times it so, cost_model.cpp).
        for (const sim::Kernel& x : k.recompute) {
          sim::Kernel chunk = x;
          if (!ring_share(chunk)) {
            list.push_back(x);
            continue;
          }
          list.push_back(chunk);  // the diagonal step's; the others' unmasked
          unmask(chunk);
          list.insert(list.end(), static_cast<size_t>(ring_steps - 1), chunk);
        }
        continue;
      }
      switch (use) {
        case Use::kForward:
        case Use::kRingForward:
        case Use::kRingForwardUnmasked:
          list.insert(list.end(), k.forward.begin(), k.forward.end());
          break;
        case Use::kBackward:
        case Use::kRingBackward:
        case Use::kRingBackwardUnmasked:
          list.insert(list.end(), k.dgrad.begin(), k.dgrad.end());
          if (!split_w_) list.insert(list.end(), k.wgrad.begin(), k.wgrad.end());
          break;
        case Use::kRecompute:
          list.insert(list.end(), k.recompute.begin(), k.recompute.end());
          break;
        case Use::kWgrad:
        case Use::kStepWgrad:
          list.insert(list.end(), k.wgrad.begin(), k.wgrad.end());
          break;
        case Use::kDgrad:
          list.insert(list.end(), k.dgrad.begin(), k.dgrad.end());
          break;
      }
    }
  };
  if (use == Use::kWgrad) {
    for (const WorkStep& step : block(0, pb).steps) add(step);
  } else {
    add(block(0, pb, backward || use == Use::kStepWgrad || use == Use::kDgrad).steps[s]);
  }
  const bool unmasked = use == Use::kRingForwardUnmasked || use == Use::kRingBackwardUnmasked;
  if (use == Use::kRingForward || use == Use::kRingBackward || unmasked) {
    for (sim::Kernel& k : list) {
      if (!ring_share(k)) k.batch = std::max<int64_t>(1, k.batch / ring_steps);
      if (unmasked) unmask(k);
    }
  }
  const sim::KernelListId id = add_kernel_list(list);
  kernel_ids_.emplace(key, id);
  return id;
}

sim::KernelListId Lowering::add_kernel_list(std::span<const sim::Kernel> list) {
  const sim::KernelListId id = g_.add_kernels(list);
  int32_t calls = 0;
  for (const sim::Kernel& k : list) calls += static_cast<int32_t>(k.launches);
  if (list_calls_.size() <= static_cast<size_t>(id.value())) list_calls_.resize(id.value() + 1);
  list_calls_[id.value()] = calls;
  return id;
}

void Lowering::compute(int j, Time d, Flops f, int pass, sim::LabelId name,
                       sim::KernelListId kernels) {
  const TaskId t = g_.add_compute(rank_of(j, stage_), 0, d, f, {cat_[pass], name});
  if (kernels.valid() && o_.kernels) g_.set_kernels(t, kernels);
  if (host_) {  // one issue per host call of its kernels (a task without a kernel list: one)
    const int32_t n = kernels.valid() ? list_calls_[kernels.value()] : 1;
    g_.set_host(t, host_op_[group_[j]] * n, false, std::max(n, 1));
  }
  RankState& rs = st_[j];
  if (rs.need.valid()) g_.add_dependency(rs.need, t);
  if (rs.gathered.valid()) g_.add_dependency(rs.gathered, t);
  if (rs.beside.valid()) g_.add_dependency(rs.beside, t);
  if (rs.side.valid()) g_.add_dependency(rs.side, t);
  rs.need = rs.gathered = rs.beside = rs.side = TaskId();
  rs.last = t;
}

void Lowering::collective(CollectiveKind kind, Bytes bytes, sim::Label label, const GroupSet& gs) {
  collective(kind, bytes, label, gs, kTpStream);
}

void Lowering::collective(CollectiveKind kind, Bytes bytes, sim::Label label, const GroupSet& gs,
                          int32_t stream) {
  group_collectives(gs, kind, bytes, stream, label, [&](int j, TaskId c) {
    RankState& rs = st_[j];
    if (rs.last.valid()) g_.add_dependency(rs.last, c);
    rs.need = rs.last = c;
  });
}

void Lowering::ring_collective(CollectiveKind kind, Bytes bytes, sim::LabelId name,
                               bool after_ring) {
  group_collectives(tp_groups_, kind, bytes, kTpStream, {cat_tp_, name}, /*copy_engine=*/true,
                    [&](int j, TaskId c) {
                      if (st_[j].last.valid()) g_.add_dependency(st_[j].last, c);
                      if (after_ring && ring_[j].valid()) g_.add_dependency(ring_[j], c);
                      ring_[j] = c;
                    });
}

void Lowering::ring_linear(const PlacedBlock& pb, size_t s, int pass, const Labels& lb) {
  const bool backward = pass == kB;
  const std::vector<WorkStep>& steps = block(0, pb, backward).steps;
  // Chunks [from, to) of a GEMM of `chunks` equal ones taking `t` and `f`, as one task.
  auto chunks_of = [&](int j, Time t, Flops f, int64_t chunks, int64_t from, int64_t to,
                       sim::KernelListId k, int run_pass) {
    auto at = [&](int64_t c) { return c == chunks ? t : Time::ps(t.count_ps() / chunks * c); };
    compute(j, at(to) - at(from), f * (static_cast<double>(to - from) / chunks), run_pass,
            lb.compute, k);
  };
  // All chunks but the last, then the last after the ring collective beside them.
  auto last_waits = [&](int j, Time t, Flops f, sim::KernelListId k, int run_pass) {
    chunks_of(j, t, f, l_.tp, 0, l_.tp - 1, k, run_pass);
    st_[j].need = std::exchange(ring_[j], TaskId());
    chunks_of(j, t, f, l_.tp, l_.tp - 1, l_.tp, k, run_pass);
  };
  if (!backward && steps[s].overlaps_tp_entry) {
    // Column-parallel: chunk i computes on the i-th slice of the all-gather beside it (its
    // TP entry, run_step); every chunk but the last has its slice in time, the last waits
    // for the whole gather.
    const sim::KernelListId k = kernels(pb, s, false, Use::kForward);
    for (int j : actives_) {
      const PassCost& c = block(j, pb).steps[s].cost;
      last_waits(j, c.forward, c.forward_flops, k, pass);
    }
    return;
  }
  HETPAR_CHECK(s + 1 < steps.size() && steps[s + 1].kind == StepKind::kTpExit,
               "a ring-exchange row-parallel linear precedes a TP exit");
  const Bytes exit = steps[s + 1].bytes;
  if (!backward) {
    // Row-parallel: the partial sums of all chunks but the last move while the later chunks
    // compute, from the first chunk's end; the last chunk's reduce-scatter (the exit,
    // run_step) follows the GEMM.
    const int64_t chunks = steps[s].exit_chunks;
    const sim::KernelListId k = kernels(pb, s, false, Use::kForward);
    for (int j : actives_) {
      const PassCost& c = block(j, pb).steps[s].cost;
      chunks_of(j, c.forward, c.forward_flops, chunks, 0, 1, k, pass);
    }
    ring_collective(CollectiveKind::kReduceScatter, exit * (chunks - 1) / chunks, lb.tp);
    for (int j : actives_) {
      const PassCost& c = block(j, pb).steps[s].cost;
      chunks_of(j, c.forward, c.forward_flops, chunks, 1, chunks, k, pass);
    }
    return;
  }
  // The exit's backward (run_step) started the gradient's all-gather beside this dgrad,
  // whose last chunk waits for it, as the wgrad does.
  const sim::KernelListId kd = kernels(pb, s, true, Use::kDgrad);
  for (int j : actives_) {
    const PassCost& c = block(j, pb, true).steps[s].cost;
    last_waits(j, c.dgrad, c.dgrad_flops, kd, kB);
  }
  if (split_w_) return;  // the W pass runs the wgrad
  const sim::KernelListId kw = kernels(pb, s, true, Use::kStepWgrad);
  for (int j : actives_) {
    const PassCost& c = block(j, pb, true).steps[s].cost;
    compute(j, c.wgrad, c.wgrad_flops, kB, lb.compute, kw);
  }
}

// Ring attention over each cp group: attention part i runs once the K,V chunk of ring step
// i-1 has arrived; step i forwards the chunk received at step i-1 to the next cp rank.
// The ring runs over cp_ring() ranks: the whole cp group (p2p), or under a2a+p2p the cp
// ranks cp_a2a apart (Megatron's second hierarchical level), each rank sending to the
// one `stride` cp positions after it.
void Lowering::cp_ring(const PlacedBlock& pb, size_t s, int pass, const Labels& lb) {
  const int cp = l_.cp, steps = l_.cp_ring(), stride = l_.cp_heads_split();
  const bool backward = pass == kB;
  const Bytes bytes = block(0, pb, backward).steps[s].bytes * (backward ? 2 : 1);
  const sim::KernelListId diagonal =
      kernels(pb, s, backward, backward ? Use::kRingBackward : Use::kRingForward);
  // The cost model's mask per step (op_cost): a causal ring masks its diagonal step only.
  const sim::KernelListId off_diagonal =
      kernels(pb, s, backward, backward ? Use::kRingBackwardUnmasked : Use::kRingForwardUnmasked);
  auto part = [&](int i) { return i == 0 ? diagonal : off_diagonal; };
  // The diagonal step is the masked call, longer than the others by the cost model's extra.
  auto step_time = [&](const PassCost& c, int i) {
    const Time extra = backward ? c.ring_diagonal_dgrad : c.ring_diagonal_forward;
    const Time base = Time::ps(((backward ? c.dgrad : c.forward) - extra).count_ps() / steps);
    return i == 0 ? base + extra : base;
  };
  std::vector<TaskId> arrived(cp), next(cp);
  if (reduced_ && !whole_replicas()) {
    // Each representative (q = 0) computes; each ring step it sends K,V to q = 1 and
    // receives them from q = cp-1 (both mirrored) as one grouped transfer, once its
    // previous chunk arrived (and the sender's, by symmetry). Both flows are simulated so
    // that the representative's links carry its sends and receives; every other ring edge
    // of the replicas it stands for is a copy.
    for (size_t a = 0; a < actives_.size(); ++a) {
      const int j = actives_[a];
      TaskId in;
      for (int i = 0; i < steps; ++i) {
        const PassCost& c = block(j, pb, backward).steps[s].cost;
        if (i > 0) st_[j].need = in;
        compute(j, step_time(c, i), (backward ? c.dgrad_flops : c.forward_flops) / steps, pass,
                lb.compute, part(i));
        if (i + 1 == steps) break;
        const TaskId x = g_.add_p2p_group(cp_pairs_[a], bytes, kCpSend, kCpRecv, {cat_cp_, lb.cp},
                                          cp_copies_[a]);
        if (i > 0) g_.add_dependency(in, x);
        in = x;
      }
    }
    return;
  }
  // Every rank of the ring runs tasks (full ranks, or a representative replica whose
  // ring edges stand for those of its class: cp_edge_copies_).
  for (int dp_i = 0; dp_i < l_.dp; ++dp_i)
    for (int t = 0; t < l_.tp; ++t) {
      auto local = [&](int q) { return t + l_.tp * (q + cp * dp_i); };
      if (slot_[local(0)] < 0) continue;  // a mirrored replica
      for (int i = 0; i < steps; ++i) {
        for (int q = 0; q < cp; ++q) {
          const int j = local(q);
          const PassCost& c = block(j, pb, backward).steps[s].cost;
          if (i > 0) st_[j].need = arrived[q];
          compute(j, step_time(c, i), (backward ? c.dgrad_flops : c.forward_flops) / steps, pass,
                  lb.compute, part(i));
        }
        if (i + 1 == steps) break;
        for (int q = 0; q < cp; ++q) {
          const int to = (q + stride) % cp;
          const TaskId x =
              g_.add_p2p(rank(t, q, dp_i, stage_), rank(t, to, dp_i, stage_), bytes, kCpSend,
                         kCpRecv, {cat_cp_, lb.cp}, cp_edge_copies_[local(q)]);
          if (i > 0) g_.add_dependency(arrived[q], x);
          next[to] = x;
        }
        std::swap(arrived, next);
      }
    }
}

bool Lowering::delays_wgrad(const PlacedBlock& pb, size_t s) {
  const std::vector<WorkStep>& steps = block(0, pb, true).steps;
  if (!l_.ep_comm_overlap || split_w_ || s == 0 || s >= steps.size() ||
      steps[s - 1].kind != StepKind::kEpAllToAll)
    return false;
  // A plain compute step: not one that ring_linear() or linear_backward() runs.
  const WorkStep& step = steps[s];
  return step.kind == StepKind::kCompute && !(step.ring_exchange && step.overlaps_tp_exit) &&
         !step.overlaps_tp_entry;
}

bool Lowering::overlapped_entry(const PlacedBlock& pb, size_t s) {
  const std::vector<WorkStep>& steps = block(0, pb, true).steps;
  return !split_w_ && s + 1 < steps.size() && steps[s + 1].overlaps_tp_entry;
}

void Lowering::linear_backward(const PlacedBlock& pb, size_t s, const Labels& lb) {
  const std::vector<WorkStep>& steps = block(0, pb, true).steps;
  HETPAR_CHECK(s > 0 && steps[s - 1].kind == StepKind::kTpEntry,
               "a linear that overlaps its TP entry follows one");
  const bool sp = l_.sequence_parallel;
  const Bytes bytes = steps[s - 1].bytes;
  const int n = stage_ranks();
  // Layout::defer_embedding_wgrad: the output layer's wgrad (and its input's re-gather)
  // waits for the drain; the first wgrad_deferral_limit micro-batches (0: all).
  const bool defer = steps[s].output_layer && l_.defer_embedding_wgrad &&
                     (l_.wgrad_deferral_limit == 0 || backward_mb_ < l_.wgrad_deferral_limit);
  if (defer) deferred_.push_back({&pb, s, lb.compute, lb.tp});
  std::vector<TaskId> gathered(n), dgrad(n), reduced(n);
  if (sp && !defer) regather_input(pb, s, lb.tp, {}, gathered);
  const sim::KernelListId kd = kernels(pb, s, true, Use::kDgrad);
  for (int j : actives_) {
    const PassCost& c = block(j, pb, true).steps[s].cost;
    compute(j, c.dgrad, c.dgrad_flops, kB, lb.compute, kd);
    dgrad[j] = st_[j].last;
  }
  group_collectives(tp_groups_, sp ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce,
                    bytes, kTpStream, {cat_tp_, lb.tp}, [&](int j, TaskId c) {
                      g_.add_dependency(dgrad[j], c);
                      reduced[j] = c;
                    });
  if (!defer) linear_wgrad(pb, s, lb.compute, gathered);
  // The layer's earlier backward takes the reduced gradient.
  for (int j : actives_) st_[j].need = reduced[j];
}

void Lowering::regather_input(const PlacedBlock& pb, size_t s, sim::LabelId tp,
                              std::span<const TaskId> after, std::vector<TaskId>& gathered) {
  const Bytes bytes = block(0, pb, true).steps[s - 1].gather_bytes;
  group_collectives(tp_groups_, CollectiveKind::kAllGather, bytes, kTpStream, {cat_tp_, tp},
                    [&](int j, TaskId c) {
                      const TaskId a = !after.empty() && after[j].valid() ? after[j] : st_[j].last;
                      if (a.valid()) g_.add_dependency(a, c);
                      gathered[j] = c;
                    });
}

void Lowering::linear_wgrad(const PlacedBlock& pb, size_t s, sim::LabelId compute_label,
                            const std::vector<TaskId>& gathered) {
  const sim::KernelListId kw = kernels(pb, s, true, Use::kStepWgrad);
  for (int j : actives_) {
    const PassCost& c = block(j, pb, true).steps[s].cost;
    st_[j].need = gathered[j];
    compute(j, c.wgrad, c.wgrad_flops, kB, compute_label, kw);
  }
}

void Lowering::run_step(const PlacedBlock& pb, size_t s, int pass, const Labels& lb,
                        sim::LabelId recompute) {
  // A run of steps beside an all-to-all (WorkStep::beside_all_to_all; re-runs under
  // recompute are not overlapped): it starts after the task before the exchange (the shared
  // experts' stream waits for the compute stream as the exchange is issued), not waiting
  // for the exchange, and the step after the run waits for the exchange and the run.
  if (pass == kR || !l_.overlaps_shared_experts()) return run_work(pb, s, pass, lb, recompute);
  const std::vector<WorkStep>& steps = block(0, pb, pass == kB).steps;
  if (!steps[s].beside_all_to_all) return run_work(pb, s, pass, lb, recompute);
  const bool backward = pass == kB;
  HETPAR_CHECK(backward ? s + 1 < steps.size() : s > 0,
               "a step beside an all-to-all without the all-to-all before it");
  const bool first = !steps[backward ? s + 1 : s - 1].beside_all_to_all;
  const bool last = backward ? s == 0 || !steps[s - 1].beside_all_to_all
                             : s + 1 == steps.size() || !steps[s + 1].beside_all_to_all;
  if (first)
    for (int j : actives_) {
      RankState& rs = st_[j];
      rs.held = {rs.need, rs.last, rs.beside};
      rs.beside = TaskId();
      rs.need = rs.last = rs.before_all_to_all;
    }
  Labels side = lb;
  side.compute = lb.shared;
  side.tp = lb.shared_tp;
  run_work(pb, s, pass, side, recompute);
  if (last)
    for (int j : actives_) {
      RankState& rs = st_[j];
      rs.side = rs.last;
      rs.need = rs.held[0];
      rs.last = rs.held[1];
      rs.beside = rs.held[2];
    }
}

void Lowering::run_work(const PlacedBlock& pb, size_t s, int pass, const Labels& lb,
                        sim::LabelId recompute) {
  const bool sp = l_.sequence_parallel;
  const bool backward = pass == kB;
  const WorkStep& step = block(0, pb, backward).steps[s];
  switch (step.kind) {
    case StepKind::kCompute:
    case StepKind::kCpAttention: {
      const bool cp_step = step.kind == StepKind::kCpAttention;
      const bool gather = cp_step && l_.cp_comm == CpComm::kAllGather;
      // All-gather CP (Megatron's --cp-comm-type all_gather): K,V gathered over the cp group
      // before the attention, forward and again before its backward (only the local chunk
      // is kept), which waits for them; dK,dV reduce-scattered back to their owners after
      // it. step.bytes is one rank's K,V chunk.
      if (gather)
        collective(CollectiveKind::kAllGather, step.bytes * l_.cp, {cat_cp_, lb.cp}, cp_groups_);
      // A2A CP (--cp-comm-type a2a, and the a2a level of a2a+p2p): forward, Q, K, V
      // all-to-all'd before the attention and its output after; backward, the output and
      // its gradient before and dQ, dK, dV after; each blocking the compute after it
      // (Transformer Engine waits for them).
      const bool a2a = cp_step && l_.cp_heads_split() > 1;
      const Bytes qkv = step.query_bytes + step.bytes;
      auto cp_all_to_all = [&](Bytes bytes) {
        collective(CollectiveKind::kAllToAll, bytes, {cat_cp_, lb.cp}, cp_groups_);
      };
      // Selective recompute, unless the step re-ran in its block's replay (mlp_replay()).
      // Under a2a CP the re-run attention exchanges Q, K, V and its output again.
      if (backward && step.cost.recompute > Time::zero() && !replays(pb).mlp.covers(step)) {
        if (a2a) cp_all_to_all(qkv);
        const sim::KernelListId k = kernels(pb, s, true, Use::kRecompute);
        for (int j : actives_) {
          const PassCost& c = block(j, pb, true).steps[s].cost;
          compute(j, c.recompute, c.recompute_flops, kR, recompute, k);
        }
        if (a2a) cp_all_to_all(step.out_bytes);
      }
      if (a2a) cp_all_to_all(backward ? step.out_bytes * 2 : qkv);
      if (cp_step && l_.cp_ring() > 1) {
        cp_ring(pb, s, pass, lb);
        if (a2a) cp_all_to_all(backward ? qkv : step.out_bytes);
        return;
      }
      if (step.ring_exchange && (step.overlaps_tp_exit || !backward))
        return ring_linear(pb, s, pass, lb);
      if (backward && step.overlaps_tp_entry && !split_w_) return linear_backward(pb, s, lb);
      if (backward && delays_wgrad(pb, s)) {  // the wgrad runs beside the all-to-all after it
        const sim::KernelListId kd = kernels(pb, s, true, Use::kDgrad);
        for (int j : actives_) {
          const PassCost& c = block(j, pb, true).steps[s].cost;
          compute(j, c.dgrad, c.dgrad_flops, kB, lb.compute, kd);
        }
        return;
      }
      const sim::KernelListId k =
          kernels(pb, s, backward, backward ? Use::kBackward : Use::kForward);
      for (int j : actives_) {
        const PassCost& c = block(j, pb, backward).steps[s].cost;
        if (backward)
          compute(j, c.dgrad + (split_w_ ? Time() : c.wgrad),
                  c.dgrad_flops + (split_w_ ? Flops() : c.wgrad_flops), pass, lb.compute, k);
        else
          compute(j, c.forward, c.forward_flops, pass, lb.compute, k);
      }
      if (gather && backward)
        collective(CollectiveKind::kReduceScatter, step.bytes * l_.cp, {cat_cp_, lb.cp},
                   cp_groups_);
      if (a2a) cp_all_to_all(backward ? qkv : step.out_bytes);
      return;
    }
    case StepKind::kTpEntry: {
      if (backward && overlapped_entry(pb, s)) return;  // linear_backward() ran it
      const std::vector<WorkStep>& steps = block(0, pb, backward).steps;
      if (!backward && step.amax_reduce) reduce_tp_amax();
      if (!backward && sp && s + 1 < steps.size() && steps[s + 1].ring_exchange)
        return ring_collective(CollectiveKind::kAllGather, step.gather_bytes, lb.tp);
      if (backward)
        collective(sp ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce, step.bytes,
                   {cat_tp_, lb.tp}, tp_groups_);
      else if (sp)
        collective(CollectiveKind::kAllGather, step.gather_bytes, {cat_tp_, lb.tp}, tp_groups_);
      return;
    }
    case StepKind::kTpExit: {
      const std::vector<WorkStep>& steps = block(0, pb, backward).steps;
      if (backward && step.amax_reduce) reduce_tp_amax();
      if (s > 0 && steps[s - 1].ring_exchange) {
        if (backward)  // the gradient's all-gather, beside the linear's dgrad (ring_linear)
          return ring_collective(CollectiveKind::kAllGather, step.bytes, lb.tp);
        // The last chunk's reduce-scatter, after the GEMM and the chunks before it.
        ring_collective(CollectiveKind::kReduceScatter, step.bytes / steps[s - 1].exit_chunks,
                        lb.tp, /*after_ring=*/true);
        for (int j : actives_) {
          st_[j].need = st_[j].last = ring_[j];
          ring_[j] = TaskId();
        }
        return;
      }
      if (!backward)
        collective(sp ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce, step.bytes,
                   {cat_tp_, lb.tp}, tp_groups_);
      else if (sp)
        collective(CollectiveKind::kAllGather, step.bytes, {cat_tp_, lb.tp}, tp_groups_);
      return;
    }
    case StepKind::kTpLossAllReduce:
    case StepKind::kTpLossAllGather:
      if (!backward)
        collective(step.kind == StepKind::kTpLossAllReduce ? CollectiveKind::kAllReduce
                                                           : CollectiveKind::kAllGather,
                   step.bytes, {cat_tp_, lb.tp}, tp_groups_);
      return;
    case StepKind::kEpAllToAll: {
      // Megatron's dropless all-to-all dispatcher all-gathers each rank's tokens per expert
      // over the group (the dispatch's step carries their bytes) and needs the split sizes on
      // the host before its dispatch: the host waits for that work to finish
      // (token_dispatcher.py: preprocess, the "before_ep_alltoall" cuda_sync_point). The
      // backward reuses them: neither again. The all-gather is issued with the compute
      // (preprocess), not on the all-to-alls' stream of the EP overlap: it does not queue
      // behind a backward's all-to-all.
      if (l_.overlaps_shared_experts())  // where a run beside this exchange starts (run_step)
        for (int j : actives_) st_[j].before_all_to_all = st_[j].last;
      if (!backward && step.expert_counts_bytes > Bytes(0)) {
        collective(CollectiveKind::kAllGather, step.expert_counts_bytes * l_.ep, {cat_ep_, lb.ep},
                   ep_groups_, kTpStream);
        if (host_)
          for (int j : actives_)
            if (st_[j].last.valid() && g_.host_issued(st_[j].last)) g_.set_host_sync(st_[j].last);
      }
      // Beside the shared experts' SP collectives too (Layout::moe_shared_expert_overlap):
      // another communicator, another stream.
      const int32_t a2a_stream =
          l_.ep_comm_overlap || l_.overlaps_shared_experts() ? kEpStream : kTpStream;
      // The flex dispatcher's NVLink bytes (DeepEP, HybridEP): each token once to each rank
      // of its experts (1 otherwise).
      auto sent = [&](Bytes b) {
        return Bytes(std::llround(b.as_double() * flex_nvlink_per_byte_));
      };
      if (!ep_rail_groups_.ids.empty()) {
        // DeepEP or HybridEP across nodes (Layout::moe_dispatcher): one kernel pipelines the
        // transfers across nodes (each token once to each other node holding one of its
        // experts, with its routing, to the GPU of the sender's local index there) with the
        // NVLink all-to-all that forwards them and moves the node's own tokens, once to each
        // rank holding one of its experts. As two collectives side by side, both waited for.
        const Bytes copies = step.bytes + step.probs_bytes;
        const Bytes rail(std::llround(copies.as_double() * flex_rail_per_byte_));
        // The NVLink part after the rank's last task; `beside` holds that task until the
        // part across nodes, which starts after it too, takes its place.
        group_collectives(ep_node_groups_, CollectiveKind::kAllToAll, sent(copies), a2a_stream,
                          {cat_ep_, lb.ep}, [&](int j, TaskId c) {
                            RankState& rs = st_[j];
                            if (rs.last.valid()) g_.add_dependency(rs.last, c);
                            // A transfer still beside the last (a replayed dispatch's part
                            // across nodes, the MoE recompute's) is waited for as well.
                            if (rs.beside.valid()) g_.add_dependency(rs.beside, c);
                            rs.beside = rs.last;
                            rs.need = rs.last = c;
                          });
        group_collectives(ep_rail_groups_, CollectiveKind::kAllToAll, rail, kEpRailStream,
                          {cat_ep_, lb.ep}, [&](int j, TaskId c) {
                            RankState& rs = st_[j];
                            if (rs.beside.valid()) g_.add_dependency(rs.beside, c);
                            rs.beside = c;
                          });
      } else {
        collective(CollectiveKind::kAllToAll, sent(step.bytes), {cat_ep_, lb.ep}, ep_groups_,
                   a2a_stream);
        if (step.probs_bytes > Bytes(0))  // the routing probabilities, a call of their own
          collective(CollectiveKind::kAllToAll, sent(step.probs_bytes), {cat_ep_, lb.ep},
                     ep_groups_, a2a_stream);
      }
      if (backward && delays_wgrad(pb, s + 1)) {  // the wgrads held back for it, beside it
        const sim::KernelListId kw = kernels(pb, s + 1, true, Use::kStepWgrad);
        for (int j : actives_) {
          const TaskId a2a = std::exchange(st_[j].need, TaskId());
          const TaskId rail = std::exchange(st_[j].beside, TaskId());
          const PassCost& c = block(j, pb, true).steps[s + 1].cost;
          compute(j, c.wgrad, c.wgrad_flops, kB, lb.compute, kw);
          st_[j].need = a2a;
          st_[j].beside = rail;
        }
      }
      return;
    }
  }
}

namespace {

// The index of the step of `steps` that holds graph op `op`; SIZE_MAX if none.
size_t holding(const std::vector<WorkStep>& steps, const models::OpGraph& g, std::string_view op) {
  for (size_t s = 0; s < steps.size(); ++s)
    if (steps[s].holds(g, op)) return s;
  return SIZE_MAX;
}

// The index of the first TP exit after the step of `steps` that holds graph op `op`;
// SIZE_MAX if none. Forward and backward step lists differ (for_direction() keeps a linear
// after a TP entry a step of its own in backward only, and drops the identity side of a TP
// entry or exit without SP), so each is searched on its own.
size_t exit_after(const std::vector<WorkStep>& steps, const models::OpGraph& g,
                  std::string_view op) {
  for (size_t s = holding(steps, g, op); s < steps.size(); ++s)
    if (steps[s].kind == StepKind::kTpExit) return s;
  return SIZE_MAX;
}

}  // namespace

const Lowering::Replays& Lowering::replays(const PlacedBlock& pb) {
  static const Replays kNone;  // the blocks outside the layers replay nothing
  if (!pb.has_layers()) return kNone;
  const size_t at = kCostBlocks * pb.module + pb.cost_index();
  if (replays_.size() <= at) replays_.resize(at + 1);
  std::optional<Replays>& r = replays_[at];
  if (!r) r = Replays{moe_replay(pb), mlp_replay(pb), checkpointed(pb)};
  return *r;
}

Lowering::StepRanges Lowering::checkpointed(const PlacedBlock& pb) const {
  const std::vector<WorkStep>& steps = block(0, pb).steps;
  if (pb.part != Part::kMtp) return {{0, steps.size()}};
  // Per depth, the steps from the first to the last that compute an op of its layer index
  // (Op::mtp: its norms, eh_proj, layer and final norm), the collectives between them too.
  const models::OpGraph& g = graphs_[pb.module];
  StepRanges out;
  int depth = -1;  // the layer index of out.back()
  for (size_t s = 0; s < steps.size(); ++s)
    for (int32_t op : steps[s].ops) {
      const int layer = g.ops[static_cast<size_t>(op)].layer;
      if (layer < 0) continue;
      if (layer != depth) out.emplace_back(s, s + 1);
      depth = layer;
      out.back().second = s + 1;
    }
  return out;
}

Lowering::MoeReplay Lowering::moe_replay(const PlacedBlock& pb) const {
  MoeReplay r;
  if (!pb.has_layers() || !l_.recompute_policy().selects(models::kRecomputeMoe)) return r;
  const std::vector<WorkStep>& forward = block(0, pb).steps;
  const models::OpGraph& g = graphs_[pb.module];
  bool shared = false;
  for (size_t s = 0; s < forward.size(); ++s) {
    // The shared experts' SP gather and reduce-scatter (cost_model.cpp) re-run with them;
    // not userbuffers' ring collectives, which go with their linears' steps.
    const bool entry = forward[s].kind == StepKind::kTpEntry && s + 1 < forward.size() &&
                       forward[s + 1].holds(g, "shared_expert_fc1") &&
                       !forward[s + 1].ring_exchange;
    const bool exit = forward[s].kind == StepKind::kTpExit && s > 0 &&
                      forward[s - 1].holds(g, "shared_expert_fc2") && !forward[s - 1].ring_exchange;
    if (forward[s].kind == StepKind::kEpAllToAll || entry || exit) r.steps.push_back(s);
    shared = shared || exit;
  }
  const std::vector<WorkStep>& backward = block(0, pb, true).steps;
  for (size_t s = backward.size(); s-- > 0 && !r.steps.empty();)
    if (backward[s].kind == StepKind::kEpAllToAll) {
      r.at = std::min(s + 1, backward.size() - 1);
      break;
    }
  // The layer's backward begins at its last step: the shared experts' exit where they have one.
  if (shared) {
    const size_t exit = exit_after(backward, g, "shared_expert_fc2");
    r.at = r.at == SIZE_MAX ? exit : std::max(r.at, exit);
  }
  return r;
}

Lowering::MlpReplay Lowering::mlp_replay(const PlacedBlock& pb) const {
  MlpReplay r;
  const models::RecomputePolicy policy = l_.recompute_policy();
  const char *first_linear = nullptr, *last_linear = nullptr;
  if (policy.selects(models::kRecomputeMlp) && l_.tp > 1) {
    first_linear = "mlp_fc1";
    last_linear = "mlp_fc2";
  } else if (policy.checkpoints_shared_experts() && l_.tp > 1 && l_.sequence_parallel) {
    first_linear = "shared_expert_fc1";
    last_linear = "shared_expert_fc2";
  }
  if (!pb.has_layers() || first_linear == nullptr) return r;
  // The TP entry before the step with the first linear, through the first TP exit after it
  // (cost_model.cpp: a dense MLP's norm, entry, fc1, act, fc2, exit and residual add; the
  // shared experts' entry, fc1, act, fc2 and exit after the combine). Without SP the forward
  // has no entry step (an identity; for_direction()): the ops re-run as their steps' own
  // (cost_model.cpp), and the exit's all-reduce is sent again.
  const models::OpGraph& g = graphs_[pb.module];
  const std::vector<WorkStep>& forward = block(0, pb).steps;
  // (An MoE LLM's dense layers have no shared experts.)
  if (holding(forward, g, first_linear) == SIZE_MAX) return r;
  const size_t exit = exit_after(forward, g, first_linear);
  HETPAR_CHECK(exit != SIZE_MAX, "a layer under TP without its {}'s TP exit", first_linear);
  size_t first = exit;
  if (l_.sequence_parallel) {
    while (first > 0 && forward[first].kind != StepKind::kTpEntry) --first;
    HETPAR_CHECK(forward[first].kind == StepKind::kTpEntry, "no TP entry before {}", first_linear);
    for (size_t f = first; f < exit; ++f)
      r.ops.insert(r.ops.end(), forward[f].ops.begin(), forward[f].ops.end());
  }
  for (size_t f = first; f <= exit; ++f) r.steps.push_back(f);
  std::sort(r.ops.begin(), r.ops.end());
  // The MLP's backward begins at its exit's (without SP, which drops that identity: at the
  // step of its second linear).
  const std::vector<WorkStep>& backward = block(0, pb, true).steps;
  r.at = exit_after(backward, g, first_linear);
  if (r.at == SIZE_MAX) r.at = holding(backward, g, last_linear);
  return r;
}

void Lowering::run_op(const PipelineOp& op, std::vector<OpSpan>& spans) {
  const size_t first_task = static_cast<size_t>(g_.num_tasks());
  op_pieces(op, [](bool, auto&& piece) { piece(); });
  const std::pair<size_t, size_t> range{first_task, static_cast<size_t>(g_.num_tasks())};
  record_spans({&range, 1}, spans);
}

template <class Emit>
void Lowering::op_pieces(const PipelineOp& op, Emit&& emit) {
  const int v = op.chunk * l_.pp + stage_;
  const std::vector<PlacedBlock>& blocks = chunks_[v];
  const bool fsdp = l_.fsdp && !role_.frozen;
  // Pieces may run after this returns: they hold pointers into members, not locals.
  const std::vector<PlacedBlock>* chunk_blocks = &blocks;
  // FSDP2's root unit (Layout::fsdp_root_unit) holds the chunk's blocks outside the layers:
  // gathered at the chunk's start, reduced after its whole backward.
  const bool root = fsdp && l_.fsdp_root_unit;
  auto in_root = [root](const PlacedBlock& pb) { return root && pb.part != Part::kLayer; };
  const FsdpUnit root_unit = root ? fsdp_root(blocks) : FsdpUnit{};
  auto grads_done = [this, fsdp, in_root, chunk_blocks, chunk = op.chunk](size_t b) {
    for (int j : actives_) last_grad_[chunk][b][j] = st_[j].last;
    const PlacedBlock& pb = (*chunk_blocks)[b];
    if (fsdp && !in_root(pb)) fsdp_reduce(fsdp_unit(pb));
  };
  auto all_to_all = [&](const PlacedBlock& pb, size_t s, bool backward) {
    return block(0, pb, backward).steps[s].kind == StepKind::kEpAllToAll;
  };
  // FSDP gathers each block's parameters for its forward and, resharded after it, again for
  // its backward (but those FSDP2 keeps, fsdp_kept_to_backward); a block's all-gather starts
  // once the block before it has started (two blocks' buffers).
  const bool backward = op.kind == PassKind::kBackward;
  const bool gathers =
      fsdp && (op.kind == PassKind::kForward || (backward && l_.fsdp_reshard_after_forward));
  // Megatron-FSDP prefetches: a unit's pre-forward hook all-gathers it and the next unit in
  // forward order, its pre-backward hook the one before it (megatron_fsdp.py
  // _pre_forward_param_unshard / _pre_backward_param_unshard; AllGatherPipeline
  // all_gather_params adds buckets up to suggested_AG_prefetch_size, at least one more unit),
  // so its host issues a block's gather as the block before it begins, not as the block
  // itself does. The gather's GPU dependency stays the block before that; what moves is
  // when the host gets to it, which matters where the host waits inside a block (the MoE
  // dispatcher's token counts). Under full recompute the pre-backward hook fires once the
  // block is recomputed. FSDP2 issues each gather from its own unit's hook.
  const bool prefetch = gathers && !l_.torch_fsdp2();
  const int pass = backward ? kB : kF;
  auto gather = [this, pass](FsdpUnit u) {
    const Bytes gathered = fsdp_gather(u, fsdp_after_);
    for (int j : actives_) fsdp_after_[j] = st_[j].last;
    if (l_.torch_fsdp2()) fsdp_copy_out(u, gathered, pass);
  };
  // Scatter/gather pipeline transfers: the chunk's input (forward) or its output's gradient
  // (backward) arrives from another stage in tp pieces, all-gathered over the TP group
  // before the chunk runs (Megatron-LM's gather_split_1d_tensor, on the compute stream's
  // order). pipeline_p2p makes the transfer a dependency of this, the op's first task.
  if (op.kind != PassKind::kWeight && l_.pp > 1) {
    const bool fwd = op.kind == PassKind::kForward;
    const int from = fwd ? v - 1 : v + 1;
    if (from >= 0 && from < vstages_) {
      const Bytes gathered =
          costs_[0][0][chunks_[fwd ? from : v].back().module].boundary_gather_bytes;
      if (gathered.count() > 0) {
        if (pp_gather_names_.empty()) pp_gather_names_.resize(2 * static_cast<size_t>(vstages_));
        sim::LabelId& name = pp_gather_names_[2 * static_cast<size_t>(v) + (fwd ? 0 : 1)];
        if (!name.valid())
          name =
              g_.label(fmt::format("v{} -> v{} {} gather", from, v, fwd ? "activation" : "grad"));
        emit(false, [this, gathered, name] {
          collective(CollectiveKind::kAllGather, gathered, {cat_pp_, name}, tp_groups_);
        });
      }
    }
  }
  // The distributed optimizer's parameter all-gathers beside the chunk's first forward
  // (gathers_params_in_forward): one chunk, a bucket's before its first (lowest) block,
  // issued once the bucket before it has started; interleaved, whole chunks ahead.
  const bool bucket_gathers =
      op.kind == PassKind::kForward && op.micro_batch == 0 && !fsdp && !buckets_.empty();
  const bool by_chunk = l_.vpp > 1;
  // Interleaved: the chunks whose all-gathers this forward launches (param_syncs_), emitted
  // after the op's first block, so that the op's first task is its compute's; they follow
  // the op before it, not the pipeline's receive.
  std::vector<int> syncs;
  if (op.kind == PassKind::kForward)
    for (const ParamSync& ps : param_syncs_)
      if (ps.at_chunk == op.chunk && ps.at_micro_batch == op.micro_batch) syncs.push_back(ps.chunk);
  if (gathers || bucket_gathers || !syncs.empty())
    emit(false, [this] {
      for (int j : actives_) fsdp_after_[j] = st_[j].last;
    });
  if (gathers && !backward && !root_unit.blocks.empty())
    emit(false, [gather, root_unit] { gather(root_unit); });
  // Full recompute beside the EP overlap (Megatron-Core's recompute_vpp_stage): the chunk's
  // whole forward re-runs as its backward starts, layer after layer, before the merged
  // pair's first exchange: its all-to-alls exposed, as Megatron-Core says (pieces that end
  // no exchange); the layers' activations are all held while the chunk's backward runs.
  // Full recompute: block b's forward steps again, each piece ending where an all-to-all
  // does unless `exposed`.
  // A multi-token-prediction block re-runs its checkpointed steps only (checkpointed()).
  auto replay_layer = [&](size_t b, bool exposed) {
    const PlacedBlock* pb = &blocks[b];
    const Labels* replay = &labels(v, b, kR);
    const sim::LabelId rl = replay->compute;
    for (const auto& [first, end] : replays(*pb).checkpointed)
      for (size_t s = first; s < end; ++s)
        emit(!exposed && all_to_all(*pb, s, false),
             [this, pb, s, replay, rl] { run_step(*pb, s, kR, *replay, rl); });
  };
  const bool chunk_replay =
      backward && l_.recompute == models::Recompute::kFull && l_.ep_comm_overlap && !role_.frozen;
  if (chunk_replay)
    for (size_t b = 0; b < blocks.size(); ++b)
      if (blocks[b].has_layers()) replay_layer(b, true);
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const size_t b = op.kind == PassKind::kForward ? bi : blocks.size() - 1 - bi;
    const PlacedBlock* pb = &blocks[b];
    const size_t nsteps = block(0, *pb, op.kind == PassKind::kBackward).steps.size();
    // Prefetching, the next block's gather follows what this block's would have: the
    // compute before this block (fsdp_after_, taken as the block starts).
    std::function<void()> prefetch_next;
    if (prefetch) {
      emit(false, [this] {
        for (int j : actives_) {
          fsdp_after_[j] = st_[j].last;
          if (st_[j].prefetched.valid()) st_[j].gathered = std::exchange(st_[j].prefetched, {});
        }
      });
      if (bi == 0) emit(false, [gather, u = fsdp_unit(*pb)] { gather(u); });
      if (bi + 1 < blocks.size()) {
        const size_t next = backward ? b - 1 : b + 1;
        // gather() sets `gathered`; swapped around it, the block's own gather stays there and
        // the new one lands in `prefetched` (empty before: each block start consumes it).
        prefetch_next = [this, gather, u = fsdp_unit(blocks[next])] {
          for (int j : actives_) std::swap(st_[j].gathered, st_[j].prefetched);
          gather(u);
          for (int j : actives_) std::swap(st_[j].gathered, st_[j].prefetched);
        };
      }
      if (!backward && prefetch_next) emit(false, prefetch_next);
    } else if (gathers && !in_root(*pb) && !(backward && fsdp_kept_to_backward(blocks, b))) {
      // (Megatron-FSDP, prefetching above, has no root unit and keeps nothing gathered.)
      emit(false, [gather, u = fsdp_unit(*pb)] { gather(u); });
    }
    if (bucket_gathers)
      for (size_t i = 0; i < buckets_.size(); ++i)
        if (buckets_[i].chunk == op.chunk && buckets_[i].first == b)
          emit(false, [this, i, by_chunk] {
            if (!by_chunk) gather_bucket_params(i, fsdp_after_);
            for (int j : actives_) {
              if (bucket_gathered_[i][j].valid()) st_[j].gathered = bucket_gathered_[i][j];
              if (!by_chunk) fsdp_after_[j] = st_[j].last;
            }
          });
    switch (op.kind) {
      case PassKind::kForward: {
        const Labels* lb = &labels(v, b, kF);
        for (size_t s = 0; s < nsteps; ++s)
          emit(all_to_all(*pb, s, false),
               [this, pb, s, lb] { run_step(*pb, s, kF, *lb, lb->compute); });
        if (bi == 0)
          for (int chunk : syncs)
            emit(false, [this, chunk] { gather_chunk_params(chunk, fsdp_after_); });
        break;
      }
      case PassKind::kBackward: {
        const bool recompute = l_.recompute != models::Recompute::kNone;
        const sim::LabelId rl = recompute ? labels(v, b, kR).compute : sim::LabelId();
        if (l_.recompute == models::Recompute::kFull && pb->has_layers() && !chunk_replay)
          replay_layer(b, false);
        if (prefetch_next) emit(false, prefetch_next);
        const Labels* lb = &labels(v, b, kB);
        // The "moe" recompute module (a checkpointed MoE layer, MoELayer.forward under
        // tensor_parallel.checkpoint) re-runs the layer's forward before its backward: its
        // all-to-alls (and the dispatch's split sizes) are sent again, here, as the backward
        // reaches the step after the combine; its compute re-runs as the selective modules'
        // does, before each step's backward (cost.recompute).
        // A checkpointed dense MLP ("mlp") or shared experts ("shared_experts") re-run their
        // forward, TP collectives included, as their output's gradient arrives.
        const Replays& replay_at = replays(*pb);
        const MoeReplay& moe = replay_at.moe;
        const MlpReplay& mlp = replay_at.mlp;
        for (size_t s = nsteps; s-- > 0;) {
          if (moe.at == s) {
            const Labels* replay = &labels(v, b, kR);
            for (size_t f : moe.steps)
              emit(all_to_all(*pb, f, false),
                   [this, pb, f, replay, rl] { run_step(*pb, f, kR, *replay, rl); });
          }
          if (mlp.at == s) {
            const Labels* replay = &labels(v, b, kR);
            for (size_t f : mlp.steps)
              emit(false, [this, pb, f, replay, rl] { run_step(*pb, f, kR, *replay, rl); });
          }
          emit(all_to_all(*pb, s, true), [this, pb, s, lb, rl, mb = op.micro_batch] {
            backward_mb_ = mb;
            run_step(*pb, s, kB, *lb, rl);
          });
        }
        if (!split_w_) emit(false, [grads_done, b] { grads_done(b); });
        break;
      }
      case PassKind::kWeight: {
        const Labels* lb = &labels(v, b, kW);
        const sim::KernelListId k = kernels(*pb, 0, false, Use::kWgrad);
        emit(false, [this, pb, lb, k, grads_done, b] {
          for (int j : actives_) {
            PassCost sum;
            for (const WorkStep& step : block(j, *pb).steps) sum += step.cost;
            compute(j, sum.wgrad, sum.wgrad_flops, kW, lb->compute, k);
          }
          grads_done(b);
        });
        break;
      }
    }
  }
  // Delayed scaling's amax all-reduce (reduces_amax()) as the chunk's forward and backward
  // end: 3 amaxes per FP8 GEMM forward (input, weight, output), 2 backward, four GEMMs a
  // layer.
  if (!amax_groups_.ids.empty() && op.kind != PassKind::kWeight) {
    int64_t layers = 0;
    for (const PlacedBlock& pb : blocks) layers += pb.has_layers();
    const int64_t amaxes = 4 * layers * (op.kind == PassKind::kForward ? 3 : 2);
    if (amaxes > 0)
      emit(false, [this, amaxes, fwd = op.kind == PassKind::kForward] {
        collective(CollectiveKind::kAllReduce, Bytes(4 * amaxes),
                   {cat_amax_, fwd ? amax_fwd_ : amax_bwd_}, amax_groups_, kTpStream);
      });
  }
  // The root unit reduces once the chunk's last gradient is done (FSDP2's final callback).
  if (!root_unit.blocks.empty() && op.kind == (split_w_ ? PassKind::kWeight : PassKind::kBackward))
    emit(false, [this, root_unit] { fsdp_reduce(root_unit); });
}

void Lowering::run_merged(size_t i) {
  const std::vector<PipelineOp>& order = orders_[stage_];
  struct Program {
    size_t op = 0;
    std::vector<std::function<void()>> pieces;
    std::vector<bool> ends_all_to_all;
    std::vector<RankState> state;
    std::vector<TaskId> fsdp_after;  // FSDP: what the op's next all-gather follows
    std::vector<std::pair<size_t, size_t>> ranges;
    size_t next = 0;
  };
  // [0] the backward, which starts (its combine's all-to-all beside the forward's
  // attention), [1] the forward.
  Program progs[2];
  progs[0].op = order[i].kind == PassKind::kBackward ? i : i + 1;
  progs[1].op = progs[0].op == i ? i + 1 : i;
  for (Program& p : progs) {
    op_pieces(order[p.op], [&p](bool a2a, auto&& piece) {
      p.pieces.emplace_back(std::move(piece));
      p.ends_all_to_all.push_back(a2a);
    });
    p.state = st_;
    p.fsdp_after = fsdp_after_;
  }
  int turn = 0, last = 0;
  while (progs[0].next < progs[0].pieces.size() || progs[1].next < progs[1].pieces.size()) {
    Program& p = progs[turn];
    if (p.next < p.pieces.size()) {
      std::swap(st_, p.state);
      std::swap(fsdp_after_, p.fsdp_after);
      const size_t begin = static_cast<size_t>(g_.num_tasks());
      while (p.next < p.pieces.size()) {
        const bool a2a = p.ends_all_to_all[p.next];
        p.pieces[p.next++]();
        if (a2a) break;
      }
      p.ranges.emplace_back(begin, static_cast<size_t>(g_.num_tasks()));
      // Userbuffers (tp_comm_overlap): a ring collective is consumed by the linear or TP exit
      // right after it, never across an all-to-all, so ring_ needs no state per program.
      for (TaskId t : ring_)
        HETPAR_CHECK(!t.valid(), "a userbuffers collective in flight across an all-to-all");
      std::swap(st_, p.state);
      std::swap(fsdp_after_, p.fsdp_after);
      last = turn;
    }
    turn ^= 1;
  }
  for (Program& p : progs) {
    std::swap(st_, p.state);
    record_spans(p.ranges, spans_[stage_][p.op]);
    std::swap(st_, p.state);
  }
  st_ = std::move(progs[last].state);  // both end with compute: the stream orders the rest
  fsdp_after_ = std::move(progs[last].fsdp_after);
}

void Lowering::record_spans(std::span<const std::pair<size_t, size_t>> ranges,
                            std::vector<OpSpan>& spans) {
  // First and last task of the op on each rank that runs tasks (for the pipeline P2P
  // dependencies), by its index in actives_.
  const int n = stage_ranks();
  spans.assign(actives_.size(), {});
  for (size_t a = 0; a < actives_.size(); ++a) spans[a].last = st_[actives_[a]].last;
  int missing = static_cast<int>(actives_.size());
  for (const auto& [begin, end] : ranges)
    for (size_t t = begin; t < end && missing > 0; ++t) {
      for (const sim::StreamRef& ref : g_.streams(TaskId(static_cast<int32_t>(t)))) {
        const int j = ref.rank.value() - role_.rank_offset - stage_ranks() * stage_;
        if (j >= 0 && j < n && slot_[j] >= 0 && !spans[slot_[j]].first.valid()) {
          spans[slot_[j]].first = TaskId(static_cast<int32_t>(t));
          --missing;
        }
      }
    }
}

void Lowering::build_stage() {
  const int n = stage_ranks();
  group_.resize(n);
  for (int j = 0; j < n; ++j) group_[j] = group_of_rank_[rank_of(j, stage_).value()];
  st_.assign(n, {});
  replays_.clear();  // of this stage's node group's steps
  ring_.assign(n, TaskId());
  fsdp_after_.assign(n, TaskId());
  fsdp_reduced_.assign(n, TaskId());
  // TP groups: tp consecutive local ranks; EP groups: ep consecutive (cp, dp) positions
  // with the same tp rank.
  std::vector<std::vector<int>> locals;
  for (int j0 = 0; j0 < n; j0 += l_.tp) {
    locals.emplace_back();
    for (int i = 0; i < l_.tp; ++i) locals.back().push_back(j0 + i);
  }
  make_groups(tp_groups_, locals);
  // Experts see the stage's n ranks in their own order (Layout::etp): local rank
  // a + etp * (e + ep * d), a the expert-TP rank, e the EP rank, d the expert-DP rank; with
  // etp = tp that is t + tp * x, x = e + ep * d of the dp x cp positions.
  const int etp = l_.expert_tp(), edp = l_.expert_ranks() / l_.ep;
  auto expert_rank = [&](int a, int e, int d) { return a + etp * (e + l_.ep * d); };
  locals.clear();
  if (l_.ep > 1)
    for (int d = 0; d < edp; ++d)
      for (int a = 0; a < etp; ++a) {
        locals.emplace_back();
        for (int e = 0; e < l_.ep; ++e) locals.back().push_back(expert_rank(a, e, d));
      }
  make_groups(ep_groups_, locals);
  // DeepEP and HybridEP (the flex dispatcher) across nodes: each EP group takes whole nodes
  // of equal size (infeasibility()); its members by node, and by local index across them.
  std::vector<std::vector<int>> node_locals, rail_locals;
  size_t nodes = 0;  // that each EP group spans (infeasibility(): all alike)
  if (l_.flex_dispatcher())
    for (const std::vector<int>& group : locals) {
      std::vector<std::vector<int>> by_node;
      NodeId node;
      for (int j : group) {
        const NodeId at = s_.cluster.node_of_gpu(rank_of(j, stage_).value());
        if (by_node.empty() || at != node) by_node.emplace_back();
        node = at;
        by_node.back().push_back(j);
      }
      if (by_node.size() < 2) continue;
      const size_t per_node = by_node.front().size();
      for (size_t i = 0; i < per_node; ++i) {
        rail_locals.emplace_back();
        for (const std::vector<int>& members : by_node) {
          HETPAR_CHECK(members.size() == per_node, "a flex dispatcher's group with unequal nodes");
          rail_locals.back().push_back(members[i]);
        }
      }
      nodes = by_node.size();
      for (std::vector<int>& members : by_node) node_locals.push_back(std::move(members));
    }
  flex_rail_per_byte_ = 0;
  flex_nvlink_per_byte_ = 1;
  if (l_.flex_dispatcher()) {
    const auto& moe = *std::get<models::LlmSpec>(s_.model.modules[s_.model.llm_index()].spec).moe;
    flex_nvlink_per_byte_ = deepep_nvlink_share(moe, l_.ep);
    if (nodes > 1) flex_rail_per_byte_ = deepep_rail_share(moe, static_cast<int64_t>(nodes));
  }
  make_groups(ep_node_groups_, node_locals);
  make_groups(ep_rail_groups_, rail_locals);
  // CP groups (all-gather and a2a CP): the cp ranks of one dp replica with one tp rank;
  // a2a+p2p's a2a level: cp_a2a adjacent ones of them (Megatron's first hierarchical level).
  locals.clear();
  if (l_.cp > 1 && l_.cp_comm != CpComm::kP2P) {
    const int span = l_.cp_comm == CpComm::kAllGather ? l_.cp : l_.cp_heads_split();
    for (int d = 0; d < l_.dp; ++d)
      for (int t = 0; t < l_.tp; ++t)
        for (int q0 = 0; q0 < l_.cp; q0 += span) {
          locals.emplace_back();
          for (int q = q0; q < q0 + span; ++q) locals.back().push_back(t + l_.tp * (q + l_.cp * d));
        }
  }
  make_groups(cp_groups_, locals);
  // DP: the dp x cp ranks with one tp rank; expert DP: those with one ep position too.
  const int cpdp = l_.cp * l_.dp;
  locals.clear();
  for (int t = 0; t < l_.tp; ++t) {
    locals.emplace_back();
    for (int x = 0; x < cpdp; ++x) locals.back().push_back(t + l_.tp * x);
  }
  make_groups(dp_groups_, locals);
  locals.clear();
  if (experts_apart())
    for (int a = 0; a < etp; ++a)
      for (int e = 0; e < l_.ep; ++e) {
        locals.emplace_back();
        for (int d = 0; d < edp; ++d) locals.back().push_back(expert_rank(a, e, d));
      }
  make_groups(edp_groups_, locals);
  // FP8 delayed scaling's amax reduction group (reduces_amax()): the whole stage, tp x cp x dp.
  locals.clear();
  if (reduces_amax()) {
    locals.emplace_back(n);
    for (int j = 0; j < n; ++j) locals.back()[j] = j;
  }
  make_groups(amax_groups_, locals);
  // CP ring: each representative's send (0 -> stride of tp 0 in its replica) and receive
  // (cp-stride -> 0); every other edge of the rings of the replicas it stands for is a copy
  // (stride: cp_a2a under a2a+p2p, whose rings join the cp ranks that far apart, else 1).
  cp_pairs_.assign(actives_.size(), GroupId());
  cp_copies_.assign(actives_.size(), GroupId());
  cp_edge_copies_.assign(n, GroupId());
  const int stride = l_.cp_heads_split();
  const bool ring = l_.cp_ring() > 1;  // not under all-gather or a2a CP
  if (reduced_ && ring && whole_replicas()) {
    const int block = l_.tp * l_.cp;
    for (int d0 = 0; d0 < l_.dp; ++d0) {
      if (owner_[d0 * block] != d0 * block) continue;  // not a representative replica
      for (int t = 0; t < l_.tp; ++t)
        for (int q = 0; q < l_.cp; ++q) {
          members_.clear();
          for (int d = 0; d < l_.dp; ++d)
            if (d != d0 && owner_[d * block] == d0 * block) {
              members_.push_back(rank(t, q, d, stage_));
              members_.push_back(rank(t, (q + stride) % l_.cp, d, stage_));
            }
          if (!members_.empty())
            cp_edge_copies_[t + l_.tp * (q + l_.cp * d0)] = g_.add_group(members_);
        }
    }
  } else if (reduced_ && ring) {
    const int block = l_.tp * l_.cp;
    for (size_t a = 0; a < actives_.size(); ++a) {
      const int d0 = actives_[a] / block;
      HETPAR_CHECK(actives_[a] % block == 0, "CP ring: representatives must be replica leaders");
      const RankId r0 = rank(0, 0, d0, stage_), r1 = rank(0, stride, d0, stage_),
                   rl = rank(0, l_.cp - stride, d0, stage_);
      const RankId pairs[] = {r0, r1, rl, r0};
      cp_pairs_[a] = g_.add_group(pairs);
      members_.clear();
      for (int dp_i = 0; dp_i < l_.dp; ++dp_i) {
        if (owner_[dp_i * block] != actives_[a]) continue;
        for (int t = 0; t < l_.tp; ++t)
          for (int q = 0; q < l_.cp; ++q) {
            if (dp_i == d0 && t == 0 && (q == 0 || q == l_.cp - stride)) continue;
            members_.push_back(rank(t, q, dp_i, stage_));
            members_.push_back(rank(t, (q + stride) % l_.cp, dp_i, stage_));
          }
      }
      if (!members_.empty()) cp_copies_[a] = g_.add_group(members_);
    }
  }
  last_grad_.assign(l_.vpp, {});
  for (int c = 0; c < l_.vpp; ++c)
    last_grad_[c].assign(chunks_[c * l_.pp + stage_].size(), std::vector<TaskId>(n));
  const std::vector<PipelineOp>& order = orders_[stage_];
  spans_[stage_].resize(order.size());
}

}  // namespace lowering

using lowering::hetero_reduction;
using lowering::lower_heterogeneous;
using lowering::Lowering;
using lowering::replica_classes;

bool simulates_representatives(const Scenario& s, const Plan& p) {
  if (p.placement == Placement::kHomogeneous) return replica_classes(s, p.layout, 0).has_value();
  std::vector<Boundary> bounds;
  for (const ModulePlan& mp : p.modules) bounds.push_back(make_boundary(s, p, mp));
  return hetero_reduction(s, p, bounds).has_value();
}

bool ranks_share_compute(const Scenario& s) {
  // Per node group, not per node: a search asks for every candidate it estimates.
  const auto& groups = s.cluster.groups();
  return std::any_of(groups.begin(), groups.end(), [](const hardware::NodeGroup& g) {
    return g.profile.shared_compute_units > 0;
  });
}

// About how many tasks lower() builds for `p`: simulated ranks x micro-batches x layers x
// tasks per layer and pass (forward, backward). A layer is one compute task, or with
// tp > 1 five compute stretches between four TP collectives (sequence parallelism's
// all-gathers and reduce-scatters); CP's ring attention turns one stretch into cp parts
// and cp - 1 transfers; EP adds its all-to-alls. Simulated ranks (lower.h): one
// representative per stage, a whole representative replica (colocated three-phase), or
// every rank.
double estimated_tasks(const Scenario& s, const Plan& p, bool every_rank) {
  auto per_layer = [](const Layout& l) {
    return (l.tp > 1 ? 9.0 : 1.0) + (l.cp > 1 ? 2.0 * (l.cp - 1) : 0.0) + (l.ep > 1 ? 4.0 : 0.0);
  };
  auto layers_of = [&](const std::string& module) -> double {
    const std::optional<size_t> i = s.model.find(module);
    const models::TransformerSpec* t =
        i ? models::transformer_of(s.model.modules[*i].spec) : nullptr;
    return t ? static_cast<double>(t->layers) : 1.0;
  };
  const int64_t gb = s.workload.global_batch;
  const Layout& L = p.layout;
  const bool alike = !every_rank && !ranks_share_compute(s) && simulates_representatives(s, p);
  const bool whole = p.placement == Placement::kColocated && L.pp > 1;
  const double replica = whole ? static_cast<double>(L.tp * L.cp) : 1.0;
  const double ranks = alike ? replica * L.pp : L.world();
  const double llm_layers = layers_of(s.model.modules[s.model.llm_index()].name);
  const double m = static_cast<double>(num_micro_batches(L, gb));
  double tasks = ranks * m * (llm_layers / L.pp * per_layer(L) + 2) * 2;
  if (p.placement == Placement::kHomogeneous)  // encoders on the first stage, same layout
    for (const models::Module& mod : s.model.modules)
      if (models::is_encoder(models::kind_of(mod.spec)))
        tasks += (alike ? 1.0 : L.tp * L.cp * L.dp) * m * layers_of(mod.name) * per_layer(L) * 2;
  for (const ModulePlan& e : p.modules) {
    const Layout& E = e.layout;
    const double enc_ranks = !alike ? E.world() : whole ? replica * L.pp : E.pp;
    const double steps = static_cast<double>(gb / (int64_t{E.micro_batch} * E.dp));
    tasks += enc_ranks * steps * (layers_of(e.module) / E.pp * per_layer(E) + 2) * 2;
  }
  return tasks;
}

Result<LoweredPlan> lower(const Scenario& s, const Plan& p, const LowerOptions& o) {
  std::string why = infeasibility(s, p);
  if (!why.empty()) return Status::invalid_argument(why);
  bool userbuffers = p.layout.tp_comm_overlap;
  for (const ModulePlan& m : p.modules) userbuffers = userbuffers || m.layout.tp_comm_overlap;
  if (o.kernels && userbuffers)
    return Status::invalid_argument(
        "tp_comm_overlap: the executor runs each TP collective as one NCCL call after its "
        "GEMM, not as userbuffers' chunked ring exchange");
  LoweredPlan out;
  if (o.reuse) {
    out.graph = std::move(*o.reuse);
    out.graph.clear();
  }
  if (p.placement == Placement::kHomogeneous)
    Lowering(s, p, o, out).run();
  else
    lower_heterogeneous(s, p, o, out);
  return out;
}

}  // namespace hetpar::planner
