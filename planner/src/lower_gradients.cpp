// The Lowering's gradients and what follows them (lowering.h): FSDP's gathers and
// reductions, the DP gradient buckets, the optimizer step, the tied embedding's all-reduce
// and the pipeline's blocking calls.
#include "lowering.h"

namespace hetpar::planner::lowering {

void Lowering::drain_deferred_wgrads() {
  const int n = stage_ranks();
  std::vector<TaskId> previous(n), gathered(n);
  for (const DeferredWgrad& d : deferred_) {
    // Each all-gather after the one before, so it runs beside the GEMM before it.
    if (l_.sequence_parallel) regather_input(*d.pb, d.s, d.tp, previous, gathered);
    linear_wgrad(*d.pb, d.s, d.compute, gathered);
    previous = gathered;
  }
}

// Each of the unit's FSDP shard groups in turn (param_parts: dense, then experts apart), for
// groups of two ranks or more; bytes(params) for its part, called right before the part's
// collectives are emitted (it may emit the compute they follow); on_rank(j, task, previous part's
// task on j or invalid).
template <class PartBytes, class OnRank>
Bytes Lowering::fsdp_collectives(const FsdpUnit& u, CollectiveKind kind, PartBytes&& bytes,
                                 int32_t stream, std::string_view what, OnRank&& on_rank) {
  ParamCount dense, expert;  // the unit's blocks' together
  for (const PlacedBlock* pb : u.blocks) {
    dense += block(0, *pb).dense;
    expert += block(0, *pb).expert;
  }
  std::vector<TaskId> previous(st_.size()), current(st_.size());
  Bytes total;
  for (const ParamPart& part : param_parts(dense, expert)) {
    const GroupSet& gs = *part.group;
    if (part.params.all == 0 || gs.locals.empty() || gs.locals[0].size() < 2) continue;
    const sim::LabelId name =
        g_.label(fmt::format("{}fsdp {} {}{} {} stage {}", role_.prefix, sim::to_string(kind),
                             part.prefix, what, u.name, stage_));
    const Bytes b = bytes(part.params);
    dp_collectives(gs, kind, b, stream, {cat_dp_, name}, [&](int j, TaskId c) {
      on_rank(j, c, previous[j]);
      current[j] = c;
    });
    previous = current;
    total += b;
  }
  return total;
}

Lowering::FsdpUnit Lowering::fsdp_root(const std::vector<PlacedBlock>& chunk) const {
  FsdpUnit u{{}, "root"};
  for (const PlacedBlock& pb : chunk)
    if (pb.part != Part::kLayer) u.blocks.push_back(&pb);
  return u;
}

bool Lowering::fsdp_kept_to_backward(const std::vector<PlacedBlock>& chunk, size_t b) const {
  if (!l_.torch_fsdp2()) return false;
  const Part part = chunk[b].part;
  if (part == Part::kPost) return true;
  if (!l_.fsdp_root_unit) return false;
  if (part == Part::kPre) return true;
  return b + 1 < chunk.size() && chunk[b + 1].part == Part::kPost &&
         chunk[b + 1].module == chunk[b].module;
}

Bytes Lowering::fsdp_gather(const FsdpUnit& u, const std::vector<TaskId>& after) {
  // The unit's compute waits for the last gather (rs.gathered).
  return fsdp_collectives(
      u, CollectiveKind::kAllGather, [&](const ParamCount& c) { return held_bytes(c); },
      kFsdpGather, "params",
      [&](int j, TaskId c, TaskId previous) {
        if (after[j].valid()) g_.add_dependency(after[j], c);
        if (previous.valid()) g_.add_dependency(previous, c);
        st_[j].gathered = c;
      });
}

void Lowering::fsdp_copy_out(const FsdpUnit& u, Bytes gathered, int pass) {
  if (gathered.count() == 0) return;
  // Read the flat buffer, write the parameters.
  memory_pass(
      gathered + gathered, pass,
      g_.label(fmt::format("{}fsdp copy-out params {} stage {}", role_.prefix, u.name, stage_)));
}

void Lowering::memory_pass(Bytes moved, int pass, sim::LabelId name) {
  sim::KernelListId k;
  if (o_.kernels) {
    const sim::Kernel copy = sim::memory_kernel(moved.count());
    k = add_kernel_list({&copy, 1});
  }
  for (int j : actives_) {
    const hardware::DeviceProfile& dev = s_.cluster.groups()[group_[j]].profile.gpu;
    compute(j, dev.memory_kernel_time(moved), Flops(), pass, name, k);
  }
}

void Lowering::fsdp_reduce(const FsdpUnit& u) {
  const int64_t gb = gradient_bytes(s_.workload.precision, l_.grad_reduce_dtype);
  // FSDP2's copy-in (foreach_reduce_scatter_copy_in, on the current stream before the
  // reduce-scatter stream waits for it): the part's unsharded gradients, in the parameters'
  // compute dtype, copied (cast) into the flat reduce-scatter buffer in the reduce dtype.
  const int64_t wb = weight_bytes(s_.workload.precision);
  const sim::LabelId copy_in =
      l_.torch_fsdp2()
          ? g_.label(fmt::format("{}fsdp copy-in grads {} stage {}", role_.prefix, u.name, stage_))
          : sim::LabelId();
  auto part_bytes = [&](const ParamCount& c) {
    if (l_.torch_fsdp2()) memory_pass(Bytes(c.all * (wb + gb)), kB, copy_in);
    return Bytes(c.all * gb);
  };
  fsdp_collectives(u, CollectiveKind::kReduceScatter, part_bytes, kDpStream, "grads",
                   [&](int j, TaskId c, TaskId previous) {
                     if (st_[j].last.valid()) g_.add_dependency(st_[j].last, c);
                     if (previous.valid()) g_.add_dependency(previous, c);
                     fsdp_reduced_[j] = c;
                   });
}

std::vector<Lowering::Bucket> Lowering::dp_buckets() const {
  const int64_t bucket_params = o_.bucket_params > 0
                                    ? o_.bucket_params
                                    : std::max<int64_t>(40'000'000, 1'000'000LL * l_.cp * l_.dp);
  std::vector<Bucket> buckets;
  for (int c = l_.vpp - 1; c >= 0; --c) {
    const std::vector<PlacedBlock>& blocks = chunks_[c * l_.pp + stage_];
    Bucket cur{c, blocks.size(), blocks.size(), {}, {}};
    for (size_t b = blocks.size(); b-- > 0;) {
      const Block& blk = block(0, blocks[b]);
      if (cur.first == blocks.size()) cur.last = b;
      cur.first = b;
      cur.dense += blk.dense;
      cur.expert += blk.expert;
      const int64_t all = cur.dense.all + cur.expert.all;
      if (all >= bucket_params || b == 0) {
        if (all > 0) buckets.push_back(cur);
        cur = Bucket{c, blocks.size(), blocks.size(), {}, {}};
      }
    }
  }
  return buckets;
}

std::vector<size_t> Lowering::grad_syncs() const {
  const bool megatron_schedule =
      p_.schedule == Schedule::kInterleaved || p_.schedule == Schedule::k1F1B;
  if (!l_.align_grad_reduce || !l_.overlap_grad_reduce || l_.fsdp || l_.pp == 1 ||
      !megatron_schedule || role_.frozen)
    return {};
  const std::vector<PipelineOp>& order = orders_[stage_];
  const size_t last_op = order.size() - 1;  // after the schedule
  if (l_.vpp == 1)  // the first stage reduces its last backward's buckets as they are ready
    return {stage_ == 0 ? SIZE_MAX : last_op};
  // Interleaved: backward virtual micro-batch k launches the chunk whose last backward is
  // k - pp_rank, so the stages launch together.
  std::vector<size_t> backwards;  // op indices, in order
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i].kind == PassKind::kBackward) backwards.push_back(i);
  std::vector<size_t> syncs(l_.vpp, last_op);
  for (size_t b = 0; b < backwards.size(); ++b) {
    const PipelineOp& op = order[backwards[b]];
    if (op.micro_batch != m_ - 1) continue;  // a chunk's last backward
    const size_t at = b + static_cast<size_t>(stage_);
    if (at < backwards.size()) syncs[op.chunk] = backwards[at];
  }
  return syncs;
}

