#include "hetpar/planner/schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <tuple>

namespace hetpar::planner {
namespace {

struct Case {
  Schedule s;
  int pp, vpp;
  int64_t m;
};

// Every (kind, micro-batch, chunk) exactly once; per micro-batch chunk F before B before W.
TEST(Schedule, EveryPassExactlyOnceInDependencyOrder) {
  const Case cases[] = {{Schedule::kGpipe, 4, 1, 6},       {Schedule::k1F1B, 4, 1, 8},
                        {Schedule::k1F1B, 4, 1, 2},        {Schedule::k1F1B, 1, 1, 3},
                        {Schedule::kInterleaved, 4, 2, 8}, {Schedule::kInterleaved, 2, 3, 4},
                        {Schedule::kInterleaved, 4, 2, 4}, {Schedule::kZeroBubble, 4, 1, 8},
                        {Schedule::kZeroBubble, 3, 1, 2}};
  for (const Case& c : cases)
    for (int stage = 0; stage < c.pp; ++stage) {
      auto order = stage_order(c.s, stage, c.pp, c.vpp, c.m);
      std::map<std::tuple<int, int64_t, int>, int> pos;
      for (size_t i = 0; i < order.size(); ++i) {
        auto key =
            std::tuple(static_cast<int>(order[i].kind), order[i].micro_batch, order[i].chunk);
        EXPECT_TRUE(pos.emplace(key, static_cast<int>(i)).second) << "duplicate op";
      }
      const bool w = splits_weight_gradient(c.s);
      EXPECT_EQ(order.size(), static_cast<size_t>(c.m * c.vpp * (w ? 3 : 2)));
      for (int64_t mb = 0; mb < c.m; ++mb)
        for (int ch = 0; ch < c.vpp; ++ch) {
          int f = pos.at({0, mb, ch}), b = pos.at({1, mb, ch});
          EXPECT_LT(f, b);
          if (w) {
            EXPECT_LT(b, pos.at({2, mb, ch}));
          }
        }
    }
}

TEST(Schedule, OneFOneBWarmsUpWithPpMinusStageMinusOneForwards) {
  auto order = stage_order(Schedule::k1F1B, 1, 4, 1, 8);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(order[i].kind, PassKind::kForward) << i;
  EXPECT_EQ(order[2], (PipelineOp{PassKind::kForward, 2, 0}));
  EXPECT_EQ(order[3], (PipelineOp{PassKind::kBackward, 0, 0}));
  EXPECT_EQ(peak_in_flight(order), 3);
  EXPECT_EQ(peak_in_flight(stage_order(Schedule::k1F1B, 0, 4, 1, 8)), 4);
  EXPECT_EQ(peak_in_flight(stage_order(Schedule::k1F1B, 0, 4, 1, 2)), 2);
  EXPECT_EQ(peak_in_flight(stage_order(Schedule::kGpipe, 0, 4, 1, 8)), 8);
}

// Megatron-LM's interleaved order for pp 2, vpp 2, 4 micro-batches on stage 0: warm-up
// (2-0-1)*2 + (2-1)*2 = 4 forwards: mb0 c0, mb1 c0, mb0 c1, mb1 c1; then 1F1B.
TEST(Schedule, InterleavedFollowsMegatron) {
  auto order = stage_order(Schedule::kInterleaved, 0, 2, 2, 4);
  const PipelineOp expect[] = {
      {PassKind::kForward, 0, 0},  {PassKind::kForward, 1, 0},  {PassKind::kForward, 0, 1},
      {PassKind::kForward, 1, 1},  {PassKind::kForward, 2, 0},  {PassKind::kBackward, 0, 1},
      {PassKind::kForward, 3, 0},  {PassKind::kBackward, 1, 1}, {PassKind::kForward, 2, 1},
      {PassKind::kBackward, 0, 0}, {PassKind::kForward, 3, 1},  {PassKind::kBackward, 1, 0},
      {PassKind::kBackward, 2, 1}, {PassKind::kBackward, 3, 1}, {PassKind::kBackward, 2, 0},
      {PassKind::kBackward, 3, 0}};
  ASSERT_EQ(order.size(), std::size(expect));
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], expect[i]) << i;
}

