#include "hetpar/planner/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>

#include "hetpar/core/check.h"

namespace hetpar::planner {

bool splits_weight_gradient(Schedule s) {
  return s == Schedule::kZeroBubble;
}

namespace {

using Ops = std::vector<PipelineOp>;

// PipeDream-flush over micro-batches 0..m-1 of one chunk, warm-up forwards first.
void one_f_one_b(Ops& out, int64_t warmup, int64_t m) {
  warmup = std::min(warmup, m);
  for (int64_t i = 0; i < warmup; ++i) out.push_back({PassKind::kForward, i, 0});
  for (int64_t i = 0; i + warmup < m; ++i) {
    out.push_back({PassKind::kForward, i + warmup, 0});
    out.push_back({PassKind::kBackward, i, 0});
  }
  for (int64_t i = std::max<int64_t>(m - warmup, 0); i < m; ++i)
    out.push_back({PassKind::kBackward, i, 0});
}

// Megatron-Core's interleaved order (get_schedule_table): virtual micro-batch k of the
// forward (backward) pass, the micro-batches in groups of `group`, the last group (from
// `last`) taking the rest, each group through chunk 0, then chunk 1, ...
PipelineOp virtual_op(PassKind kind, int64_t k, int vpp, int64_t m, int64_t group) {
  const int64_t last = (m - 1) / group * group;
  int64_t size = group, first = (k / (group * vpp)) * group, within = k % (group * vpp);
  if (k >= last * vpp) {
    size = m - last;
    first = last;
    within = k - last * vpp;
  }
  int chunk = static_cast<int>(within / size);
  if (kind == PassKind::kBackward) chunk = vpp - 1 - chunk;
  return {kind, first + within % size, chunk};
}

void interleaved(Ops& out, int stage, int pp, int vpp, int64_t m, int extra_warmup, int64_t group) {
  const int64_t total = m * vpp;
  const int64_t warmup = std::min<int64_t>(
      total, static_cast<int64_t>(pp - stage - 1) * 2 + (vpp - 1) * group + extra_warmup);
  auto op = [&](PassKind kind, int64_t k) { return virtual_op(kind, k, vpp, m, group); };
  for (int64_t k = 0; k < warmup; ++k) out.push_back(op(PassKind::kForward, k));
  for (int64_t k = 0; k + warmup < total; ++k) {
    out.push_back(op(PassKind::kForward, k + warmup));
    out.push_back(op(PassKind::kBackward, k));
  }
  for (int64_t k = total - warmup; k < total; ++k) out.push_back(op(PassKind::kBackward, k));
}

// 1F1B's F/B order with a W after each B, up to `defer` of them held back to the end.
void zero_bubble_h1(Ops& out, int stage, int pp, int64_t m) {
  Ops fb;
  one_f_one_b(fb, pp - stage - 1, m);
  const size_t defer = static_cast<size_t>(stage);
  std::deque<int64_t> pending;
  for (const PipelineOp& op : fb) {
    out.push_back(op);
    if (op.kind != PassKind::kBackward) continue;
    pending.push_back(op.micro_batch);
    if (pending.size() > defer) {
      out.push_back({PassKind::kWeight, pending.front(), 0});
      pending.pop_front();
    }
  }
  for (int64_t mb : pending) out.push_back({PassKind::kWeight, mb, 0});
}

}  // namespace

bool interleaved_group_ok(int pp, int64_t m, int64_t group) {
  if (group == 0) group = pp;
  const int64_t rest = m % group;
  return pp <= group && group <= m && (rest == 0 || rest >= pp);
}

int64_t smallest_interleaved_group(int pp, int64_t m) {
  for (int64_t group = pp; group <= m; ++group)
    if (interleaved_group_ok(pp, m, group)) return group;
  return 0;
}

std::vector<PipelineOp> stage_order(Schedule s, int stage, int pp, int vpp, int64_t m,
                                    int extra_warmup, int64_t group) {
  HETPAR_CHECK(pp >= 1 && stage >= 0 && stage < pp && m >= 1 && vpp >= 1,
               "bad pipeline: stage {} of {}, vpp {}, {} micro-batches", stage, pp, vpp, m);
  HETPAR_CHECK((s == Schedule::kInterleaved) == (vpp > 1),
               "vpp {} needs the interleaved schedule and it needs vpp > 1", vpp);
  Ops out;
  out.reserve(static_cast<size_t>(m * vpp * (splits_weight_gradient(s) ? 3 : 2)));
  switch (s) {
    case Schedule::kGpipe:
      for (int64_t i = 0; i < m; ++i) out.push_back({PassKind::kForward, i, 0});
      for (int64_t i = 0; i < m; ++i) out.push_back({PassKind::kBackward, i, 0});
      break;
    case Schedule::k1F1B:
      one_f_one_b(out, pp - stage - 1, m);
      break;
    case Schedule::kInterleaved:
      HETPAR_CHECK(interleaved_group_ok(pp, m, group),
                   "interleaved schedule: {} micro-batches in groups of {} on pp {}", m, group, pp);
      interleaved(out, stage, pp, vpp, m, extra_warmup, group > 0 ? group : pp);
      break;
    case Schedule::kZeroBubble:
      zero_bubble_h1(out, stage, pp, m);
      break;
  }
  return out;
}

PipelineCalls blocking_calls(Schedule s, const std::vector<PipelineOp>& order, int stage, int pp) {
  const int32_t n = static_cast<int32_t>(order.size());
  PipelineCalls pc;
  pc.send_call.assign(order.size(), -1);
  pc.recv_call.assign(order.size(), -1);
  if (s != Schedule::kInterleaved) {
    for (int32_t a = -1; a < n; ++a) {
      const bool split = a >= 0 && a + 1 < n && order[a].kind == order[a + 1].kind;
      if (a >= 0) pc.send_call[a] = static_cast<int32_t>(pc.calls.size());
      if (a + 1 < n) pc.recv_call[a + 1] = static_cast<int32_t>(pc.calls.size());
      pc.calls.push_back({a, split});
    }
    return pc;
  }
  // Every forward in the warm-up (too few micro-batches for a steady state): after the last
  // one a send_forward_recv_forward, then a recv_backward.
  const auto first_b = std::find_if(order.begin(), order.end(), [](const PipelineOp& op) {
    return op.kind == PassKind::kBackward;
  });
  const bool all_warmup = std::none_of(
      first_b, order.end(), [](const PipelineOp& op) { return op.kind == PassKind::kForward; });
  for (int32_t a = -1; a < n; ++a) {
    const bool f_then_b = a >= 0 && a + 1 < n && order[a].kind == PassKind::kForward &&
                          order[a + 1].kind == PassKind::kBackward;
    if (f_then_b && !all_warmup) continue;
    pc.calls.push_back({a, f_then_b});
  }
  size_t c = 0;
  for (int32_t i = 0; i < n; ++i) {  // calls[c] is the last one before op i
    while (c + 1 < pc.calls.size() && pc.calls[c + 1].after_op < i) ++c;
    pc.recv_call[i] = static_cast<int32_t>(c);
    pc.send_call[i] = static_cast<int32_t>(c + 1);
  }
  if (pp < 2 || (stage != 0 && stage != pp - 1)) return pc;
  // The leading stage: the input of (mb, chunk) from the ending stage's (mb, chunk -/+ 1),
  // virtual micro-batch k of its pass, comes in the call after this stage's k + pp - 1.
  int64_t m = 0;
  int last_chunk = 0;
  for (const PipelineOp& op : order) {
    m = std::max(m, op.micro_batch + 1);
    last_chunk = std::max(last_chunk, op.chunk);
  }
  std::vector<int32_t> pass[2];  // op index of the k-th F / B
  std::vector<size_t> vid[2];    // [pass][chunk * m + mb]: its k
  for (int p = 0; p < 2; ++p) vid[p].resize(static_cast<size_t>(m * (last_chunk + 1)));
  for (int32_t i = 0; i < n; ++i) {
    const PipelineOp& op = order[i];
    const int p = op.kind == PassKind::kForward ? 0 : 1;
    vid[p][static_cast<size_t>(op.chunk * m + op.micro_batch)] = pass[p].size();
    pass[p].push_back(i);
  }
  for (int32_t i = 0; i < n; ++i) {
    const PipelineOp& op = order[i];
    const bool fwd = op.kind == PassKind::kForward;
    const bool wraps = fwd ? stage == 0 && op.chunk > 0 : stage == pp - 1 && op.chunk < last_chunk;
    if (!wraps) continue;
    const int p = fwd ? 0 : 1;
    const int from = op.chunk + (fwd ? -1 : 1);
    const size_t k = vid[p][static_cast<size_t>(from * m + op.micro_batch)] + pp - 1;
    if (k < pass[p].size()) pc.recv_call[i] = std::min(pc.recv_call[i], pc.send_call[pass[p][k]]);
  }
  return pc;
}

bool merges_passes(Schedule s, int pp) {
  return s == Schedule::kInterleaved || (s == Schedule::k1F1B && pp == 1);
}

int extra_warmup(const Layout& l) {
  return l.ep_comm_overlap ? 1 : 0;
}

int64_t microbatch_group(const Layout& l) {
  return l.microbatch_group > 0 ? l.microbatch_group : l.pp;
}

int64_t peak_in_flight(const std::vector<PipelineOp>& order) {
  const bool split = std::any_of(order.begin(), order.end(),
                                 [](const PipelineOp& op) { return op.kind == PassKind::kWeight; });
  const PassKind release = split ? PassKind::kWeight : PassKind::kBackward;
  int64_t now = 0, peak = 0;
  for (const PipelineOp& op : order) {
    if (op.kind == PassKind::kForward) peak = std::max(peak, ++now);
    if (op.kind == release) --now;
  }
  return peak;
}

std::vector<int64_t> layers_per_virtual_stage(const Layout& l, int64_t layers, std::string* why) {
  const int pp = l.pp, vpp = l.vpp;
  const int64_t chunks = int64_t{pp} * vpp;
  auto fail = [&](std::string text) {
    if (why) *why = std::move(text);
    return std::vector<int64_t>();
  };
  const bool first = l.first_stage_layers > 0, last = l.last_stage_layers > 0;
  const bool accounted = l.account_for_embedding || l.account_for_loss;
  if (!l.pipeline_layout.empty()) {
    if (first || last || accounted)
      return fail(
          "pipeline_layout cannot be combined with first/last_stage_layers or "
          "account_for_embedding/loss");
    if (static_cast<int64_t>(l.pipeline_layout.size()) != chunks)
      return fail(fmt::format("pipeline_layout has {} entries, pp {} x vpp {} needs {}",
                              l.pipeline_layout.size(), pp, vpp, chunks));
    int64_t sum = 0;
    for (int n : l.pipeline_layout) {
      if (n < 0) return fail(fmt::format("pipeline_layout holds {} layers in a stage", n));
      sum += n;
    }
    if (sum != layers)
      return fail(fmt::format("pipeline_layout places {} layers, the llm has {}", sum, layers));
    return std::vector<int64_t>(l.pipeline_layout.begin(), l.pipeline_layout.end());
  }
  if (first || last) {
    if (accounted)
      return fail("first/last_stage_layers and account_for_embedding/loss cannot be combined");
    const int given = (first ? 1 : 0) + (last ? 1 : 0);
    if (pp < 2)
      return fail(fmt::format("first_stage_layers / last_stage_layers need pp >= 2, got {}", pp));
    const int64_t rest = layers - l.first_stage_layers - l.last_stage_layers;
    const int middle = pp - given;
    if (rest < 0 || (middle == 0 && rest != 0) || (middle > 0 && rest % middle != 0))
      return fail(fmt::format(
          "llm layers {} minus first_stage_layers {} and last_stage_layers {} do not split "
          "evenly over the other {} pipeline stages",
          layers, l.first_stage_layers, l.last_stage_layers, middle));
    std::vector<int64_t> stage(pp, middle > 0 ? rest / middle : 0);
    if (first) stage[0] = l.first_stage_layers;
    if (last) stage[pp - 1] = l.last_stage_layers;
    std::vector<int64_t> out(static_cast<size_t>(chunks));
    for (int s = 0; s < pp; ++s) {
      if (stage[s] % vpp != 0)
        return fail(fmt::format("pipeline stage {} holds {} layers, not divisible by vpp {}", s,
                                stage[s], vpp));
      for (int c = 0; c < vpp; ++c) out[static_cast<size_t>(c) * pp + s] = stage[s] / vpp;
    }
    return out;
  }
  const int64_t slots = layers + (l.account_for_embedding ? 1 : 0) + (l.account_for_loss ? 1 : 0);
  if (slots % chunks != 0) {
    if (accounted)
      return fail(
          fmt::format("pp {} x vpp {} does not divide llm layers {} plus the {} counted as layers",
                      pp, vpp, layers,
                      l.account_for_embedding && l.account_for_loss ? "embedding and loss"
                      : l.account_for_embedding                     ? "embedding"
                                                                    : "loss"));
    return fail(fmt::format(
        "pp {} x vpp {} does not divide llm layers {} (an uneven split: first_stage_layers / "
        "last_stage_layers, or account_for_embedding / account_for_loss)",
        pp, vpp, layers));
  }
  std::vector<int64_t> out(static_cast<size_t>(chunks), slots / chunks);
  if (l.account_for_embedding) --out.front();
  if (l.account_for_loss) --out.back();
  for (int64_t n : out)
    if (n < 0) return fail("a virtual stage would hold fewer than zero layers");
  return out;
}

}  // namespace hetpar::planner
