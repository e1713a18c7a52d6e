// The cpu backend's collectives and P2P under mpirun (ctest runs this binary with -np 2 and
// -np 4): every collective on the world group, on a sub-group in a permuted order, and on a
// single-rank group, for every dtype, against values computed here; P2P rings batched in
// group_start/group_end and blocking pairs; non-members get errors. Run alone it is a world
// of one, and still passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "runtime/test_util.h"

namespace hetpar::runtime {
namespace {

using testing::download;
using testing::upload;

// Rank r's element i: small integers, so every sum is exact even in fp8.
float value(int r, int64_t i) {
  return static_cast<float>(r + 1 + i % 3);
}

std::vector<float> contribution(int r, int64_t n, int64_t first = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = value(r, first + i);
  return v;
}

class Mpi : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = testing::must_make("cpu");
    ASSERT_NE(be_, nullptr);
    world_ = be_->info().world;
    rank_ = be_->info().rank;
  }
  // The groups every test runs on: the world, the even ranks in reverse order, rank 0 alone.
  std::vector<Group> groups() {
    std::vector<int> all(world_), evens;
    std::iota(all.begin(), all.end(), 0);
    for (int r = world_ - 1; r >= 0; --r) {
      if (r % 2 == 0) evens.push_back(r);
    }
    std::vector<Group> gs;
    for (const auto& ranks : {all, evens, std::vector<int>{0}}) {
      auto g = be_->make_group(ranks);
      EXPECT_TRUE(g.is_ok()) << g.status().to_string();
      gs.push_back(*g);
    }
    return gs;
  }
  std::unique_ptr<Backend> be_;
  int world_ = 1, rank_ = 0;
};

constexpr DType kTypes[] = {DType::kF32, DType::kBf16, DType::kF16, DType::kF8E4M3};
constexpr int64_t kCounts[] = {5, 3000};  // 3000: beyond one chunk of the 16/8-bit sums

TEST_F(Mpi, WorldInfo) {
  EXPECT_GE(world_, 1);
  EXPECT_GE(rank_, 0);
  EXPECT_LT(rank_, world_);
  EXPECT_EQ(be_->info().hosts, 1);
  EXPECT_EQ(be_->info().local_rank, rank_);
  // Every rank sees the same world and a distinct rank: the sum of ranks is known.
  auto g = be_->make_group(std::vector<int>(1, 0));
  ASSERT_TRUE(g.is_ok());
  EXPECT_TRUE(be_->barrier().is_ok());
}

TEST_F(Mpi, GroupsKnowTheirMembersAndOrder) {
  auto gs = groups();
  EXPECT_EQ(gs[0].rank, rank_);
  EXPECT_EQ(gs[0].size(), world_);
  const auto& evens = gs[1].ranks;
  auto it = std::find(evens.begin(), evens.end(), rank_);
  EXPECT_EQ(gs[1].rank, rank_ % 2 == 0 ? static_cast<int>(it - evens.begin()) : -1);
  EXPECT_EQ(gs[2].rank, rank_ == 0 ? 0 : -1);
  EXPECT_FALSE(be_->make_group(std::vector<int>{0, 0}).is_ok());
  EXPECT_FALSE(be_->make_group(std::vector<int>{world_}).is_ok());
}

TEST_F(Mpi, AllReduceSumsOverTheGroupInPlaceOrNot) {
  for (const Group& g : groups()) {
    for (DType t : kTypes) {
      for (int64_t n : kCounts) {
        Buffer send = upload(*be_, t, contribution(rank_, n));
        Buffer recv = testing::zeros(*be_, t, n);
        Status st = be_->all_reduce(kCommStream, g, send, recv, n, t);
        if (g.rank < 0) {
          EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.to_string();
          continue;
        }
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        std::vector<float> want(static_cast<size_t>(n), 0.0f);
        for (int r : g.ranks) {
          for (int64_t i = 0; i < n; ++i) want[i] += value(r, i);
        }
        EXPECT_EQ(download(*be_, recv, t, n), want) << to_string(t) << " group " << g.id;
        ASSERT_TRUE(be_->all_reduce(kCommStream, g, send, send, n, t).is_ok());
        EXPECT_EQ(download(*be_, send, t, n), want) << "in place";
      }
    }
  }
}