void Lowering::gather_bucket_params(size_t i, const std::vector<TaskId>& after) {
  const Bucket& bk = buckets_[i];
  std::vector<TaskId>& gathered = bucket_gathered_[i];
  std::vector<TaskId> previous(st_.size());
  const std::vector<PlacedBlock>& blocks = chunks_[bk.chunk * l_.pp + stage_];
  for (const ParamPart& part : param_parts(bk.dense, bk.expert)) {
    const GroupSet& gs = *part.group;
    const Bytes bytes = held_bytes(part.params);
    if (gs.locals.empty() || gs.locals[0].size() < 2 || bytes.count() == 0) continue;
    const sim::LabelId name =
        g_.label(fmt::format("{}dp all_gather {}params bucket {}-{} stage {}", role_.prefix,
                             part.prefix, blocks[bk.first].name, blocks[bk.last].name, stage_));
    dp_collectives(gs, CollectiveKind::kAllGather, bytes, kDpStream, {cat_dp_, name},
                   [&](int j, TaskId c) {
                     if (after[j].valid()) g_.add_dependency(after[j], c);
                     if (previous[j].valid()) g_.add_dependency(previous[j], c);
                     gathered[j] = c;
                   });
    previous = gathered;
  }
}

void Lowering::gather_chunk_params(int chunk, const std::vector<TaskId>& after) {
  for (size_t i = buckets_.size(); i-- > 0;)  // readiness order reversed: forward order
    if (buckets_[i].chunk == chunk) gather_bucket_params(i, after);
}

