// The executor in one process: the issue order and per-rank programs built from a task
// graph, the phase grouping, errors before anything runs, and a world-of-one plan executed
// on the cpu backend. tests/executor_mpi_test.cpp runs multi-rank plans under mpirun.
#include "hetpar/executor/executor.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "executor/tiny.h"
#include "hetpar/executor/program.h"
#include "hetpar/planner/lower.h"

namespace hetpar::executor {
namespace {

using testing::tiny;

TEST(Program, OrderFollowsDependenciesAndStreams) {
  sim::TaskGraph g;
  const TaskId a = g.add_compute(RankId(0), 0, Time::us(1), Flops());
  const TaskId b = g.add_compute(RankId(1), 0, Time::us(1), Flops());
  const TaskId x = g.add_p2p(RankId(0), RankId(1), Bytes(8), 3, 4);
  const TaskId c = g.add_compute(RankId(1), 0, Time::us(1), Flops());
  g.add_dependency(a, x);
  g.add_dependency(x, b);  // b (added before x) waits for it
  auto order = issue_order(g);
  ASSERT_TRUE(order.is_ok()) << order.status().to_string();
  auto pos = [&](TaskId t) { return std::find(order->begin(), order->end(), t) - order->begin(); };
  EXPECT_LT(pos(a), pos(x));
  EXPECT_LT(pos(x), pos(b));
  EXPECT_LT(pos(b), pos(c));  // stream order on rank 1
  auto r1 = rank_program(g, *order, 1);
  ASSERT_TRUE(r1.is_ok());
  ASSERT_EQ(r1->tasks.size(), 3u);
  EXPECT_EQ(r1->tasks[0].id, x);
  EXPECT_EQ(r1->tasks[0].stream, 1 + 4);  // comm stream 4 -> runtime stream 5
  EXPECT_EQ(r1->tasks[1].id, b);
  EXPECT_EQ(r1->tasks[1].waits, std::vector<int32_t>{0});  // an event from the recv
  EXPECT_TRUE(r1->tasks[0].recorded);
  EXPECT_EQ(r1->num_streams, 6);
  EXPECT_EQ(r1->foreign_dependencies, 0);
  auto r0 = rank_program(g, *order, 0);
  ASSERT_TRUE(r0.is_ok());
  EXPECT_EQ(r0->tasks.size(), 2u);
}

TEST(Program, CycleIsAnError) {
  sim::TaskGraph g;
  const TaskId a = g.add_compute(RankId(0), 0, Time::us(1), Flops());
  const TaskId b = g.add_compute(RankId(0), 0, Time::us(1), Flops());
  g.add_dependency(b, a);  // against stream order
  auto order = issue_order(g);
  ASSERT_FALSE(order.is_ok());
  EXPECT_NE(order.status().message().find("cycle"), std::string::npos);
}

TEST(Program, RepresentativesCannotRun) {
  const planner::Scenario s = tiny(4);
  auto lp = planner::lower(s, *s.plan);  // one representative per stage
  ASSERT_TRUE(lp.is_ok());
  ASSERT_TRUE(lp->representatives);
  auto order = issue_order(lp->graph);
  ASSERT_TRUE(order.is_ok());
  auto p = rank_program(lp->graph, *order, 0);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("full_ranks"), std::string::npos);
}

TEST(Phases, GroupedAsValidateReportsThem) {
  EXPECT_EQ(phase_of("enc_fwd"), "encoder");
  EXPECT_EQ(phase_of("enc_recompute"), "encoder");
  EXPECT_EQ(phase_of("boundary_comm"), "boundary");
  EXPECT_EQ(phase_of("fwd"), "llm forward");
  EXPECT_EQ(phase_of("wgrad"), "llm backward");
  EXPECT_EQ(phase_of("dp_comm"), "dp sync");
  EXPECT_EQ(phase_of("tp_comm"), "tp comm");
  const auto g = group_phases({{"bwd", Time::us(2)},
                               {"fwd", Time::us(1)},
                               {"recompute", Time::us(3)},
                               {"enc_fwd", Time::us(4)}});
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].phase, "encoder");
  EXPECT_EQ(g[1].phase, "llm forward");
  EXPECT_EQ(g[2].phase, "llm backward");
  EXPECT_EQ(g[2].per_rank, Time::us(5));
}

class Execute : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = runtime::make_backend("cpu");
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    backend_ = std::move(b).value();
  }
  std::unique_ptr<runtime::Backend> backend_;
};

TEST_F(Execute, WorldOfOnePlan) {
  if (backend_->info().world != 1) GTEST_SKIP() << "run alone, not under mpirun";
  const planner::Scenario s = tiny(1);
  planner::LowerOptions lo;
  lo.full_ranks = lo.kernels = true;
  auto lp = planner::lower(s, *s.plan, lo);
  ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
  ExecuteOptions o;
  o.warmup = 1;
  o.iterations = 2;
  auto m = execute(*backend_, *lp, o);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->world, 1);
  ASSERT_EQ(m->iterations.size(), 2u);
  EXPECT_GT(m->iteration_time, Time::zero());
  EXPECT_GT(m->tflops_per_gpu, 0);
  EXPECT_GT(m->pool_bytes.count(), 0);
  std::vector<std::string> phases;
  Time sum;
  for (const auto& p : m->phases) {
    phases.push_back(p.phase);
    sum += p.per_rank;
  }
  EXPECT_NE(std::find(phases.begin(), phases.end(), "fwd"), phases.end());
  EXPECT_NE(std::find(phases.begin(), phases.end(), "bwd"), phases.end());
  EXPECT_NE(std::find(phases.begin(), phases.end(), "optimizer"), phases.end());
  // One rank, one stream: the tasks' times fill the iteration (and never exceed it).
  EXPECT_LE(sum / m->iteration_time, 1.1);
  EXPECT_GE(sum / m->iteration_time, 0.5);
}

TEST_F(Execute, ErrorsBeforeAnythingRuns) {
  if (backend_->info().world != 1) GTEST_SKIP() << "run alone, not under mpirun";
  const planner::Scenario s4 = tiny(4);
  planner::LowerOptions lo;
  lo.full_ranks = lo.kernels = true;
  auto lp4 = planner::lower(s4, *s4.plan, lo);
  ASSERT_TRUE(lp4.is_ok());
  auto m = execute(*backend_, *lp4);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("needs 4 ranks"), std::string::npos) << m.status().message();
  const planner::Scenario s1 = tiny(1);
  lo.kernels = false;
  auto bare = planner::lower(s1, *s1.plan, lo);
  ASSERT_TRUE(bare.is_ok());
  m = execute(*backend_, *bare);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("kernels"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace hetpar::executor