TEST_F(Mpi, AllGatherConcatenatesInGroupOrder) {
  for (const Group& g : groups()) {
    if (g.rank < 0) continue;
    for (DType t : kTypes) {
      for (int64_t n : kCounts) {
        Buffer send = upload(*be_, t, contribution(rank_, n));
        Buffer recv = testing::zeros(*be_, t, n * g.size());
        ASSERT_TRUE(be_->all_gather(kCommStream, g, send, recv, n, t).is_ok());
        std::vector<float> want;
        for (int r : g.ranks) {
          auto c = contribution(r, n);
          want.insert(want.end(), c.begin(), c.end());
        }
        EXPECT_EQ(download(*be_, recv, t, n * g.size()), want) << to_string(t);
        // In place: this rank's slot of recv is the input.
        Buffer again = upload(*be_, t, std::vector<float>(want.size(), 0.0f));
        const Bytes slot = Bytes(n * dtype_bytes(t));
        Buffer mine = again.slice(slot * g.rank, slot);
        ASSERT_TRUE(
            be_->copy_from_host(kCommStream, from_floats(t, contribution(rank_, n)), mine).is_ok());
        ASSERT_TRUE(be_->all_gather(kCommStream, g, mine, again, n, t).is_ok());
        EXPECT_EQ(download(*be_, again, t, n * g.size()), want) << "in place";
      }
    }
  }
}

TEST_F(Mpi, ReduceScatterLeavesEachMemberItsSliceOfTheSum) {
  for (const Group& g : groups()) {
    if (g.rank < 0) continue;
    for (DType t : kTypes) {
      for (int64_t n : kCounts) {
        Buffer send = upload(*be_, t, contribution(rank_, n * g.size()));
        Buffer recv = testing::zeros(*be_, t, n);
        ASSERT_TRUE(be_->reduce_scatter(kCommStream, g, send, recv, n, t).is_ok());
        std::vector<float> want(static_cast<size_t>(n), 0.0f);
        for (int r : g.ranks) {
          auto c = contribution(r, n, n * g.rank);
          for (int64_t i = 0; i < n; ++i) want[i] += c[i];
        }
        EXPECT_EQ(download(*be_, recv, t, n), want) << to_string(t);
        // In place (NCCL's form): recv is this rank's slot of send.
        const Bytes slot = Bytes(n * dtype_bytes(t));
        Buffer mine = send.slice(slot * g.rank, slot);
        ASSERT_TRUE(be_->reduce_scatter(kCommStream, g, send, mine, n, t).is_ok());
        EXPECT_EQ(download(*be_, mine, t, n), want) << "in place";
      }
    }
  }
}