// DP gradient buckets of this stage (see lower.h), the optimizer step, and the
// distributed optimizer's parameter all-gather.
void Lowering::gradients_and_optimizer() {
  const int n = stage_ranks();
  const int cpdp = l_.cp * l_.dp;
  const int edp = l_.expert_ranks() / l_.ep;
  const bool dist = l_.distributed_optimizer;
  const CollectiveKind reduce = dist ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
  std::vector<Bucket> buckets = dp_buckets();

  // Groups (build_stage): dense gradients over the dp x cp ranks with the same tp rank;
  // expert gradients over the expert-dp ranks (same tp rank and ep position).
  std::vector<TaskId> last_comm(n), first_comm(n);
  const int64_t gb = gradient_bytes(s_.workload.precision, l_.grad_reduce_dtype);
  // One part (param_parts) of a bucket; `what` after the part's prefix in the label.
  auto reduce_over = [&](Bytes bytes, const Bucket& bk, const std::vector<TaskId>& after,
                         CollectiveKind kind, const ParamPart& part, std::string_view what) {
    const GroupSet& gs = *part.group;
    if (gs.locals.empty() || gs.locals[0].size() < 2 || bytes.count() == 0) return;
    const sim::LabelId name = g_.label(
        fmt::format("{}dp {} {}{} bucket {}-{} stage {}", role_.prefix, sim::to_string(kind),
                    part.prefix, what, chunks_[bk.chunk * l_.pp + stage_][bk.first].name,
                    chunks_[bk.chunk * l_.pp + stage_][bk.last].name, stage_));
    dp_collectives(gs, kind, bytes, kDpStream, {cat_dp_, name}, [&](int j, TaskId c) {
      if (after[j].valid()) g_.add_dependency(after[j], c);
      if (!first_comm[j].valid()) first_comm[j] = c;
      last_comm[j] = c;
    });
  };
  std::vector<TaskId> ready(n);
  if (l_.fsdp) {  // reduced block by block after each backward (fsdp_reduce)
    buckets.clear();
    for (int j : actives_) last_comm[j] = fsdp_reduced_[j];
  }
  const std::vector<size_t> syncs = buckets.empty() ? std::vector<size_t>() : grad_syncs();
  for (const Bucket& bk : buckets) {
    const size_t sync = syncs.empty() ? SIZE_MAX : syncs[bk.chunk];
    for (int j : actives_)  // the bucket's lowest block runs its backward last
      ready[j] = !l_.overlap_grad_reduce ? spans_[stage_].back()[slot_[j]].last
                 : sync != SIZE_MAX      ? spans_[stage_][sync][slot_[j]].last
                                         : last_grad_[bk.chunk][bk.first][j];
    for (const ParamPart& part : param_parts(bk.dense, bk.expert))
      reduce_over(Bytes(part.params.all * gb), bk, ready, reduce, part, "grads");
  }

  // The optimizer step over this rank's parameters (its dp shard with the distributed
  // optimizer or FSDP): optimizer_traffic().
  int64_t dense = 0, expert = 0, synced = 0;  // synced: Block::tp_synced, below
  for (int c = 0; c < l_.vpp; ++c)
    for (const PlacedBlock& pb : chunks_[c * l_.pp + stage_]) {
      const Block& b = block(0, pb);
      dense += b.dense.all;
      expert += b.expert.all;
      synced += b.tp_synced;
    }
  const int64_t owned = l_.shards_optimizer_state() ? dense / cpdp + expert / edp : dense + expert;
  const OptimizerTraffic traffic = optimizer_traffic(l_, s_.workload.precision);
  const int64_t step_bytes =
      owned * traffic.per_owned_param + (dense + expert) * traffic.per_held_param;
  // Then (Megatron-LM's finalize_model_grads) the gradients TP replicates but its ranks
  // see apart (Block::tp_synced) all-reduced over TP as one coalesced buffer, and the tied
  // embedding's between the first and last stage.
  if (synced > 0 && !l_.torch_fsdp2()) {
    const sim::LabelId name =
        g_.label(fmt::format("{}layernorm grads all_reduce stage {}", role_.prefix, stage_));
    group_collectives(tp_groups_, CollectiveKind::kAllReduce, Bytes(synced * gb), kTpStream,
                      {cat_tp_, name}, [&](int j, TaskId c) {
                        for (TaskId t : {last_comm[j], st_[j].last})
                          if (t.valid()) g_.add_dependency(t, c);
                        last_comm[j] = c;
                      });
  }
  const std::vector<TaskId> embedding = tied_embedding_all_reduce(last_comm);
  const sim::LabelId opt_name = g_.label(fmt::format("{}optimizer stage {}", role_.prefix, stage_));
  std::vector<TaskId> opt(n);
  sim::KernelListId opt_kernels;
  for (int j : actives_) {
    const hardware::DeviceProfile& dev = s_.cluster.groups()[group_[j]].profile.gpu;
    opt[j] = g_.add_compute(rank_of(j, stage_), 0, dev.memory_kernel_time(Bytes(step_bytes)),
                            Flops(), {cat_opt_, opt_name});
    if (last_comm[j].valid()) g_.add_dependency(last_comm[j], opt[j]);
    if (!embedding.empty()) g_.add_dependency(embedding[j], opt[j]);
    // And whatever the schedule left on another stream for the compute stream to wait for
    // (the last backward's amax all-reduce).
    if (st_[j].need.valid()) g_.add_dependency(st_[j].need, opt[j]);
    if (st_[j].beside.valid()) g_.add_dependency(st_[j].beside, opt[j]);
    if (o_.kernels) {
      if (!opt_kernels.valid()) {
        const sim::Kernel adam = sim::memory_kernel(step_bytes);
        opt_kernels = g_.add_kernels({&adam, 1});
      }
      g_.set_kernels(opt[j], opt_kernels);
    }
  }
  if (stage_ == 0 && ties_embedding()) embedding_opt_ = opt;  // tied_embedding_all_reduce
  if (l_.pp_blocking_p2p && l_.pp > 1) {
    if (after_pipeline_.empty()) after_pipeline_.resize(l_.pp);
    std::vector<AfterPipeline>& after = after_pipeline_[stage_];
    after.assign(actives_.size(), {});
    for (int j : actives_)
      after[slot_[j]] = {opt[j], l_.overlap_grad_reduce ? TaskId() : first_comm[j]};
  }
  // FSDP gathers parameters when a block runs; with overlap_param_gather the distributed
  // optimizer's all-gathers run in the first forward (gathers_params_in_forward).
  if (!dist || l_.fsdp || gathers_params_in_forward()) return;
  // Parameter all-gather after the step, buckets in forward order (the reverse of readiness);
  // with overlap_param_gather (colocated plans) only the first one, the rest hides behind the
  // next forward.
  const size_t gathered =
      l_.overlap_param_gather ? std::min<size_t>(buckets.size(), 1) : buckets.size();
  for (size_t i = 0; i < gathered; ++i) {
    const Bucket& bk = buckets[buckets.size() - 1 - i];
    for (const ParamPart& part : param_parts(bk.dense, bk.expert))
      reduce_over(held_bytes(part.params), bk, opt, CollectiveKind::kAllGather, part, "params");
  }
}