// Megatron-LM's blocking calls (schedules.py). Interleaved, the order above: a call before
// the first op and after each warm-up forward; in the steady state one after each
// forward-backward pair, sending both outputs and receiving the next forward's and
// backward's inputs; in the cool-down one after each backward.
TEST(Schedule, BlockingCallsFollowMegatron) {
  const auto order = stage_order(Schedule::kInterleaved, 0, 2, 2, 4);
  const PipelineCalls pc = blocking_calls(Schedule::kInterleaved, order);
  const int32_t after[] = {-1, 0, 1, 2, 3, 5, 7, 9, 11, 12, 13, 14, 15};
  ASSERT_EQ(pc.calls.size(), std::size(after));
  for (size_t c = 0; c < pc.calls.size(); ++c) {
    EXPECT_EQ(pc.calls[c].after_op, after[c]) << c;
    EXPECT_FALSE(pc.calls[c].sends_first) << c;
  }
  EXPECT_EQ(pc.recv_call[0], 0);
  EXPECT_EQ(pc.send_call[3], 4);  // the last warm-up forward's own call
  EXPECT_EQ(pc.recv_call[4], 4);  // ... receives the first steady forward's input
  EXPECT_EQ(pc.recv_call[5], 4);  // ... and the first backward's
  EXPECT_EQ(pc.send_call[4], 5);  // a steady forward's output leaves after its backward
  EXPECT_EQ(pc.send_call[5], 5);
  EXPECT_EQ(pc.recv_call[6], 5);
  EXPECT_EQ(pc.send_call[15], 12);

  // Every forward in the warm-up (pp 2, vpp 2, 2 micro-batches): after the last forward a
  // send, then the first backward's receive.
  const auto warm = stage_order(Schedule::kInterleaved, 0, 2, 2, 2);
  const PipelineCalls wc = blocking_calls(Schedule::kInterleaved, warm);
  ASSERT_EQ(wc.calls.size(), warm.size() + 1);
  for (size_t c = 0; c < wc.calls.size(); ++c) EXPECT_EQ(wc.calls[c].sends_first, c == 4) << c;

  // 1F1B (stage 1 of 4: F0 F1 F2 B0 F3 B1 ...): a call after every op; between two
  // forwards send_forward then recv_forward, between a forward and a backward one
  // send_forward_recv_backward.
  const auto one = stage_order(Schedule::k1F1B, 1, 4, 1, 8);
  const PipelineCalls oc = blocking_calls(Schedule::k1F1B, one);
  ASSERT_EQ(oc.calls.size(), one.size() + 1);
  for (size_t c = 0; c < oc.calls.size(); ++c) EXPECT_EQ(oc.calls[c].after_op, int32_t(c) - 1);
  EXPECT_TRUE(oc.calls[1].sends_first);               // F0 -> F1
  EXPECT_FALSE(oc.calls[3].sends_first);              // F2 -> B0
  EXPECT_FALSE(oc.calls[4].sends_first);              // B0 -> F3
  EXPECT_TRUE(oc.calls[one.size() - 1].sends_first);  // cool-down B -> B
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(oc.send_call[i], static_cast<int32_t>(i) + 1);
    EXPECT_EQ(oc.recv_call[i], static_cast<int32_t>(i));
  }
}

// Under the EP all-to-all overlap Megatron-Core warms up one more virtual micro-batch:
// the same ops, the steady pairs one forward later (stage 1 of pp 2, vpp 2: 2 + 1 warm-up
// forwards, then forward, backward, ...), each steady backward beside a forward of another
// micro-batch.
TEST(Schedule, InterleavedWarmsUpOneMoreForTheEpOverlap) {
  auto plain = stage_order(Schedule::kInterleaved, 1, 2, 2, 4);
  auto more = stage_order(Schedule::kInterleaved, 1, 2, 2, 4, 1);
  ASSERT_EQ(more.size(), plain.size());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(more[i].kind, PassKind::kForward) << i;
  EXPECT_EQ(plain[3].kind, PassKind::kBackward);
  EXPECT_EQ(more[4], plain[3]);  // the first backward, one forward later
  EXPECT_EQ(peak_in_flight(more), peak_in_flight(plain) + 1);
  for (size_t i = 4; i + 1 < more.size(); i += 2)
    if (more[i].kind == PassKind::kBackward && more[i + 1].kind == PassKind::kForward) {
      EXPECT_NE(more[i].micro_batch, more[i + 1].micro_batch) << i;
    }
}

