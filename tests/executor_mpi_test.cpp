// The executor under mpirun (ctest runs this binary with -np 2 and -np 4, oversubscribed,
// on the cpu backend): the numerical check of the boundary communicator for every
// placement case — colocated fan-in, fan-out and equal DP, non-colocated fan-in and
// fan-out, three-phase colocated, with TP > 1 and CP > 1 on the LLM side — where the data
// movement must be exact, gradients within float rounding, and the communications each rank
// ran must be exactly the boundary tasks lower() emitted for it; then whole plans executed.
// Cases for another world size are skipped.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "executor/tiny.h"
#include "hetpar/executor/boundary_check.h"
#include "hetpar/executor/executor.h"
#include "hetpar/planner/lower.h"

namespace hetpar::executor {
namespace {

using testing::tiny;

planner::Layout layout(int tp, int cp, int pp, int dp, int mb = 1) {
  planner::Layout l;
  l.tp = tp;
  l.cp = cp;
  l.pp = pp;
  l.dp = dp;
  l.micro_batch = mb;
  return l;
}

struct Case {
  std::string name;
  int world;
  planner::Placement placement;
  planner::Layout llm, enc;
  int llm_first = 0, enc_first = 0;
};

planner::Plan plan_of(const Case& c) {
  planner::Plan p;
  p.layout = c.llm;
  p.placement = c.placement;
  p.llm_first_rank = c.llm_first;
  p.modules.push_back({"vision", c.enc, c.enc_first});
  return p;
}

using planner::Placement;
const Case kCases[] = {
    // world 4
    {"colocated fan-in, llm tp2", 4, Placement::kColocated, layout(2, 1, 1, 2), layout(1, 1, 1, 4)},
    {"colocated fan-in, llm cp2", 4, Placement::kColocated, layout(1, 2, 1, 2), layout(1, 1, 1, 4)},
    {"colocated fan-in, llm tp2 cp2", 4, Placement::kColocated, layout(2, 2, 1, 1),
     layout(1, 1, 1, 4)},
    {"colocated equal, tp2", 4, Placement::kColocated, layout(2, 1, 1, 2), layout(2, 1, 1, 2)},
    {"colocated equal, llm tp2 cp2", 4, Placement::kColocated, layout(2, 2, 1, 1),
     layout(4, 1, 1, 1)},
    {"colocated equal, llm cp2", 4, Placement::kColocated, layout(1, 2, 1, 2), layout(2, 1, 1, 2)},
    {"colocated fan-out", 4, Placement::kColocated, layout(1, 1, 1, 4), layout(2, 1, 1, 2, 2)},
    {"colocated fan-out, llm tp2", 4, Placement::kColocated, layout(2, 1, 1, 2),
     layout(4, 1, 1, 1, 2)},
    {"colocated fan-out, llm cp2", 4, Placement::kColocated, layout(1, 2, 1, 2),
     layout(4, 1, 1, 1, 2)},
    {"colocated three-phase fan-in, llm pp2", 4, Placement::kColocated, layout(1, 1, 2, 2),
     layout(1, 1, 1, 4)},
    {"colocated three-phase equal, llm tp2 pp2", 4, Placement::kColocated, layout(2, 1, 2, 1),
     layout(4, 1, 1, 1)},
    {"colocated three-phase fan-in, llm cp2 pp2", 4, Placement::kColocated, layout(1, 2, 2, 1),
     layout(1, 1, 1, 4)},
    {"non-colocated fan-in, llm tp2", 4, Placement::kNonColocated, layout(2, 1, 1, 1),
     layout(1, 1, 1, 2), 2, 0},
    {"non-colocated fan-out, enc tp2", 4, Placement::kNonColocated, layout(1, 1, 1, 2),
     layout(2, 1, 1, 1, 2), 2, 0},
    {"non-colocated fan-in, llm pp2", 4, Placement::kNonColocated, layout(1, 1, 2, 1),
     layout(1, 1, 1, 2), 2, 0},
    // world 2
    {"colocated equal, tp2", 2, Placement::kColocated, layout(2, 1, 1, 1), layout(2, 1, 1, 1)},
    {"colocated fan-in, llm cp2", 2, Placement::kColocated, layout(1, 2, 1, 1), layout(1, 1, 1, 2)},
    {"colocated fan-out", 2, Placement::kColocated, layout(1, 1, 1, 2), layout(2, 1, 1, 1, 2)},
    {"non-colocated", 2, Placement::kNonColocated, layout(1, 1, 1, 1), layout(1, 1, 1, 1), 1, 0},
};

class ExecutorMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = runtime::make_backend("cpu");
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    backend_ = std::move(b).value();
    world_ = backend_->info().world;
    rank_ = backend_->info().rank;
  }
  // Every rank's `v` (the same size on each), rank-major.
  std::vector<float> gather(const std::vector<float>& v) {
    const auto n = static_cast<int64_t>(v.size());
    std::vector<int> ranks(static_cast<size_t>(world_));
    for (int q = 0; q < world_; ++q) ranks[q] = q;
    auto g = backend_->make_group(ranks);
    auto in = backend_->allocate(Bytes(4 * n));
    auto out = backend_->allocate(Bytes(4 * n * world_));
    std::vector<float> all(static_cast<size_t>(n * world_));
    if (!g.is_ok() || !in.is_ok() || !out.is_ok()) return all;
    Status st = backend_->copy_from_host(runtime::kComputeStream,
                                         std::as_bytes(std::span<const float>(v)), *in);
    if (st.is_ok())
      st = backend_->all_gather(runtime::kComputeStream, *g, *in, *out, n, runtime::DType::kF32);
    if (st.is_ok())
      st = backend_->copy_to_host(runtime::kComputeStream, *out,
                                  std::as_writable_bytes(std::span<float>(all)));
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return all;
  }
  std::unique_ptr<runtime::Backend> backend_;
  int world_ = 1, rank_ = 0;
};