bool Lowering::ties_embedding() const {
  if (!has_llm_ || role_.frozen || l_.pp < 2 || l_.torch_fsdp2()) return false;
  const auto* llm = std::get_if<models::LlmSpec>(&s_.model.modules[s_.model.llm_index()].spec);
  // Multi-token prediction embeds on the last stage too (finalize_model_grads all-reduces
  // the word embeddings' gradients for it as for a tied output layer).
  return llm && (llm->tied_embeddings || llm->mtp_layers > 0);
}

std::vector<TaskId> Lowering::tied_embedding_all_reduce(const std::vector<TaskId>& after) {
  if (!ties_embedding() || (stage_ != 0 && stage_ != l_.pp - 1)) return {};
  const int n = stage_ranks();
  if (stage_ == 0) {
    embedding_ready_.assign(n, {});
    for (int j : actives_) embedding_ready_[j] = {after[j], st_[j].last};
    return {};
  }
  const auto& llm = std::get<models::LlmSpec>(s_.model.modules[s_.model.llm_index()].spec);
  const Bytes bytes(llm.vocab * llm.block.hidden / l_.tp *
                    gradient_bytes(s_.workload.precision, l_.grad_reduce_dtype));
  const sim::LabelId name = g_.label(
      fmt::format("{}tied embedding grads all_reduce stage 0 + {}", role_.prefix, l_.pp - 1));
  // Reduced: each representative's pair stands for the pairs of the ranks it owns.
  std::vector<std::vector<RankId>> copies(n);
  if (reduced_)
    for (int j = 0; j < n; ++j)
      if (!active(j)) {
        copies[owner_[j]].push_back(rank_of(j, 0));
        copies[owner_[j]].push_back(rank_of(j, stage_));
      }
  std::vector<TaskId> reduced(n);
  for (int j : actives_) {
    const RankId pair[] = {rank_of(j, 0), rank_of(j, stage_)};
    sim::CollectiveSpec spec;
    spec.kind = CollectiveKind::kAllReduce;
    spec.group_id = g_.add_group(pair);
    spec.bytes = bytes;
    spec.stream = kEmbeddingStream;
    if (!copies[j].empty()) spec.copies = g_.add_group(copies[j]);
    const TaskId c = g_.add_collective(spec, {cat_dp_, name});
    if (host_) g_.set_host(c, host_op_[group_[j]]);
    for (TaskId t : {embedding_ready_[j].first, embedding_ready_[j].second, after[j], st_[j].last})
      if (t.valid()) g_.add_dependency(t, c);
    g_.add_dependency(c, embedding_opt_[j]);  // the first stage's step (stage 0 came first)
    reduced[j] = c;
  }
  return reduced;
}

