#include "hetpar/planner/boundary.h"

#include <fmt/format.h>

#include <algorithm>

#include "hetpar/hardware/precision.h"

namespace hetpar::planner {

int Boundary::source_replica(int d, int64_t i) const {
  if (fan_out > 1) return d / fan_out;
  const int j = static_cast<int>(i % llm_per_step * llm_micro_batch / enc_micro_batch);
  if (local_block == 0) return d * fan_in + j;
  const int per_block = local_block / enc_tp;  // encoder replicas on one stage's block
  return ((j / per_block) * llm_stage_ranks + d * local_block) / enc_tp + j % per_block;
}

int Boundary::feeder_index(int e) const {
  if (fan_in == 1) return 0;
  if (local_block == 0) return e % fan_in;
  const int x = e * enc_tp;  // its first GPU
  const int per_block = local_block / enc_tp;
  return (x / llm_stage_ranks) * per_block + (x % llm_stage_ranks % local_block) / enc_tp;
}

std::string boundary_infeasibility(const Scenario& s, const Plan& p, const ModulePlan& mp) {
  const Layout& e = mp.layout;
  const Layout& l = p.layout;
  const int64_t gb = s.workload.global_batch;
  if (e.micro_batch % l.micro_batch != 0)
    return fmt::format("module \"{}\": micro_batch {} is not a multiple of the llm's {}", mp.module,
                       e.micro_batch, l.micro_batch);
  if (e.dp % l.dp != 0 && l.dp % e.dp != 0)
    return fmt::format(
        "module \"{}\": dp {} and the llm's dp {} must divide one another (boundary fan-in / "
        "fan-out)",
        mp.module, e.dp, l.dp);
  if (gb % (static_cast<int64_t>(e.micro_batch) * e.dp) != 0)
    return fmt::format("module \"{}\": micro_batch {} x dp {} does not divide global_batch {}",
                       mp.module, e.micro_batch, e.dp, gb);
  // Samples one LLM replica takes per encoder step: a whole number of LLM micro-batches.
  const int64_t c = static_cast<int64_t>(e.micro_batch) * e.dp;
  if (c % l.dp != 0 || (c / l.dp) % l.micro_batch != 0)
    return fmt::format(
        "module \"{}\": an encoder step's {} samples do not split into whole llm micro-batches "
        "of {} over llm dp {} (fan-out needs micro_batch divisible by (llm dp / dp) x llm "
        "micro_batch)",
        mp.module, c, l.micro_batch, l.dp);
  return {};
}

Boundary make_boundary(const Scenario& s, const Plan& p, const ModulePlan& mp) {
  Boundary b;
  b.encoder = *s.model.find(mp.module);
  b.enc_dp = mp.layout.dp;
  b.llm_dp = p.layout.dp;
  b.fan_in = b.enc_dp >= b.llm_dp ? b.enc_dp / b.llm_dp : 1;
  b.fan_out = b.llm_dp > b.enc_dp ? b.llm_dp / b.enc_dp : 1;
  b.enc_micro_batch = mp.layout.micro_batch;
  b.llm_micro_batch = p.layout.micro_batch;
  const int64_t gb = s.workload.global_batch;
  b.enc_steps = gb / (b.enc_micro_batch * b.enc_dp);
  b.llm_steps = gb / (b.llm_micro_batch * b.llm_dp);
  b.llm_per_step = b.enc_micro_batch * b.enc_dp / b.llm_dp / b.llm_micro_batch;
  b.tokens_per_sample =
      module_input(s, b.encoder, 1).items_per_sample * modality_tokens_per_item(s.model, b.encoder);
  const auto& llm = std::get<models::LlmSpec>(s.model.modules[s.model.llm_index()].spec);
  b.bytes_per_micro_batch = Bytes(b.llm_micro_batch * b.tokens_per_sample * llm.block.hidden *
                                  hardware::bytes_per_element(s.workload.precision));
  const Layout& l = p.layout;
  b.enc_tp = mp.layout.tp;
  if (p.placement == Placement::kColocated && b.fan_in > 1 && (l.tp * l.cp) % b.enc_tp == 0) {
    b.local_block = l.tp * l.cp;
    b.llm_stage_ranks = l.tp * l.cp * l.dp;
  }
  return b;
}

std::vector<PipelineOp> encoder_program(const Boundary& b, const std::vector<PipelineOp>& llm0,
                                        bool frozen, std::vector<MergedOp>* merged) {
  std::vector<PipelineOp> prog;
  int64_t forwarded = 0;
  std::vector<int64_t> backwards(static_cast<size_t>(b.enc_steps), 0);
  for (size_t i = 0; i < llm0.size(); ++i) {
    const PipelineOp& op = llm0[i];
    const int64_t t = b.step_of(op.micro_batch);
    if (op.kind == PassKind::kForward && op.chunk == 0)
      while (forwarded <= t) {
        if (merged) merged->push_back({true, prog.size()});
        prog.push_back({PassKind::kForward, forwarded++, 0});
      }
    if (merged) merged->push_back({false, i});
    if (op.kind == PassKind::kBackward && op.chunk == 0 && !frozen &&
        ++backwards[static_cast<size_t>(t)] == b.llm_per_step) {
      if (merged) merged->push_back({true, prog.size()});
      prog.push_back({PassKind::kBackward, t, 0});
    }
  }
  return prog;
}

std::vector<PipelineOp> leading_stage_program(const Boundary& b,
                                              const std::vector<PipelineOp>& llm0, int llm_pp,
                                              bool frozen, int enc_pp, int stage) {
  int64_t ahead = (llm_pp + b.llm_per_step - 1) / b.llm_per_step;
  // The steps the LLM's first stage forwards before each step's last backward.
  int64_t furthest = -1;  // the latest step forwarded so far
  for (const PipelineOp& op : llm0) {
    if (op.chunk != 0) continue;
    const int64_t t = b.step_of(op.micro_batch);
    if (op.kind == PassKind::kForward) furthest = std::max(furthest, t);
    if (op.kind == PassKind::kBackward && (op.micro_batch + 1) % b.llm_per_step == 0)
      ahead = std::max(ahead, furthest - t);
  }
  std::vector<PipelineOp> prog;
  for (const PipelineOp& op :
       stage_order(Schedule::k1F1B, stage, enc_pp + static_cast<int>(ahead), 1, b.enc_steps))
    if (!frozen || op.kind == PassKind::kForward) prog.push_back(op);
  return prog;
}

std::vector<PipelineOp> three_phase_program(const Boundary& b, bool frozen) {
  std::vector<PipelineOp> prog;
  for (int64_t t = 0; t < b.enc_steps; ++t) prog.push_back({PassKind::kForward, t, 0});
  if (!frozen)
    for (int64_t t = 0; t < b.enc_steps; ++t) prog.push_back({PassKind::kBackward, t, 0});
  return prog;
}

}  // namespace hetpar::planner