// Megatron-Core's micro-batch groups (get_schedule_table, microbatch_group_size_per_vp_stage):
// pp 2, vpp 2, 8 micro-batches in groups of 3, the last one the remaining 2: forwards run
// mb 0-2 on chunk 0, mb 0-2 on chunk 1, mb 3-5 on both, then mb 6-7 on both; stage 0 warms
// up (2-0-1)*2 + (2-1)*3 = 5 chunk forwards. The default group (pp) is the plain order.
TEST(Schedule, InterleavedGroupsMicroBatchesPerVirtualStage) {
  const auto order = stage_order(Schedule::kInterleaved, 0, 2, 2, 8, 0, 3);
  std::vector<PipelineOp> forwards, backwards;
  for (const PipelineOp& op : order)
    (op.kind == PassKind::kForward ? forwards : backwards).push_back(op);
  const std::pair<int64_t, int> table[] = {{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1}, {2, 1},
                                           {3, 0}, {4, 0}, {5, 0}, {3, 1}, {4, 1}, {5, 1},
                                           {6, 0}, {7, 0}, {6, 1}, {7, 1}};
  ASSERT_EQ(forwards.size(), std::size(table));
  ASSERT_EQ(backwards.size(), std::size(table));
  for (size_t k = 0; k < std::size(table); ++k) {
    EXPECT_EQ(forwards[k], (PipelineOp{PassKind::kForward, table[k].first, table[k].second})) << k;
    // The backward walks the same table with the chunks reversed.
    EXPECT_EQ(backwards[k], (PipelineOp{PassKind::kBackward, table[k].first, 1 - table[k].second}))
        << k;
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(order[i].kind, PassKind::kForward) << i;
  EXPECT_EQ(order[6].kind, PassKind::kBackward);  // the sixth forward, then 1F1B
  // Blocking calls: the first stage takes the last stage's chunk-0 output of virtual
  // micro-batch k in the call after its own forward k + pp - 1 (Megatron-Core's
  // recv_tensor_from_previous_stage), here before the op that uses it: mb 0 on chunk 1
  // (op 3) receives after mb 1's chunk-0 forward (op 1), not after op 2.
  const PipelineCalls pc = blocking_calls(Schedule::kInterleaved, order, 0, 2);
  EXPECT_EQ(order[3], (PipelineOp{PassKind::kForward, 0, 1}));
  EXPECT_EQ(pc.recv_call[3], pc.send_call[1]);
  EXPECT_LT(pc.recv_call[3], blocking_calls(Schedule::kInterleaved, order).recv_call[3]);
  // With the default groups the two rules agree, on the first stage (forward) and the last
  // (backward).
  for (int stage : {0, 3}) {
    const auto plain = stage_order(Schedule::kInterleaved, stage, 4, 3, 8);
    EXPECT_EQ(blocking_calls(Schedule::kInterleaved, plain, stage, 4).recv_call,
              blocking_calls(Schedule::kInterleaved, plain).recv_call)
        << stage;
  }
  for (int stage = 0; stage < 2; ++stage)
    for (int64_t group : {0, 2})
      EXPECT_EQ(stage_order(Schedule::kInterleaved, stage, 2, 2, 8, 0, group),
                stage_order(Schedule::kInterleaved, stage, 2, 2, 8))
          << stage << " " << group;
  // A larger group warms up more: more chunks in flight.
  EXPECT_GT(peak_in_flight(stage_order(Schedule::kInterleaved, 0, 2, 2, 8, 0, 4)),
            peak_in_flight(stage_order(Schedule::kInterleaved, 0, 2, 2, 8)));
  // Megatron-Core's bounds: pp <= group <= m, the last group none or at least pp.
  EXPECT_TRUE(interleaved_group_ok(2, 8, 3));
  EXPECT_FALSE(interleaved_group_ok(2, 7, 3));  // 7 % 3 = 1 < pp
  EXPECT_TRUE(interleaved_group_ok(4, 8, 0));
  EXPECT_FALSE(interleaved_group_ok(4, 6, 0));
  EXPECT_FALSE(interleaved_group_ok(4, 8, 3));   // below pp
  EXPECT_FALSE(interleaved_group_ok(2, 4, 5));   // above m
  EXPECT_FALSE(interleaved_group_ok(4, 13, 6));  // 13 % 6 = 1 < pp
  EXPECT_TRUE(interleaved_group_ok(4, 10, 5));   // m need not be a multiple of pp
}

// ZB-H1 keeps 1F1B's peak (pp on stage 0) on every stage; the last stage defers pp-1 Ws.
TEST(Schedule, ZeroBubbleH1KeepsOneFOneBPeakMemory) {
  for (int stage = 0; stage < 4; ++stage) {
    auto order = stage_order(Schedule::kZeroBubble, stage, 4, 1, 8);
    EXPECT_LE(peak_in_flight(order), 4) << stage;
  }
  auto last = stage_order(Schedule::kZeroBubble, 3, 4, 1, 8);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(last[last.size() - 1 - i].kind, PassKind::kWeight);
  auto first = stage_order(Schedule::kZeroBubble, 0, 4, 1, 8);
  EXPECT_EQ(first[4], (PipelineOp{PassKind::kBackward, 0, 0}));
  EXPECT_EQ(first[5], (PipelineOp{PassKind::kWeight, 0, 0}));
}

TEST(Schedule, LayersPerVirtualStage) {
  Layout l;
  l.pp = 16;
  std::string why;
  EXPECT_TRUE(layers_per_virtual_stage(l, 126, &why).empty());
  EXPECT_NE(why.find("does not divide llm layers 126"), std::string::npos) << why;
  // Llama 3 405B (Meta): one layer less on the first and last stage.
  l.first_stage_layers = l.last_stage_layers = 7;
  std::vector<int64_t> meta = layers_per_virtual_stage(l, 126, &why);
  ASSERT_EQ(meta.size(), 16u);
  EXPECT_EQ(meta.front(), 7);
  EXPECT_EQ(meta.back(), 7);
  EXPECT_EQ(meta[1], 8);
  // Megatron-Bridge: PP8 VPP8 with embedding and loss as layers: 64 chunks of 2 slots.
  Layout b;
  b.pp = 8;
  b.vpp = 8;
  b.account_for_embedding = b.account_for_loss = true;
  std::vector<int64_t> mb = layers_per_virtual_stage(b, 126, &why);
  ASSERT_EQ(mb.size(), 64u);
  EXPECT_EQ(mb.front(), 1);
  EXPECT_EQ(mb.back(), 1);
  EXPECT_EQ(mb[1], 2);
  int64_t sum = 0;
  for (int64_t n : mb) sum += n;
  EXPECT_EQ(sum, 126);
  // Uneven first / last with vpp: each stage's layers divide into its chunks.
  Layout v;
  v.pp = 4;
  v.vpp = 2;
  v.first_stage_layers = 3;
  EXPECT_TRUE(layers_per_virtual_stage(v, 16, &why).empty());
  EXPECT_EQ(why,
            "llm layers 16 minus first_stage_layers 3 and last_stage_layers 0 do not split "
            "evenly over the other 3 pipeline stages");
  EXPECT_TRUE(layers_per_virtual_stage(v, 15, &why).empty());
  EXPECT_EQ(why, "pipeline stage 0 holds 3 layers, not divisible by vpp 2");
  v.first_stage_layers = 2;
  EXPECT_EQ(layers_per_virtual_stage(v, 14, &why), (std::vector<int64_t>{1, 2, 2, 2, 1, 2, 2, 2}));
}

// Layout::pipeline_layout lists every virtual stage's layers (Megatron-Core's
// --pipeline-model-parallel-layout): taken as given, empty stages included, when it has pp x
// vpp entries that add up to the layers and no other uneven split is set.
TEST(Schedule, PipelineLayoutListsEachVirtualStage) {
  Layout l;
  l.pp = 2;
  l.vpp = 2;
  l.pipeline_layout = {1, 6, 0, 7};
  std::string why;
  EXPECT_EQ(layers_per_virtual_stage(l, 14, &why), (std::vector<int64_t>{1, 6, 0, 7}));
  EXPECT_TRUE(layers_per_virtual_stage(l, 15, &why).empty());
  EXPECT_EQ(why, "pipeline_layout places 14 layers, the llm has 15");
  l.pipeline_layout = {7, 7};
  EXPECT_TRUE(layers_per_virtual_stage(l, 14, &why).empty());
  EXPECT_EQ(why, "pipeline_layout has 2 entries, pp 2 x vpp 2 needs 4");
  l.pipeline_layout = {8, -1, 0, 7};
  EXPECT_TRUE(layers_per_virtual_stage(l, 14, &why).empty());
  EXPECT_EQ(why, "pipeline_layout holds -1 layers in a stage");
  l.pipeline_layout = {1, 6, 0, 7};
  l.first_stage_layers = 1;
  EXPECT_TRUE(layers_per_virtual_stage(l, 14, &why).empty());
  EXPECT_NE(why.find("cannot be combined"), std::string::npos) << why;
}

}  // namespace
}  // namespace hetpar::planner