// P2P of activations (gradients) from each F (B) to the next (previous) virtual stage.
void Lowering::pipeline_p2p(int stage) {
  const int n = stage_ranks();
  // Op index of (kind, chunk, micro-batch) in each stage's program.
  auto key = [&](PassKind k, int chunk, int64_t mb) {
    return (static_cast<size_t>(k) * l_.vpp + chunk) * static_cast<size_t>(m_) + mb;
  };
  std::vector<std::vector<int32_t>>& index = op_index_;
  if (index.empty()) {
    index.assign(l_.pp, std::vector<int32_t>(3 * l_.vpp * m_, -1));
    for (int st = 0; st < l_.pp; ++st)
      for (size_t i = 0; i < orders_[st].size(); ++i) {
        const PipelineOp& op = orders_[st][i];
        index[st][key(op.kind, op.chunk, op.micro_batch)] = static_cast<int32_t>(i);
      }
  }
  const bool blocked = blocking();
  const size_t na = actives_.size();
  std::vector<sim::LabelId> names(2 * static_cast<size_t>(vstages_));
  // [to_stage][active index]: the transfers of the ranks each representative stands for.
  std::vector<std::vector<GroupId>> copies_to(l_.pp);
  std::vector<bool> copies_built(l_.pp, false);
  for (size_t i = 0; i < orders_[stage].size(); ++i) {
    const PipelineOp& op = orders_[stage][i];
    const int v = op.chunk * l_.pp + stage;
    const bool fwd = op.kind == PassKind::kForward;
    if (op.kind == PassKind::kWeight || (fwd && v + 1 == vstages_) || (!fwd && v == 0)) continue;
    const int to = fwd ? v + 1 : v - 1;
    const int to_stage = to % l_.pp;
    const int32_t k = index[to_stage][key(op.kind, to / l_.pp, op.micro_batch)];
    const PlacedBlock& boundary = chunks_[fwd ? v : to].back();
    const Bytes bytes = costs_[0][0][boundary.module].boundary_bytes;
    const int li = v * 2 + (fwd ? 0 : 1);
    if (!names[li].valid())
      names[li] = g_.label(fmt::format("v{} -> v{} {}", v, to, fwd ? "activation" : "grad"));
    const sim::LabelId name = names[li];
    // Reduced: the representatives' transfers; every other local rank's is a copy of its
    // owner's.
    std::vector<GroupId>& copies = copies_to[to_stage];
    if (!copies_built[to_stage]) {
      copies_built[to_stage] = true;
      copies.assign(actives_.size(), GroupId());
      if (reduced_) {
        std::vector<std::vector<RankId>> pairs(actives_.size());
        for (int j = 0; j < n; ++j) {
          if (active(j)) continue;
          std::vector<RankId>& m = pairs[slot_[owner_[j]]];
          m.push_back(rank_of(j, stage));
          m.push_back(rank_of(j, to_stage));
        }
        for (size_t a = 0; a < actives_.size(); ++a)
          if (!pairs[a].empty()) copies[a] = g_.add_group(pairs[a]);
      }
    }
    for (size_t a = 0; a < actives_.size(); ++a) {
      const int j = actives_[a];
      const TaskId before = spans_[stage][i][a].last, after = spans_[to_stage][k][a].first;
      const RankId src = rank_of(j, stage), dst = rank_of(j, to_stage);
      if (src == dst) {
        g_.add_dependency(before, after);
        continue;
      }
      const TaskId x = g_.add_p2p(src, dst, bytes, fwd ? kFwdSend : kBwdSend,
                                  fwd ? kFwdRecv : kBwdRecv, {cat_pp_, name}, copies[a]);
      g_.add_dependency(before, x);
      g_.add_dependency(x, after);
      if (blocked) {
        sent_[stage][i * na + a] = x;
        received_[to_stage][static_cast<size_t>(k) * na + a] = x;
      }
    }
  }
}