TEST_F(ExecutorMpi, BoundaryPreservesActivationsAndGradients) {
  int ran = 0;
  for (const Case& c : kCases) {
    if (c.world != world_) continue;
    SCOPED_TRACE(fmt::format("{} (rank {})", c.name, rank_));
    const planner::Scenario s = tiny(c.world);
    const planner::Plan p = plan_of(c);
    ASSERT_EQ(planner::infeasibility(s, p), "");
    auto r = check_boundary(*backend_, s, p);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ++ran;
    EXPECT_EQ(r->activation_mismatches, 0) << "of " << r->activation_values;
    EXPECT_LT(r->max_gradient_error, 1e-5);
    // What ran is what the lowering emits for this rank.
    planner::LowerOptions lo;
    lo.full_ranks = true;
    auto lp = planner::lower(s, p, lo);
    ASSERT_TRUE(lp.is_ok());
    std::vector<BoundaryComm> want = lowered_boundary_comms(lp->graph, rank_), got = r->comms;
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got.size(), want.size());
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
      EXPECT_EQ(got[i], want[i]) << describe(got[i]) << " vs lowered " << describe(want[i]);
    // The whole world's figures, for the log (docs/validation.md quotes them).
    const std::vector<float> mine = {
        static_cast<float>(r->activation_values), static_cast<float>(r->activation_mismatches),
        static_cast<float>(r->gradient_values), static_cast<float>(r->max_gradient_error),
        static_cast<float>(got.size())};
    const std::vector<float> all = gather(mine);
    float values = 0, mismatches = 0, grads = 0, worst = 0, comms = 0;
    for (int q = 0; q < world_; ++q) {
      values += all[q * 5];
      mismatches += all[q * 5 + 1];
      grads += all[q * 5 + 2];
      worst = std::max(worst, all[q * 5 + 3]);
      comms += all[q * 5 + 4];
    }
    if (rank_ == 0)
      fmt::print(
          "boundary check np {} {}: activations {} of {} values bitwise equal; "
          "gradients {} values, max relative error {:.1e}; {} rank-communications as "
          "lowered\n",
          world_, c.name, values - mismatches, values, grads, worst, comms);
  }
  if (ran == 0) GTEST_SKIP() << "no case for world " << world_;
}

TEST_F(ExecutorMpi, PlansRun) {
  if (world_ != 4) GTEST_SKIP() << "the tiny plans need 4 ranks";
  const planner::Scenario s = tiny(4);
  for (const auto& [name, plan] : s.plans) {
    SCOPED_TRACE(name);
    planner::LowerOptions lo;
    lo.full_ranks = lo.kernels = true;
    auto lp = planner::lower(s, plan, lo);
    ASSERT_TRUE(lp.is_ok()) << lp.status().to_string();
    ExecuteOptions o;
    o.warmup = 1;
    o.iterations = 2;
    o.census_device = &s.cluster.profile_of_gpu(backend_->info().rank).gpu;
    o.census_precision = s.workload.precision;
    o.census_reps = 1;
    auto m = execute(*backend_, *lp, o);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_EQ(m->world, 4);
    // The census: every kernel of every rank, predicted as the simulator timed its task.
    double calls = 0, compute_s = 0;
    for (int t = 0; t < lp->graph.num_tasks(); ++t) {
      const sim::Task& task = lp->graph.task(TaskId(t));
      if (task.kind != sim::TaskKind::kCompute) continue;
      compute_s += task.duration.to_seconds();
      for (const sim::Kernel& k : lp->graph.kernels(task.kernels))
        calls += k.kind != sim::KernelKind::kGemm || k.m * k.n * k.k > 0 ? 1 : 0;
    }
    double census_calls = 0, census_s = 0;
    for (const KernelTiming& k : m->kernels) {
      census_calls += k.calls;
      census_s += k.predicted.to_seconds();
      EXPECT_GT(k.measured, Time::zero()) << sim::to_string(k.kind);
    }
    EXPECT_NEAR(census_calls, calls / 4, 1e-3);
    EXPECT_NEAR(census_s, compute_s / 4, 1e-6 * compute_s);
    EXPECT_GT(m->iteration_time, Time::zero());
    const bool hetero = plan.placement != Placement::kHomogeneous;
    bool boundary = false, encoder = false;
    for (const auto& ph : m->phases) {
      boundary |= ph.phase == "boundary_comm" && ph.per_rank > Time::zero();
      encoder |= ph.phase == "enc_fwd" && ph.per_rank > Time::zero();
    }
    EXPECT_EQ(boundary, hetero);
    EXPECT_EQ(encoder, hetero);
  }
}

}  // namespace
}  // namespace hetpar::executor