TEST_F(Mpi, OverlapsOtherThanInPlaceAreRejected) {
  auto g = be_->make_group(std::vector<int>{0});
  ASSERT_TRUE(g.is_ok());
  if (rank_ != 0) return;
  Buffer b = testing::zeros(*be_, DType::kF32, 8);
  Buffer shifted = b.slice(Bytes(4), Bytes(16));
  EXPECT_EQ(be_->all_reduce(kCommStream, *g, b, shifted, 4, DType::kF32).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(be_->all_to_all(kCommStream, *g, b, b, 4, DType::kF32).code(),
            Status::Code::kInvalidArgument);
}

TEST_F(Mpi, AllToAllTransposesBlocks) {
  for (const Group& g : groups()) {
    if (g.rank < 0) continue;
    for (DType t : {DType::kF32, DType::kBf16}) {
      const int64_t n = 4;
      // Block j of member p's send holds 10 * p + j (as p sends it to member j).
      std::vector<float> mine;
      for (int j = 0; j < g.size(); ++j) mine.insert(mine.end(), n, 10.0f * g.rank + j);
      Buffer send = upload(*be_, t, mine);
      Buffer recv = testing::zeros(*be_, t, n * g.size());
      ASSERT_TRUE(be_->all_to_all(kCommStream, g, send, recv, n, t).is_ok());
      std::vector<float> want;
      for (int p = 0; p < g.size(); ++p) want.insert(want.end(), n, 10.0f * p + g.rank);
      EXPECT_EQ(download(*be_, recv, t, n * g.size()), want);
    }
  }
}

TEST_F(Mpi, BroadcastCopiesTheRootsBuffer) {
  for (const Group& g : groups()) {
    if (g.rank < 0) continue;
    const int root = g.size() - 1;  // a position, not a world rank
    for (DType t : kTypes) {
      Buffer buf = upload(*be_, t, contribution(rank_, 7));
      ASSERT_TRUE(be_->broadcast(kCommStream, g, buf, 7, t, root).is_ok());
      EXPECT_EQ(download(*be_, buf, t, 7), contribution(g.ranks[root], 7));
    }
    Buffer buf = testing::zeros(*be_, DType::kF32, 1);
    EXPECT_FALSE(be_->broadcast(kCommStream, g, buf, 1, DType::kF32, g.size()).is_ok());
  }
}

TEST_F(Mpi, BatchedRingSendRecvDoesNotDeadlock) {
  if (world_ < 2) GTEST_SKIP() << "P2P needs two ranks (run under mpirun -np 2)";
  const int next = (rank_ + 1) % world_, prev = (rank_ + world_ - 1) % world_;
  for (DType t : kTypes) {
    Buffer out = upload(*be_, t, contribution(rank_, 3000));
    Buffer in = testing::zeros(*be_, t, 3000);
    ASSERT_TRUE(be_->group_start().is_ok());
    ASSERT_TRUE(be_->send(kCommStream, out, 3000, t, next).is_ok());  // both send first
    ASSERT_TRUE(be_->recv(kCommStream, in, 3000, t, prev).is_ok());
    ASSERT_TRUE(be_->group_end().is_ok());
    EXPECT_EQ(download(*be_, in, t, 3000), contribution(prev, 3000));
  }
  EXPECT_FALSE(be_->group_end().is_ok());
}

TEST_F(Mpi, BlockingPairsArriveInOrder) {
  if (world_ < 2) GTEST_SKIP() << "P2P needs two ranks (run under mpirun -np 2)";
  if (rank_ > 1) return;
  Buffer a = testing::zeros(*be_, DType::kF32, 4), b = testing::zeros(*be_, DType::kF32, 4);
  if (rank_ == 0) {
    a = upload(*be_, DType::kF32, std::vector<float>{1, 2, 3, 4});
    b = upload(*be_, DType::kF32, std::vector<float>{5, 6, 7, 8});
    ASSERT_TRUE(be_->send(kCommStream, a, 4, DType::kF32, 1).is_ok());
    ASSERT_TRUE(be_->send(kCommStream, b, 2, DType::kF32, 1).is_ok());
  } else {
    ASSERT_TRUE(be_->recv(kCommStream, a, 4, DType::kF32, 0).is_ok());
    ASSERT_TRUE(be_->recv(kCommStream, b, 2, DType::kF32, 0).is_ok());
    EXPECT_EQ(download(*be_, a, DType::kF32, 4), (std::vector<float>{1, 2, 3, 4}));
    EXPECT_EQ(download(*be_, b, DType::kF32, 2), (std::vector<float>{5, 6}));
  }
  EXPECT_FALSE(be_->send(kCommStream, a, 1, DType::kF32, rank_).is_ok());  // not to itself
  EXPECT_FALSE(be_->send(kCommStream, a, 1, DType::kF32, world_).is_ok());
}

}  // namespace
}  // namespace hetpar::runtime