bool Lowering::rendezvous() const {
  return blocking() && role_.orders.empty() && p_.schedule != Schedule::kZeroBubble &&
         !l_.ep_comm_overlap;
}

// The blocking calls on `stage` (schedule.h, blocking_calls): the op after a call waits for
// all it moved (after the last op: what the trainer issues then); with the rendezvous each
// transfer also waits for the calls of both its ends to be issued.
void Lowering::blocking_calls(int stage) {
  const std::vector<PipelineOp>& order = orders_[stage];
  const bool meet = rendezvous();
  // Without the rendezvous: a call after every op, the non-interleaved rule on any order.
  const PipelineCalls pc =
      planner::blocking_calls(meet ? p_.schedule : Schedule::k1F1B, order, stage, l_.pp);
  const int32_t n = static_cast<int32_t>(order.size());
  const size_t na = actives_.size();
  for (size_t a = 0; a < na; ++a) {
    // The op after call c waits for x; after the last op, what the trainer issues then.
    auto hold = [&](TaskId x, int32_t c) {
      const int32_t next = pc.calls[c].after_op + 1;
      if (next < n) {
        const TaskId t = spans_[stage][next][a].first;
        if (t.valid()) g_.add_dependency(x, t);
      } else if (stage < static_cast<int>(after_pipeline_.size()) &&
                 a < after_pipeline_[stage].size()) {  // none for a frozen module
        const AfterPipeline& after_last = after_pipeline_[stage][a];
        for (TaskId t : {after_last.optimizer, after_last.reduction})
          if (t.valid()) g_.add_dependency(x, t);
      }
    };
    auto after_op = [&](int32_t op, TaskId x) {
      if (const TaskId t = spans_[stage][op][a].last; t.valid()) g_.add_dependency(t, x);
    };
    for (int32_t i = 0; i < n; ++i) {
      const size_t at = static_cast<size_t>(i) * na + a;
      if (const TaskId x = sent_[stage][at]; x.valid()) {
        const int32_t c = pc.send_call[i], issued = pc.calls[c].after_op;
        if (issued > i) after_op(issued, x);
        hold(x, c);
      }
      if (!meet) continue;
      if (const TaskId x = received_[stage][at]; x.valid()) {
        const int32_t c = pc.recv_call[i], issued = pc.calls[c].after_op;
        if (issued >= 0) after_op(issued, x);
        if (pc.calls[c].sends_first)
          if (const TaskId y = sent_[stage][static_cast<size_t>(issued) * na + a]; y.valid())
            g_.add_dependency(y, x);
        if (issued + 1 < i) hold(x, c);  // op i itself already waits for its input
      }
    }
  }
}

}  // namespace hetpar::planner::lowering
