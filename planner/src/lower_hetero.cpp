// Heterogeneous plans (lowering.h): each encoder and the LLM a Lowering of its own modules
// on its own ranks, joined by the boundary communicator's tasks, and the symmetry reduction
// that lets representatives stand for alike replicas.
#include "lowering.h"

namespace hetpar::planner::lowering {

std::optional<HeteroReduction> hetero_reduction(const Scenario& s, const Plan& p,
                                                const std::vector<Boundary>& bounds) {
  const bool colocated = p.placement == Placement::kColocated;
  const Layout& L = p.layout;
  const bool three_phase = colocated && L.pp > 1;
  const std::optional<std::vector<int>> llm_kinds =
      replica_classes(s, L, colocated ? 0 : p.llm_first_rank, three_phase);
  if (!llm_kinds) return std::nullopt;
  // Replicas on different kinds of node (one class per kind) only where every module's
  // replica is fed from its own GPUs: colocated with the LLM at pp 1. Non-colocated, a
  // replica's boundary traffic would also depend on the kind of its feeders' nodes. Three
  // phases come close but not exactly: on the mixed example's colocated PP2 plan the
  // representatives' dp_comm differs from every rank's (0.0630 against 0.0634 s per rank,
  // 5e-5 of the iteration; the first task apart is the H100 stage's first gradient
  // reduce-scatter, 2.97 against 3.16 ms, beside the pipeline's gradient transfers), so
  // those plans keep every rank.
  const bool kinds_apart = colocated && !three_phase;
  auto one_kind = [](const std::vector<int>& kinds) {
    return std::all_of(kinds.begin(), kinds.end(), [](int c) { return c == 0; });
  };
  if (!kinds_apart && !one_kind(*llm_kinds)) return std::nullopt;
  const int world = s.cluster.total_gpus();
  HeteroReduction r;
  r.llm.replica_class.assign(static_cast<size_t>(L.dp), 0);
  r.llm.whole_replicas = three_phase;
  // Colocated, LLM pp 1: every GPU runs the same program (one class each). Three phases:
  // LLM replicas alike (each fed from its own GPUs), encoder replicas by which of their LLM
  // replica's micro-batches they feed. Non-colocated: LLM replicas by their place among an
  // encoder replica's fan-out destinations (d mod the fan-outs' lcm), encoder replicas by
  // their fan-in index and the class of the LLM replicas they feed.
  int period = 1;
  if (!colocated)
    for (const Boundary& b : bounds) period = std::lcm(period, b.fan_out);
  // Each class also keeps to one kind of node (replica_classes): (place, kind) pairs.
  std::map<std::pair<int, int>, int> llm_ids;
  for (int d = 0; d < L.dp; ++d)
    r.llm.replica_class[d] =
        llm_ids.emplace(std::pair{d % period, (*llm_kinds)[d]}, static_cast<int>(llm_ids.size()))
            .first->second;
  for (size_t k = 0; k < bounds.size(); ++k) {
    const Boundary& b = bounds[k];
    const Layout& E = p.modules[k].layout;
    if (three_phase && b.local_block == 0) return std::nullopt;
    const std::optional<std::vector<int>> kinds =
        replica_classes(s, E, colocated ? 0 : p.modules[k].first_rank);
    if (!kinds || (!kinds_apart && !one_kind(*kinds))) return std::nullopt;
    Reduction& er = r.encoders.emplace_back();
    er.whole_replicas = three_phase;
    std::map<std::tuple<int, int, int>, int> ids;
    for (int e = 0; e < E.dp; ++e) {
      std::pair<int, int> key{0, 0};
      if (three_phase) key.first = b.feeder_index(e);
      if (!colocated) {
        const int first_fed = b.fan_out > 1 ? e * b.fan_out : e / b.fan_in;
        key = {b.feeder_index(e), first_fed % period};
      }
      const std::tuple<int, int, int> full{key.first, key.second, (*kinds)[e]};
      er.replica_class.push_back(ids.emplace(full, static_cast<int>(ids.size())).first->second);
    }
    // Boundary routes alike within a class: for the pairs of one encoder step, whether
    // the leaders share the GPU or the node is the class representative's.
    if (colocated && !three_phase) continue;
    const int llm_first = colocated ? 0 : p.llm_first_rank;
    // The encoder's leaders sit on its last stage.
    const int enc_first = colocated ? 0 : p.modules[k].first_rank + (E.pp - 1) * E.tp * E.dp;
    for (int64_t i = 0; i < b.llm_per_step; ++i) {
      std::vector<int> route_of_class(static_cast<size_t>(period), -1);
      for (int d = 0; d < L.dp; ++d) {
        const int src = enc_first + b.source_replica(d, i) * E.tp;
        const int dst = llm_first + d * L.tp * L.cp;
        const int route = src == dst                                                 ? 0
                          : s.cluster.node_of_gpu(src) == s.cluster.node_of_gpu(dst) ? 1
                                                                                     : 2;
        int& known = route_of_class[static_cast<size_t>(r.llm.replica_class[d])];
        if (known >= 0 && known != route) return std::nullopt;
        known = route;
      }
    }
  }
  // Multiplicities per GPU; colocated modules must agree on every GPU they share.
  r.multiplicity.assign(static_cast<size_t>(world), -1);
  auto claim = [&](const Layout& l, const Reduction& red, int offset) {
    const std::vector<int> own = owners(l, red);
    std::vector<int32_t> count(own.size(), 0);
    for (int o : own) ++count[static_cast<size_t>(o)];
    for (int st = 0; st < l.pp; ++st)
      for (size_t j = 0; j < own.size(); ++j) {
        int32_t& m = r.multiplicity[static_cast<size_t>(offset) + st * own.size() + j];
        if (m >= 0 && m != count[j]) return false;
        m = count[j];
      }
    return true;
  };
  if (!claim(L, r.llm, colocated ? 0 : p.llm_first_rank)) return std::nullopt;
  for (size_t k = 0; k < bounds.size(); ++k)
    if (!claim(p.modules[k].layout, r.encoders[k], colocated ? 0 : p.modules[k].first_rank))
      return std::nullopt;
  return r;
}

void lower_heterogeneous(const Scenario& s, const Plan& p, const LowerOptions& o,
                         LoweredPlan& out) {
  const bool colocated = p.placement == Placement::kColocated;
  const Layout& L = p.layout;
  // Colocated with LLM pp > 1: three phases (every encoder forward, the LLM's pipeline, every
  // encoder backward); the boundary then moves data as non-colocated (leader P2P +
  // broadcast), a leader sending to itself being a dependency only.
  const bool three_phase = colocated && L.pp > 1;
  const size_t llm_index = s.model.llm_index();
  out.world = s.cluster.total_gpus();
  out.network = build_network(s.cluster);
  sim::TaskGraph& g = out.graph;
  const sim::LabelId cat = g.label("boundary_comm");

  std::vector<Boundary> bounds;
  for (const ModulePlan& mp : p.modules) bounds.push_back(make_boundary(s, p, mp));
  std::optional<HeteroReduction> red;
  if (!o.full_ranks) red = hetero_reduction(s, p, bounds);
  out.representatives = red.has_value();
  if (red)
    for (int r = 0; r < out.world; ++r)
      if (red->multiplicity[r] >= 0) g.set_multiplicity(RankId(r), red->multiplicity[r]);

  Role llm_role;
  llm_role.modules = {llm_index};
  llm_role.rank_offset = colocated ? 0 : p.llm_first_rank;
  if (red) llm_role.reduction = red->llm;
  Lowering llm(s, p, o, out, llm_role);
  const std::vector<PipelineOp> llm0 = stage_order(
      p.schedule, 0, L.pp, L.vpp, s.workload.global_batch / (int64_t{L.micro_batch} * L.dp),
      extra_warmup(L), microbatch_group(L));
  const int nenc = static_cast<int>(p.modules.size());
  std::vector<std::unique_ptr<Lowering>> encs;
  std::vector<std::vector<MergedOp>> merged(p.modules.size());
  for (size_t k = 0; k < p.modules.size(); ++k) {
    const ModulePlan& mp = p.modules[k];
    Role r;
    r.layout = &mp.layout;
    r.modules = {bounds[k].encoder};
    for (const models::Edge& e : s.model.edges)
      if (e.from == bounds[k].encoder &&
          models::kind_of(s.model.modules[e.to].spec) == models::ModuleKind::kProjector)
        r.modules.push_back(e.to);
    r.rank_offset = colocated ? 0 : mp.first_rank;
    r.stream_offset = kCommStreams * static_cast<int32_t>(k + 1);
    r.encoder_categories = true;
    r.frozen = s.workload.frozen_encoders;
    for (int st = 0; st < mp.layout.pp; ++st)
      r.orders.push_back(
          three_phase ? three_phase_program(bounds[k], r.frozen)
          : colocated ? encoder_program(bounds[k], llm0, r.frozen, &merged[k])
                      : leading_stage_program(bounds[k], llm0, L.pp, r.frozen, mp.layout.pp, st));
    r.prefix = mp.module + " ";
    if (red) r.reduction = red->encoders[k];
    encs.push_back(std::make_unique<Lowering>(s, p, o, out, std::move(r)));
  }
  out.micro_batches = llm0.empty() ? 0 : s.workload.global_batch / (int64_t{L.micro_batch} * L.dp);

  if (three_phase) {
    for (auto& e : encs) {
      e->setup();
      e->begin_stage(0);
      for (size_t i = 0; i < e->order(0).size(); ++i)
        if (e->order(0)[i].kind == PassKind::kForward) e->op(i);
    }
    llm.run();
    for (auto& e : encs) {
      for (size_t i = 0; i < e->order(0).size(); ++i)
        if (e->order(0)[i].kind == PassKind::kBackward) e->op(i);
      e->end_stage();
      e->finish();
    }
  } else if (colocated) {  // one stage each, on the same ranks: interleave the programs
    llm.setup();
    llm.begin_stage(0);
    for (auto& e : encs) {
      e->setup();
      e->begin_stage(0);
    }
    // With several encoders, each runs its ops just before the LLM op they precede.
    std::vector<size_t> pos(encs.size(), 0);
    for (size_t i = 0; i < llm0.size(); ++i) {
      for (size_t k = 0; k < encs.size(); ++k)
        while (pos[k] < merged[k].size() && merged[k][pos[k]].encoder)
          encs[k]->op(merged[k][pos[k]++].index);
      for (size_t k = 0; k < encs.size(); ++k) ++pos[k];  // the LLM op itself
      llm.op(i);
      for (size_t k = 0; k < encs.size(); ++k)  // encoder backwards right after it
        while (pos[k] < merged[k].size() && merged[k][pos[k]].encoder &&
               encs[k]->order(0)[merged[k][pos[k]].index].kind == PassKind::kBackward)
          encs[k]->op(merged[k][pos[k]++].index);
    }
    for (auto& e : encs) {
      e->end_stage();
      e->finish();
    }
    llm.end_stage();
    llm.finish();
  } else {
    for (auto& e : encs) e->run();
    llm.run();
  }

  // Op indices of (kind, micro-batch) in a single-stage program (chunk 0).
  auto index_of = [](const std::vector<PipelineOp>& order, PassKind kind, int64_t m) {
    std::vector<int64_t> idx(static_cast<size_t>(m), -1);
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i].kind == kind && order[i].chunk == 0)
        idx[static_cast<size_t>(order[i].micro_batch)] = static_cast<int64_t>(i);
    return idx;
  };
  const int64_t ml = llm.micro_batches();
  const std::vector<int64_t> lf = index_of(llm.order(0), PassKind::kForward, ml);
  const std::vector<int64_t> lb = index_of(llm.order(0), PassKind::kBackward, ml);
  const int llm_group = L.tp * L.cp;  // one LLM replica's ranks on stage 0
  std::vector<RankId> members;
  for (size_t k = 0; k < encs.size(); ++k) {
    Lowering& enc = *encs[k];
    const Boundary& b = bounds[k];
    const Layout& E = p.modules[k].layout;
    const bool frozen = s.workload.frozen_encoders;
    const int es = E.pp - 1;  // the encoder's last stage, where the boundary leaves
    const std::vector<int64_t> ef = index_of(enc.order(es), PassKind::kForward, b.enc_steps);
    const std::vector<int64_t> eb = index_of(enc.order(es), PassKind::kBackward, b.enc_steps);
    const int32_t base = kCommStreams * (nenc + 1) + 6 * static_cast<int32_t>(k);
    const int32_t fwd_send = base, fwd_recv = base + 1, bwd_send = base + 2, bwd_recv = base + 3,
                  fwd_coll = base + 4, bwd_coll = base + 5;
    const std::string& name = p.modules[k].module;
    static constexpr std::string_view kBoundaryStream[] = {
        "activations send", "activations recv",   "gradients send",
        "gradients recv",   "activations gather", "gradients scatter"};
    for (int32_t i = 0; i < 6; ++i)
      g.set_stream_name(sim::StreamKind::kComm, base + i,
                        fmt::format("{} boundary {}", name, kBoundaryStream[i]));
    const sim::LabelId fwd_name = g.label(fmt::format("{} -> llm activation", name));
    const sim::LabelId bwd_name = g.label(fmt::format("llm -> {} grad", name));
    auto collective = [&](CollectiveKind kind, Bytes bytes, int32_t stream, RankId root,
                          sim::LabelId label, GroupId copies) {
      sim::CollectiveSpec spec;
      spec.kind = kind;
      spec.group = members;
      spec.bytes = bytes;
      spec.stream = stream;
      spec.root = root;
      spec.copies = copies;
      return g.add_collective(spec, {cat, label});
    };
    auto group_of = [&](const std::vector<RankId>& ranks) {
      return ranks.empty() ? GroupId() : g.add_group(ranks);
    };
    if (!colocated || three_phase) {
      std::vector<RankId> fwd_pairs, bwd_pairs, llm_copies, enc_copies, cp_copies;
      for (int64_t i = 0; i < ml; ++i)
        for (int d = 0; d < L.dp; ++d) {
          const int jl = d * llm_group;
          if (!llm.simulated(jl)) continue;  // a copy of its class representative's
          const int64_t t = b.step_of(i);
          const int e = b.source_replica(d, i);
          const int je = e * E.tp;
          const RankId enc_leader = enc.rank_of(je, es), llm_leader = llm.rank_of(jl, 0);
          // Reduced: the same transfers of the other LLM replicas of d's class are copies.
          fwd_pairs.clear();
          bwd_pairs.clear();
          llm_copies.clear();
          enc_copies.clear();
          cp_copies.clear();
          for (int d2 = 0; d2 < L.dp && red; ++d2) {
            if (d2 == d || red->llm.replica_class[d2] != red->llm.replica_class[d]) continue;
            const int je2 = b.source_replica(d2, i) * E.tp, jl2 = d2 * llm_group;
            const RankId src = enc.rank_of(je2, es), dst = llm.rank_of(jl2, 0);
            fwd_pairs.insert(fwd_pairs.end(), {src, dst});
            bwd_pairs.insert(bwd_pairs.end(), {dst, src});
            for (int q = 0; q < llm_group; ++q) llm_copies.push_back(llm.rank_of(jl2 + q, 0));
            for (int q = 0; q < E.tp; ++q) enc_copies.push_back(enc.rank_of(je2 + q, es));
            for (int q = 0; q < L.cp; ++q) cp_copies.push_back(llm.rank_of(jl2 + q * L.tp, 0));
          }
          // A leader sending to itself (three-phase colocated): a dependency only.
          TaskId ready = enc.span(es, static_cast<size_t>(ef[t]), enc.owner(je)).last;
          if (enc_leader != llm_leader) {
            const TaskId x = g.add_p2p(enc_leader, llm_leader, b.bytes_per_micro_batch, fwd_send,
                                       fwd_recv, {cat, fwd_name}, group_of(fwd_pairs));
            g.add_dependency(ready, x);
            ready = x;
          }
          if (llm_group > 1) {
            members.clear();
            for (int q = 0; q < llm_group; ++q) members.push_back(llm.rank_of(jl + q, 0));
            const TaskId bc = collective(CollectiveKind::kBroadcast, b.bytes_per_micro_batch,
                                         fwd_coll, llm_leader, fwd_name, group_of(llm_copies));
            g.add_dependency(ready, bc);
            ready = bc;
          }
          for (int q = 0; q < llm_group; ++q)
            if (llm.simulated(jl + q))
              g.add_dependency(ready, llm.span(0, static_cast<size_t>(lf[i]), jl + q).first);
          if (frozen) continue;
          TaskId got = llm.span(0, static_cast<size_t>(lb[i]), jl).last;
          if (L.cp > 1) {  // the leader gathers the CP chunks of the gradient first
            members.clear();
            for (int q = 0; q < L.cp; ++q) members.push_back(llm.rank_of(jl + q * L.tp, 0));
            got = collective(CollectiveKind::kAllGather, b.bytes_per_micro_batch, bwd_coll,
                             RankId(), bwd_name, group_of(cp_copies));
            for (int q = 0; q < L.cp; ++q)
              if (llm.simulated(jl + q * L.tp))
                g.add_dependency(llm.span(0, static_cast<size_t>(lb[i]), jl + q * L.tp).last, got);
          }
          if (enc_leader != llm_leader) {
            const TaskId y = g.add_p2p(llm_leader, enc_leader, b.bytes_per_micro_batch, bwd_send,
                                       bwd_recv, {cat, bwd_name}, group_of(bwd_pairs));
            g.add_dependency(got, y);
            got = y;
          }
          if (E.tp > 1) {
            members.clear();
            for (int q = 0; q < E.tp; ++q) members.push_back(enc.rank_of(je + q, es));
            const TaskId bc = collective(CollectiveKind::kBroadcast, b.bytes_per_micro_batch,
                                         bwd_coll, enc_leader, bwd_name, group_of(enc_copies));
            g.add_dependency(got, bc);
            got = bc;
          }
          for (int q = 0; q < E.tp; ++q)
            if (enc.simulated(je + q))
              g.add_dependency(got, enc.span(es, static_cast<size_t>(eb[t]), je + q).first);
        }
      continue;
    }
    // Colocated (pp 1): rank r is local rank r of both (one stage each, offset 0). Groups
    // of GPUs; reduced (the GPUs of one node group alike, one simulated per node group):
    // only the groups holding a simulated GPU, each with the other groups on its node group
    // as its copies.
    struct Groups {
      std::vector<std::vector<RankId>> all;
      std::vector<size_t> emitted;
      std::vector<GroupId> copies;  // per emitted group
    };
    auto make = [&](std::vector<std::vector<RankId>> all) {
      Groups gs;
      gs.all = std::move(all);
      auto kind = [&](size_t q) { return s.cluster.group_of_gpu(gs.all[q].front().value()); };
      std::vector<size_t> rest;
      for (size_t q = 0; q < gs.all.size(); ++q) {
        const bool sim = std::any_of(gs.all[q].begin(), gs.all[q].end(),
                                     [&](RankId r) { return g.multiplicity(r) != 0; });
        (sim || !red ? gs.emitted : rest).push_back(q);
      }
      std::vector<std::vector<RankId>> copies(gs.emitted.size());
      for (size_t q : rest) {
        size_t e = 0;
        while (e < gs.emitted.size() && kind(gs.emitted[e]) != kind(q)) ++e;
        HETPAR_CHECK(e < gs.emitted.size(), "colocated reduction: a node group simulates none");
        copies[e].insert(copies[e].end(), gs.all[q].begin(), gs.all[q].end());
      }
      for (const std::vector<RankId>& c : copies) gs.copies.push_back(group_of(c));
      return gs;
    };
    const int world = out.world;
    // Forward fan-in: the gather groups (the fan_in encoder ranks with one encoder TP index
    // in the replicas feeding one LLM replica).
    Groups gather;
    if (b.fan_in > 1) {
      std::vector<std::vector<RankId>> all;
      for (int d = 0; d < L.dp; ++d)
        for (int tt = 0; tt < E.tp; ++tt) {
          all.emplace_back();
          for (int q = 0; q < b.fan_in; ++q)
            all.back().push_back(RankId(tt + E.tp * (d * b.fan_in + q)));
        }
      gather = make(std::move(all));
    }
    // Backward: over the LLM ranks with one TP index that hold parts of the gradient one
    // encoder replica needs: fan-out, the sibling slices of the r LLM replicas it spans (and,
    // with cp > 1, every CP chunk of each: r x cp members); fan-in / equal with cp > 1, the
    // CP chunks of one replica. Groups {r0 + q*tp}, CP index fastest.
    Groups back;
    const int n = (b.fan_out > 1 ? b.fan_out : 1) * L.cp;
    if (b.fan_out > 1 || L.cp > 1) {
      const int stride = L.tp;
      std::vector<std::vector<RankId>> all;
      for (int r0 = 0; r0 < world; ++r0) {
        if ((r0 % (stride * n)) >= stride) continue;
        all.emplace_back();
        for (int u = 0; u < n; ++u) all.back().push_back(RankId(r0 + u * stride));
      }
      back = make(std::move(all));
    }
    // An all-gather over each emitted group of `groups`, after op `from_op` of `from` and
    // before op `to_op` of `to` on each simulated member.
    auto gathers = [&](const Groups& groups, Bytes bytes, int32_t stream, sim::LabelId name,
                       const Lowering& from, size_t from_op, const Lowering& to, size_t to_op) {
      for (size_t e = 0; e < groups.emitted.size(); ++e) {
        members = groups.all[groups.emitted[e]];
        const TaskId ag =
            collective(CollectiveKind::kAllGather, bytes, stream, RankId(), name, groups.copies[e]);
        for (RankId r : members) {
          if (g.multiplicity(r) == 0) continue;
          g.add_dependency(from.span(0, from_op, r.value()).last, ag);
          g.add_dependency(ag, to.span(0, to_op, r.value()).first);
        }
      }
    };
    const Bytes step_bytes = b.bytes_per_micro_batch * b.llm_per_step;  // per LLM replica
    for (int64_t t = 0; t < b.enc_steps; ++t) {
      const int64_t i0 = t * b.llm_per_step, i1 = i0 + b.llm_per_step - 1;
      const size_t enc_f = static_cast<size_t>(ef[t]), llm_f = static_cast<size_t>(lf[i0]);
      // Forward.
      if (b.fan_in > 1) {
        gathers(gather, step_bytes, fwd_coll, fwd_name, enc, enc_f, llm, llm_f);
      } else {  // equal: pass-through; fan-out: narrow to the local slice
        for (int r = 0; r < world; ++r)
          if (g.multiplicity(RankId(r)) != 0)
            g.add_dependency(enc.span(0, enc_f, r).last, llm.span(0, llm_f, r).first);
      }
      if (frozen) continue;
      // Backward: after the step's last LLM micro-batch backward on every rank.
      const size_t enc_b = static_cast<size_t>(eb[t]), llm_b = static_cast<size_t>(lb[i1]);
      if (b.fan_out > 1 || L.cp > 1) {
        const Bytes bytes = b.fan_out > 1 ? step_bytes * b.fan_out : step_bytes;
        gathers(back, bytes, bwd_coll, bwd_name, llm, llm_b, enc, enc_b);
      } else {
        for (int r = 0; r < world; ++r)
          if (g.multiplicity(RankId(r)) != 0)
            g.add_dependency(llm.span(0, llm_b, r).last, enc.span(0, enc_b, r).first);
      }
    }
  }
}

}  // namespace hetpar::planner::lowering
