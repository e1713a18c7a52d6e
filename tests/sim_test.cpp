// Tests of the simulation kernel: event queue, max-min solver, flow network, task graph,
// collectives against their closed forms, simulate(), trace output, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "hetpar/core/format.h"
#include "hetpar/sim/collective.h"
#include "hetpar/sim/event_queue.h"
#include "hetpar/sim/flow_network.h"
#include "hetpar/sim/kernel.h"
#include "hetpar/sim/max_min.h"
#include "hetpar/sim/network.h"
#include "hetpar/sim/simulate.h"
#include "hetpar/sim/task_graph.h"
#include "hetpar/sim/trace.h"

namespace hetpar::sim {
namespace {

// ---------------------------------------------------------------- EventQueue

struct Recorder final : EventSource {
  std::vector<std::pair<int64_t, uint32_t>> seen;  // (time in ps, tag)
  void on_event(Time now, uint32_t tag) override { seen.emplace_back(now.count_ps(), tag); }
};

// An attention kernel's model FLOPs: 2·b·h·(d + dv) per scored pair, backward twice that;
// a causal call bottom-right aligned, so a chunk's queries against the keys up to it count
// the rectangle before the chunk and the triangle of its own block.
TEST(KernelTest, CausalAttentionCountsItsBottomRightPairs) {
  Kernel k{.kind = KernelKind::kAttentionForward,
           .batch = 2,
           .heads = 4,
           .seq_q = 64,
           .seq_kv = 64,
           .head_dim = 32,
           .causal = true};
  const double per_pair = 2.0 * 2 * 4 * 64;
  EXPECT_DOUBLE_EQ(k.flops(), per_pair * 64 * 64 / 2);
  k.seq_kv = 192;
  EXPECT_DOUBLE_EQ(k.flops(), per_pair * (64 * 128 + 64 * 64 / 2));
  k.causal = false;
  EXPECT_DOUBLE_EQ(k.flops(), per_pair * 64 * 192);
  k.kind = KernelKind::kAttentionBackward;
  EXPECT_DOUBLE_EQ(k.flops(), 2 * per_pair * 64 * 192);
}

TEST(EventQueueTest, EqualTimesRunInScheduleOrder) {
  EventQueue q;
  Recorder r;
  q.schedule_at(Time::ps(5), r, 0);
  q.schedule_at(Time::ps(3), r, 1);
  q.schedule_at(Time::ps(5), r, 2);
  q.schedule_at(Time::ps(3), r, 3);
  q.schedule_at(Time::ps(5), r, 4);
  q.run();
  std::vector<std::pair<int64_t, uint32_t>> want = {{3, 1}, {3, 3}, {5, 0}, {5, 2}, {5, 4}};
  EXPECT_EQ(r.seen, want);
  EXPECT_EQ(q.now(), Time::ps(5));
}

// An event scheduled for "now" from inside a handler runs after the events already due now.
TEST(EventQueueTest, EventsScheduledNowRunAfterThoseAlreadyDue) {
  struct Chain final : EventSource {
    EventQueue* q;
    std::vector<uint32_t> order;
    void on_event(Time, uint32_t tag) override {
      order.push_back(tag);
      if (tag == 0) q->schedule_in(Time::zero(), *this, 9);
    }
  } c;
  EventQueue q;
  c.q = &q;
  q.schedule_at(Time::ps(1), c, 0);
  q.schedule_at(Time::ps(1), c, 1);
  q.run();
  EXPECT_EQ(c.order, (std::vector<uint32_t>{0, 1, 9}));
}

// Handlers that schedule zero-delay and later events and cancel some run in the order of
// the contract's reference (the earliest time, then the earliest scheduled), whatever mix
// of due-now and future events the queue holds.
TEST(EventQueueTest, ZeroDelayAndLaterEventsRunInTimeThenScheduleOrder) {
  struct Fanout final : EventSource {
    EventQueue* q;
    std::vector<std::pair<int64_t, uint32_t>> seen;
    // Reference: every scheduled event as (time, sequence, tag, cancelled).
    std::vector<std::tuple<int64_t, int, uint32_t, bool>> scheduled;
    std::vector<EventHandle> handles;
    uint32_t next_tag = 1;
    void add(Time when) {
      handles.push_back(q->schedule_at(when, *this, next_tag));
      scheduled.emplace_back(when.count_ps(), static_cast<int>(scheduled.size()), next_tag++,
                             false);
    }
    void on_event(Time now, uint32_t tag) override {
      seen.emplace_back(now.count_ps(), tag);
      if (next_tag > 400) return;
      const uint32_t h = tag * 2654435761u;
      for (uint32_t i = 0; i < 1 + h % 3; ++i) add(now + Time::ps((h >> (4 + 2 * i)) % 3));
      if (h % 5 == 0) {  // cancel the event just scheduled
        q->cancel(handles.back());
        std::get<3>(scheduled.back()) = true;
      }
    }
  } f;
  EventQueue q;
  f.q = &q;
  for (int i = 0; i < 4; ++i) f.add(Time::ps(i % 2));
  q.run();
  auto want = f.scheduled;
  std::erase_if(want, [](const auto& e) { return std::get<3>(e); });
  std::sort(want.begin(), want.end());
  ASSERT_GT(want.size(), 300u);
  ASSERT_EQ(f.seen.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(f.seen[i], (std::pair<int64_t, uint32_t>{std::get<0>(want[i]), std::get<2>(want[i])}))
        << i;
}

TEST(EventQueueTest, CancelledEventsNeverRun) {
  EventQueue q;
  Recorder r;
  q.schedule_at(Time::ps(1), r, 1);
  EventHandle h = q.schedule_at(Time::ps(2), r, 2);
  EventHandle done = q.schedule_at(Time::ps(0), r, 0);
  EXPECT_TRUE(q.run_next());  // runs tag 0
  EXPECT_FALSE(q.cancel(done)) << "already ran";
  EXPECT_EQ(q.pending(), 2u);
  EXPECT_TRUE(q.cancel(h));
  EXPECT_FALSE(q.cancel(h)) << "cancelling twice is a no-op";
  EXPECT_FALSE(q.cancel(EventHandle())) << "an empty handle names nothing";
  EXPECT_EQ(q.pending(), 1u);
  q.run();
  EXPECT_EQ(r.seen, (std::vector<std::pair<int64_t, uint32_t>>{{0, 0}, {1, 1}}));
  // The slot of the cancelled event is reused; the stale handle must not cancel the new one.
  q.schedule_at(Time::ps(3), r, 3);
  EXPECT_FALSE(q.cancel(h));
  q.run();
  EXPECT_EQ(r.seen.back(), (std::pair<int64_t, uint32_t>{3, 3}));
}

TEST(EventQueueDeathTest, TimeNeverGoesBackwards) {
  EventQueue q;
  Recorder r;
  q.schedule_at(Time::ps(10), r);
  q.run();
  EXPECT_DEATH(q.schedule_at(Time::ps(9), r), "past");
}

// ---------------------------------------------------------------- MaxMinSolver

TEST(MaxMinSolverTest, SingleBottleneckSharesEqually) {
  // Three flows on one link of 90: x1 = x2 = x3 = 30.
  MaxMinSolver s;
  int32_t l = s.add_link(90);
  for (int i = 0; i < 3; ++i) s.add_flow(std::vector<int32_t>{l});
  s.solve();
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(s.rate(i), 30);
}

TEST(MaxMinSolverTest, ClassicTwoLinkExample) {
  // A uses L0 (10); B uses L0 and L1; C uses L1 (15). L0 saturates first at share 5:
  // A = B = 5. Then C gets what B left on L1: C = 15 - 5 = 10.
  MaxMinSolver s;
  int32_t l0 = s.add_link(10), l1 = s.add_link(15);
  int32_t a = s.add_flow(std::vector<int32_t>{l0});
  int32_t b = s.add_flow(std::vector<int32_t>{l0, l1});
  int32_t c = s.add_flow(std::vector<int32_t>{l1});
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(a), 5);
  EXPECT_DOUBLE_EQ(s.rate(b), 5);
  EXPECT_DOUBLE_EQ(s.rate(c), 10);
}

TEST(MaxMinSolverTest, FlowLimitedElsewhereFreesCapacity) {
  // A and B share L0 (100), but B is held to 10 by L1: A takes the other 90.
  MaxMinSolver s;
  int32_t l0 = s.add_link(100), l1 = s.add_link(10);
  int32_t a = s.add_flow(std::vector<int32_t>{l0});
  int32_t b = s.add_flow(std::vector<int32_t>{l0, l1});
  s.solve();
  EXPECT_DOUBLE_EQ(s.rate(b), 10);
  EXPECT_DOUBLE_EQ(s.rate(a), 90);
}

TEST(MaxMinSolverTest, FlowOverNoLinkIsUnconstrained) {
  MaxMinSolver s;
  s.add_flow({});
  s.solve();
  EXPECT_TRUE(std::isinf(s.rate(0)));
}

// Random instances (fixed seed): capacities are respected, and every flow has a
// bottleneck, a saturated link on which no other flow is faster (the max-min condition).
TEST(MaxMinSolverTest, RandomInstancesAreFeasibleAndMaxMinFair) {
  std::mt19937 rng(301);
  MaxMinSolver s;
  for (int round = 0; round < 50; ++round) {
    s.clear();
    const int nl = 1 + static_cast<int>(rng() % 12), nf = 1 + static_cast<int>(rng() % 20);
    std::vector<double> cap(nl);
    for (int l = 0; l < nl; ++l) s.add_link(cap[l] = 1 + static_cast<double>(rng() % 100));
    std::vector<std::vector<int32_t>> routes(nf);
    for (auto& r : routes) {
      for (int l = 0; l < nl; ++l)
        if (rng() % 3 == 0) r.push_back(l);
      if (r.empty()) r.push_back(static_cast<int32_t>(rng() % nl));
      s.add_flow(r);
    }
    s.solve();
    std::vector<double> load(nl, 0);
    for (int f = 0; f < nf; ++f)
      for (int32_t l : routes[f]) load[l] += s.rate(f);
    for (int l = 0; l < nl; ++l) EXPECT_LE(load[l], cap[l] * (1 + 1e-9)) << "link " << l;
    for (int f = 0; f < nf; ++f) {
      bool has_bottleneck = false;
      for (int32_t l : routes[f]) {
        if (load[l] < cap[l] * (1 - 1e-9)) continue;
        bool fastest = true;
        for (int g = 0; g < nf; ++g)
          if (std::count(routes[g].begin(), routes[g].end(), l) &&
              s.rate(g) > s.rate(f) * (1 + 1e-9))
            fastest = false;
        has_bottleneck |= fastest;
      }
      EXPECT_TRUE(has_bottleneck) << "round " << round << " flow " << f;
    }
  }
}

// Over kScanLinks links the solver finds each bottleneck with a heap instead of a scan:
// the same instance, padded with idle links past the threshold, gets bit-identical rates
// (ties, on capacities from a small set, broken alike: the lowest link first).
TEST(MaxMinSolverTest, TheHeapOverManyLinksGivesTheScansRates) {
  std::mt19937 rng(54);
  const int nl = MaxMinSolver::kScanLinks - 96, nf = 6000;
  MaxMinSolver scan, heap;
  for (int l = 0; l < nl; ++l) {
    const double cap = 10.0 * (1 << (rng() % 3));
    scan.add_link(cap);
    heap.add_link(cap);
  }
  for (int l = 0; l < 200; ++l) heap.add_link(1.0);  // idle: no flow crosses them
  ASSERT_GT(heap.num_links(), MaxMinSolver::kScanLinks);
  std::vector<int32_t> route;
  std::vector<double> weights;
  for (int f = 0; f < nf; ++f) {
    route.clear();
    weights.clear();
    const int hops = 1 + static_cast<int>(rng() % 3);
    for (int h = 0; h < hops; ++h) {
      const auto l = static_cast<int32_t>(rng() % nl);
      if (std::find(route.begin(), route.end(), l) != route.end()) continue;
      route.push_back(l);
      weights.push_back(rng() % 4 == 0 ? 2.0 : 1.0);
    }
    scan.add_flow(route, weights);
    heap.add_flow(route, weights);
  }
  scan.solve();
  heap.solve();
  for (int f = 0; f < nf; ++f) ASSERT_EQ(heap.rate(f), scan.rate(f)) << "flow " << f;
}

// A flow added hop by hop (add_hop, end_flow) is the flow add_flow adds: the same index and,
// after a cleared solver is refilled the other way, the same rates.
TEST(MaxMinSolverTest, FlowsAddedHopByHopEqualAddFlows) {
  std::mt19937 rng(7);
  MaxMinSolver s;
  std::vector<std::vector<int32_t>> routes;
  std::vector<std::vector<double>> weights;
  for (int f = 0; f < 300; ++f) {
    routes.emplace_back();
    weights.emplace_back();
    for (int32_t l = 0; l < 40; ++l)
      if (rng() % 8 == 0) {
        routes.back().push_back(l);
        weights.back().push_back(rng() % 3 == 0 ? 3.0 : 1.0);
      }
  }
  auto fill = [&](bool by_hop) {
    s.clear();
    for (int l = 0; l < 40; ++l) s.add_link(5.0 + l % 7);
    for (size_t f = 0; f < routes.size(); ++f) {
      int32_t id;
      if (by_hop) {
        for (size_t i = 0; i < routes[f].size(); ++i) s.add_hop(routes[f][i], weights[f][i]);
        id = s.end_flow();
      } else {
        id = s.add_flow(routes[f], weights[f]);
      }
      EXPECT_EQ(id, static_cast<int32_t>(f));
    }
    s.solve();
    std::vector<double> rates;
    for (int f = 0; f < s.num_flows(); ++f) rates.push_back(s.rate(f));
    return rates;
  };
  const std::vector<double> whole = fill(false);
  ASSERT_EQ(whole.size(), routes.size());
  EXPECT_EQ(fill(true), whole);
}

// ---------------------------------------------------------------- Network, flows

TEST(NetworkTest, BuildersRouteThroughTheExpectedLinks) {
  Network sw = single_switch_network(4, Bandwidth::GBps(100), Time::us(1));
  std::vector<LinkId> route;
  sw.route(RankId(1), RankId(3), route);
  ASSERT_EQ(route.size(), 2u);
  EXPECT_EQ(sw.link(route[0]).name, "up 1");
  EXPECT_EQ(sw.link(route[1]).name, "down 3");
  EXPECT_EQ(sw.latency(route), Time::us(2));
  sw.route(RankId(2), RankId(2), route);
  EXPECT_TRUE(route.empty());

  Network c = cluster_network({.nodes = 2, .gpus_per_node = 4});
  EXPECT_EQ(c.node_of(RankId(5)), NodeId(1));
  c.route(RankId(0), RankId(3), route);
  EXPECT_EQ(c.link(route[0]).name, "nvlink up 0");
  c.route(RankId(1), RankId(6), route);
  EXPECT_EQ(c.link(route[0]).name, "nic up 1");
  EXPECT_EQ(c.link(route[1]).name, "nic down 6");
  EXPECT_FALSE(Network(2).validate().is_ok()) << "no router";
}

struct DoneLog final : FlowNetwork::Observer {
  std::vector<std::pair<uint32_t, Time>> done;
  void on_flow_done(Time now, uint32_t cookie) override { done.emplace_back(cookie, now); }
};

TEST(FlowNetworkTest, IdleTransferTakesLatencyPlusBytesOverBandwidthExactly) {
  // Completion = now + latency(route) + bytes / bottleneck, rounded to the nearest ps.
  Network net = single_switch_network(2, Bandwidth::GBps(100), Time::us(1));
  EventQueue q;
  DoneLog log;
  FlowNetwork flows(q, net, log);
  std::vector<LinkId> route;
  net.route(RankId(0), RankId(1), route);
  flows.start(route, Bytes(123'456'789), net.latency(route), 7);
  q.run();
  ASSERT_EQ(log.done.size(), 1u);
  EXPECT_EQ(log.done[0].first, 7u);
  EXPECT_EQ(log.done[0].second, Time::us(2) + Bytes(123'456'789) / Bandwidth::GBps(100));
  EXPECT_EQ(flows.active(), 0);
}

// Flows on a single switch of `ranks` ranks, 100 GB/s links, no latency.
struct SwitchFlows {
  explicit SwitchFlows(int ranks)
      : net(single_switch_network(ranks, Bandwidth::GBps(100), Time::zero())), flows(q, net, log) {}
  void start(int src, int dst, Bytes bytes, uint32_t cookie, double weight = 1.0) {
    net.route(RankId(src), RankId(dst), route);
    const std::vector<double> weights(route.size(), weight);
    flows.start(route, weights, bytes, Time::zero(), cookie);
  }
  Network net;
  EventQueue q;
  DoneLog log;
  FlowNetwork flows;
  std::vector<LinkId> route;
};

TEST(FlowNetworkTest, ConcurrentFlowsShareAndAFinishedFlowFreesItsShare) {
  // Both leave rank 0's up link (100 GB/s): 50 GB/s each. The 0.5 GB flow is done at
  // 10 ms; the 1 GB flow then has 0.5 GB left at 100 GB/s: done at 15 ms.
  SwitchFlows s(3);
  s.start(0, 1, Bytes::GB(1), 1);
  s.start(0, 2, Bytes::GB(0.5), 2);
  s.q.run();
  ASSERT_EQ(s.log.done.size(), 2u);
  EXPECT_EQ(s.log.done[0], (std::pair<uint32_t, Time>{2, Time::ms(10)}));
  EXPECT_EQ(s.log.done[1], (std::pair<uint32_t, Time>{1, Time::ms(15)}));
}

TEST(FlowNetworkTest, FlowsOnDisjointRoutesEachRunAtTheirNarrowestLinkOverItsWeight) {
  // Started in the same instant, 0 -> 1 and 2 -> 3 share no link: the first runs at
  // 100 GB/s, the second weighs 4 on its links (four alike flows): 25 GB/s.
  SwitchFlows s(4);
  s.start(0, 1, Bytes::GB(1), 1);
  s.start(2, 3, Bytes::GB(1), 2, 4.0);
  s.q.run();
  ASSERT_EQ(s.log.done.size(), 2u);
  EXPECT_EQ(s.log.done[0], (std::pair<uint32_t, Time>{1, Time::ms(10)}));
  EXPECT_EQ(s.log.done[1], (std::pair<uint32_t, Time>{2, Time::ms(40)}));
}

TEST(FlowNetworkTest, FlowsLeavingFromTheMiddleOfALinksFlowsFreeTheirSharesOnly) {
  // Four flows leave rank 0 (100 GB/s, 25 each), started A, B, C, D. B (second) drains
  // first, at 0.1 / 25 = 4 ms; then D (now where B was) at 4 + 0.4 / 33.3 = 16 ms; A and C
  // go on at 50, A done at 16 + 0.5 / 50 = 26 ms, then C alone at 100: 26 + 1.0 / 100 =
  // 36 ms. Each flow must leave the link's list from wherever it sits then.
  SwitchFlows s(5);
  const double gb[] = {1, 0.1, 2, 0.5};
  for (int i = 0; i < 4; ++i) s.start(0, i + 1, Bytes::GB(gb[i]), static_cast<uint32_t>(i));
  s.q.run();
  ASSERT_EQ(s.log.done.size(), 4u);
  const std::pair<uint32_t, double> expected[] = {{1, 0.004}, {3, 0.016}, {0, 0.026}, {2, 0.036}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(s.log.done[i].first, expected[i].first) << i;
    EXPECT_NEAR(s.log.done[i].second.to_seconds(), expected[i].second, 1e-12) << i;
  }
  EXPECT_EQ(s.flows.active(), 0);
}

// A transfer timed privately while it claims its links, then moved into the shared network
// when another flow reaches them (what simulate() does with SimOptions::defer_flows).
struct Claimant final : FlowNetwork::Observer {
  Claimant(Network& net, FlowNetwork& shared, EventQueue& shared_q)
      : shared(shared), shared_q(shared_q), own(own_q, net, log) {}
  void on_flow_done(Time, uint32_t) override {}
  void on_claim_contended(int32_t owner) override {
    EXPECT_EQ(owner, 5);
    shared.release(links, owner);
    own_q.run_until(shared_q.now() - begin);
    moved = own.move_to(shared, begin);
  }
  FlowNetwork& shared;
  EventQueue& shared_q;
  EventQueue own_q;
  DoneLog log;
  FlowNetwork own;
  std::vector<LinkId> links;
  Time begin;
  int32_t moved = -1;
};

struct Forward final : FlowNetwork::Observer {
  void on_flow_done(Time now, uint32_t cookie) override { log.on_flow_done(now, cookie); }
  void on_claim_contended(int32_t owner) override { claimant->on_claim_contended(owner); }
  DoneLog log;
  Claimant* claimant = nullptr;
};

TEST(FlowNetworkTest, AClaimedTransferJoinsTheSharedNetworkAsItStandsWhenContended) {
  // 0 -> 1 (1 GB) starts alone at 1 ms and claims its links; at 5 ms 0 -> 2 (1 GB) reaches
  // rank 0's up link. The first moved 0.4 GB at 100 GB/s; then both run at 50 GB/s until
  // it is done at 5 + 0.6 / 50 = 17 ms; the second, 0.6 GB through, ends at 17 + 0.4 /
  // 100 = 21 ms: as if both had been in the shared network from the start.
  Network net = single_switch_network(3, Bandwidth::GBps(100), Time::zero());
  EventQueue q;
  Forward fwd;
  FlowNetwork shared(q, net, fwd);
  Claimant c(net, shared, q);
  fwd.claimant = &c;
  std::vector<LinkId> route;
  net.route(RankId(0), RankId(1), route);
  c.links = route;
  struct At final : EventSource {
    std::function<void()> fn;
    void on_event(Time, uint32_t) override { fn(); }
  } at1, at5;
  at1.fn = [&] {
    EXPECT_TRUE(shared.idle(route));
    shared.claim(route, 5);
    EXPECT_FALSE(shared.idle(route));
    c.begin = q.now();
    c.own.start(route, Bytes::GB(1), Time::zero(), 9);
  };
  at5.fn = [&] {
    std::vector<LinkId> other;
    net.route(RankId(0), RankId(2), other);
    shared.start(other, Bytes::GB(1), Time::zero(), 2);
  };
  q.schedule_at(Time::ms(1), at1);
  q.schedule_at(Time::ms(5), at5);
  q.run();
  EXPECT_EQ(c.moved, 1);
  EXPECT_TRUE(c.log.done.empty()) << "moved, not delivered privately";
  EXPECT_EQ(c.own.active(), 0);
  ASSERT_EQ(fwd.log.done.size(), 2u);
  EXPECT_EQ(fwd.log.done[0].first, 9u);
  EXPECT_NEAR(fwd.log.done[0].second.to_seconds(), 0.017, 1e-12);
  EXPECT_EQ(fwd.log.done[1].first, 2u);
  EXPECT_NEAR(fwd.log.done[1].second.to_seconds(), 0.021, 1e-12);
  EXPECT_TRUE(shared.idle(route));
}

// ---------------------------------------------------------------- TaskGraph

TEST(TaskGraphTest, ValidateReportsBadInputInsteadOfCrashing) {
  {
    TaskGraph g;
    TaskId a = g.add_compute(RankId(0), 0, Time::us(1), Flops(0));
    TaskId b = g.add_compute(RankId(1), 0, Time::us(1), Flops(0));
    g.add_dependency(a, b);
    g.add_dependency(b, a);
    Status st = g.validate(2);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(st.message().find("cycle"), std::string::npos) << st.message();
  }
  {
    // Stream order makes a cycle too: on rank 0's comm stream B comes after A, yet A
    // waits for B.
    TaskGraph g;
    std::vector<RankId> grp = {RankId(0), RankId(1)};
    TaskId a = g.add_collective({.group = grp, .bytes = Bytes(8)});
    TaskId b = g.add_collective({.group = grp, .bytes = Bytes(8)});
    g.add_dependency(b, a);
    EXPECT_FALSE(g.validate(2).is_ok());
  }
  {
    TaskGraph g;
    g.add_compute(RankId(5), 0, Time::us(1), Flops(0), {.name = g.label("oops")});
    Status st = g.validate(4);
    EXPECT_NE(st.message().find("rank 5 out of range"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("\"oops\""), std::string::npos) << st.message();
  }
  {
    TaskGraph g;
    TaskId a = g.add_compute(RankId(0), 0, Time::us(1), Flops(0));
    g.add_dependency(a, TaskId(42));
    EXPECT_FALSE(g.validate(1).is_ok());
  }
  {
    TaskGraph g;
    std::vector<RankId> dup = {RankId(0), RankId(0)};
    g.add_collective({.group = dup, .bytes = Bytes(8)});
    EXPECT_FALSE(g.validate(2).is_ok());
  }
  {
    TaskGraph g;
    g.add_p2p(RankId(0), RankId(1), Bytes(-1), 0, 0);
    EXPECT_FALSE(g.validate(2).is_ok());
  }
  {
    TaskGraph g;
    g.add_compute(RankId(0), 0, Time::us(1), Flops(0));
    g.add_dependency(TaskId(0), TaskId(0));
    Network net = single_switch_network(1, Bandwidth::GBps(1), Time::zero());
    EXPECT_FALSE(simulate(g, net, {}).is_ok()) << "simulate() validates first";
  }
  {
    // simulate() leaves the cycle check to its run: the same error, naming a task that can
    // never start, and how many.
    TaskGraph g;
    TaskId a = g.add_compute(RankId(0), 0, Time::us(1), Flops(0), {.name = g.label("a")});
    TaskId b = g.add_compute(RankId(1), 0, Time::us(1), Flops(0), {.name = g.label("b")});
    TaskId c = g.add_compute(RankId(1), 0, Time::us(1), Flops(0), {.name = g.label("c")});
    g.add_dependency(a, b);
    g.add_dependency(b, a);
    (void)c;
    Network net = single_switch_network(2, Bandwidth::GBps(1), Time::zero());
    Result<SimResult> r = simulate(g, net, {});
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("task 0 (compute \"a\"): on a cycle"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("(3 of 3 tasks can never start)"), std::string::npos)
        << r.status().message();
  }
}

TEST(TaskGraphTest, LabelsAndGroupsAreInterned) {
  TaskGraph g;
  EXPECT_EQ(g.label("fwd"), g.label("fwd"));
  EXPECT_NE(g.label("fwd"), g.label("bwd"));
  EXPECT_EQ(g.label_text(g.label("bwd")), "bwd");
  std::vector<RankId> grp = {RankId(0), RankId(1)};
  TaskId a = g.add_collective({.group = grp, .bytes = Bytes(1)});
  TaskId b =
      g.add_collective({.kind = CollectiveKind::kBroadcast, .group = grp, .bytes = Bytes(1)});
  EXPECT_EQ(g.task(a).group, g.task(b).group);
  EXPECT_EQ(g.task(b).root, RankId(0)) << "root defaults to group[0]";
  EXPECT_EQ(g.streams(a).size(), 2u);
}

// validate() counts each rank's streams of each kind as simulate() lays them out: one more
// than the largest index any of the rank's tasks names, with or without the cycle check.
TEST(TaskGraphTest, ValidateCountsEachRanksStreams) {
  TaskGraph g;
  g.add_compute(RankId(0), 1, Time::us(1), Flops(1));
  g.add_p2p(RankId(0), RankId(2), Bytes(8), 3, 0);
  const std::vector<RankId> pair = {RankId(0), RankId(2)};
  g.add_collective({.group = pair, .bytes = Bytes(1), .stream = 1});
  for (bool cycles : {false, true}) {
    StreamCounts counts;
    ASSERT_TRUE(g.validate(3, cycles, &counts).is_ok());
    EXPECT_EQ(counts.compute, (std::vector<int32_t>{2, 0, 0}));
    EXPECT_EQ(counts.comm, (std::vector<int32_t>{4, 0, 2}));
  }
}

// ---------------------------------------------------------------- simulate(): streams

const Bandwidth kB = Bandwidth::GBps(100);

SimResult run(const TaskGraph& g, const Network& net, SimOptions opt = {}) {
  opt.record_tasks = true;
  Result<SimResult> r = simulate(g, net, opt);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r).value() : SimResult{};
}

TEST(SimulateTest, P2PTakesRouteLatencyPlusBytesOverBandwidth) {
  Network net = single_switch_network(2, kB, Time::us(1));
  TaskGraph g;
  g.add_p2p(RankId(0), RankId(1), Bytes::GB(1), 0, 0);
  SimResult r = run(g, net);
  EXPECT_EQ(r.makespan, Time::us(2) + Bytes::GB(1) / kB);
}

TEST(SimulateTest, ADeferredTransferMetMidwayOrInItsLatencyEndsAsInTheSharedNetwork) {
  // 0 -> 1 moves 1 GB at 100 GB/s (10 ms) and is delivered 2 us later; 0 -> 2 (0.5 GB)
  // leaves rank 0 on another stream after `gap` of compute. At 4 ms it shares rank 0's up
  // link: 0 -> 2 drains at 4 + 0.5 / 50 = 14 ms, 0 -> 1, 0.1 GB left, at 15 ms. In 0 -> 1's
  // latency (10.001 ms) it finds the link free and runs alone: 10.001 + 5 ms. Deferred or
  // not.
  const Network net = single_switch_network(3, kB, Time::us(1));
  SimOptions eager;
  eager.defer_flows = false;
  const Time first[] = {Time::ms(15) + Time::us(2), Time::ms(10) + Time::us(2)};
  const Time second[] = {Time::ms(14) + Time::us(2), Time::us(10'001 + 5'000 + 2)};
  const Time gaps[] = {Time::ms(4), Time::us(10'001)};
  for (int i = 0; i < 2; ++i) {
    TaskGraph g;
    const TaskId a = g.add_p2p(RankId(0), RankId(1), Bytes::GB(1), 0, 0);
    const TaskId wait = g.add_compute(RankId(0), 0, gaps[i], Flops(1e9));
    const TaskId b = g.add_p2p(RankId(0), RankId(2), Bytes::GB(0.5), 1, 0);
    g.add_dependency(wait, b);
    for (const SimOptions& o : {SimOptions{}, eager}) {
      const SimResult r = run(g, net, o);
      SCOPED_TRACE(fmt::format("gap {}, {}", gaps[i], o.defer_flows ? "deferred" : "eager"));
      EXPECT_EQ(r.tasks[a.value()].end, first[i]);
      EXPECT_NEAR(r.tasks[b.value()].end.to_seconds(), second[i].to_seconds(), 1e-12);
      EXPECT_EQ(r.contended_deferrals, o.defer_flows ? 1 : 0);
    }
  }
}

TEST(SimulateTest, ComputeAndCommOnSeparateStreamsOverlap) {
  // 10 ms compute || 5 ms + 2 us transfer: makespan is the max, not the sum; the
  // transfer is hidden (no exposed comm).
  Network net = single_switch_network(2, kB, Time::us(1));
  TaskGraph g;
  g.add_compute(RankId(0), 0, Time::ms(10), Flops(1e12));
  g.add_p2p(RankId(0), RankId(1), Bytes::GB(0.5), 0, 0);
  SimResult r = run(g, net);
  EXPECT_EQ(r.makespan, Time::ms(10));
  EXPECT_EQ(r.ranks[0].compute, Time::ms(10));
  EXPECT_EQ(r.ranks[0].comm, Time::ms(5) + Time::us(2));
  EXPECT_EQ(r.ranks[0].exposed_comm, Time::zero());
  EXPECT_EQ(r.ranks[1].exposed_comm, Time::ms(5) + Time::us(2)) << "rank 1 only communicates";
  EXPECT_DOUBLE_EQ(r.ranks[0].flops.count(), 1e12);
}

TEST(SimulateTest, ExposedCommByKindIsEachKindsTimeWithoutCompute) {
  // Rank 0 computes [0, 4 ms]; kind a moves 1 GB out of it over [0, 10 ms + 2 us], kind b
  // 0.5 GB into it after the compute, [4 ms, 9 ms + 2 us] (its own links). Each kind's
  // exposure is its union less the compute; the kinds overlap, so they sum to more than
  // the rank's exposed_comm. Rank 1 computes nothing: every kind is wholly exposed there.
  Network net = single_switch_network(2, kB, Time::us(1));
  TaskGraph g;
  const LabelId fwd = g.label("fwd"), a = g.label("a_comm"), b = g.label("b_comm");
  const TaskId c = g.add_compute(RankId(0), 0, Time::ms(4), Flops(0), {.category = fwd});
  g.add_p2p(RankId(0), RankId(1), Bytes::GB(1), 0, 0, {.category = a});
  const TaskId in = g.add_p2p(RankId(1), RankId(0), Bytes::GB(0.5), 1, 1, {.category = b});
  g.add_dependency(c, in);
  SimOptions opt;
  opt.comm_kind_of_category.assign(g.num_labels() + 1, 2);  // fwd and none: kind 2
  opt.comm_kind_of_category[a.value()] = 0;
  opt.comm_kind_of_category[b.value()] = 1;
  SimResult r = run(g, net, opt);
  ASSERT_EQ(r.ranks[0].exposed_by_kind.size(), 3u);
  EXPECT_EQ(r.ranks[0].exposed_by_kind[0], Time::ms(6) + Time::us(2));
  EXPECT_EQ(r.ranks[0].exposed_by_kind[1], Time::ms(5) + Time::us(2));
  EXPECT_EQ(r.ranks[0].exposed_by_kind[2], Time::zero());
  EXPECT_EQ(r.ranks[0].exposed_comm, Time::ms(6) + Time::us(2));
  EXPECT_EQ(r.ranks[1].exposed_by_kind[0], Time::ms(10) + Time::us(2));
  EXPECT_EQ(r.ranks[1].exposed_by_kind[1], Time::ms(5) + Time::us(2));
  EXPECT_EQ(r.comm_kind_tasks, (std::vector<int64_t>{1, 1, 0})) << "kind 2 has no comm task";
  EXPECT_TRUE(run(g, net).ranks[0].exposed_by_kind.empty()) << "off unless a map is given";
}

TEST(SimulateTest, ExposedCommIsTheCommNotHiddenByCompute) {
  // 4 ms of compute under a 10 ms + 2 us transfer: 6 ms + 2 us of it is exposed.
  Network net = single_switch_network(2, kB, Time::us(1));
  TaskGraph g;
  g.add_compute(RankId(0), 0, Time::ms(4), Flops(0));
  g.add_p2p(RankId(0), RankId(1), Bytes::GB(1), 0, 0);
  SimResult r = run(g, net);
  EXPECT_EQ(r.ranks[0].exposed_comm, Time::ms(6) + Time::us(2));
  EXPECT_EQ(r.ranks[0].comm_stream_busy, (std::vector<Time>{Time::ms(10) + Time::us(2)}));
}

TEST(SimulateTest, TasksOnOneStreamRunInProgramOrder) {
  Network net = single_switch_network(1, kB, Time::zero());
  TaskGraph g;
  TaskId a = g.add_compute(RankId(0), 0, Time::ms(3), Flops(0));
  TaskId b = g.add_compute(RankId(0), 0, Time::ms(4), Flops(0));
  TaskId c = g.add_compute(RankId(0), 1, Time::ms(2), Flops(0));
  SimResult r = run(g, net);
  EXPECT_EQ(r.makespan, Time::ms(7));
  EXPECT_EQ(r.tasks[a.value()].end, Time::ms(3));
  EXPECT_EQ(r.tasks[b.value()].start, Time::ms(3));
  EXPECT_EQ(r.tasks[c.value()].start, Time::zero()) << "stream 1 runs concurrently";
  EXPECT_EQ(r.ranks[0].compute_stream_busy, (std::vector<Time>{Time::ms(7), Time::ms(2)}));
  EXPECT_EQ(r.ranks[0].compute, Time::ms(7));
}

TEST(SimulateTest, DependencyAcrossRanksWaitsForTheTransfer) {
  // Rank 0 computes 1 ms, sends 1 GB (10 ms + 2 us) to rank 1, which then computes 1 ms.
  Network net = single_switch_network(2, kB, Time::us(1));
  TaskGraph g;
  LabelId fwd = g.label("fwd"), pp = g.label("pp_comm");
  TaskId a = g.add_compute(RankId(0), 0, Time::ms(1), Flops(0), {.category = fwd});
  TaskId send = g.add_p2p(RankId(0), RankId(1), Bytes::GB(1), 0, 0, {.category = pp});
  TaskId b = g.add_compute(RankId(1), 0, Time::ms(1), Flops(0), {.category = fwd});
  g.add_dependency(a, send);
  g.add_dependency(send, b);
  SimResult r = run(g, net);
  const Time transfer = Time::ms(10) + Time::us(2);
  EXPECT_EQ(r.tasks[b.value()].start, Time::ms(1) + transfer);
  EXPECT_EQ(r.makespan, Time::ms(2) + transfer);
  ASSERT_EQ(r.categories.size(), 2u);
  EXPECT_EQ(r.categories[0].category, "fwd");
  EXPECT_EQ(r.categories[0].rank_time, Time::ms(2));
  EXPECT_EQ(r.categories[1].category, "pp_comm");
  EXPECT_EQ(r.categories[1].rank_time, transfer * 2) << "counted on both ranks";
}

TEST(SimulateTest, CollectiveStartsWhenTheLastParticipantArrives) {
  Network net = single_switch_network(2, kB, Time::zero());
  TaskGraph g;
  TaskId slow = g.add_compute(RankId(1), 0, Time::ms(4), Flops(0));
  std::vector<RankId> grp = {RankId(0), RankId(1)};
  TaskId ar = g.add_collective({.group = grp, .bytes = Bytes(0)});
  g.add_dependency(slow, ar);
  SimResult r = run(g, net);
  EXPECT_EQ(r.tasks[ar.value()].start, Time::ms(4));
  EXPECT_EQ(r.ranks[0].comm, r.tasks[ar.value()].end - Time::ms(4)) << "waiting is not busy";
}

// ---------------------------------------------------------------- host

TEST(SimulateTest, AHostAheadOfTheGpuCostsNothing) {
  // Three 1 ms kernels issued at 10 us each: the host runs ahead; the GPU waits only for
  // the first launch.
  Network net = single_switch_network(1, kB, Time::zero());
  TaskGraph g;
  for (int i = 0; i < 3; ++i) {
    TaskId t = g.add_compute(RankId(0), 0, Time::ms(1), Flops(0));
    g.set_host(t, Time::us(10));
  }
  SimResult r = run(g, net);
  EXPECT_EQ(r.makespan, Time::ms(3) + Time::us(10));
  EXPECT_EQ(r.ranks[0].host, Time::us(30));
}

TEST(SimulateTest, KernelsShorterThanTheirLaunchRunAtTheHostsPace) {
  // 100 kernels of 2 us, each 10 us to launch: the GPU runs each as soon as it is issued.
  Network net = single_switch_network(1, kB, Time::zero());
  TaskGraph g;
  for (int i = 0; i < 100; ++i)
    g.set_host(g.add_compute(RankId(0), 0, Time::us(2), Flops(0)), Time::us(10));
  EXPECT_EQ(run(g, net).makespan, Time::us(1000) + Time::us(2));
}

TEST(SimulateTest, AfterASyncTheGpuWaitsForTheHostsLaunches) {
  // a (1 ms) is a sync: the host issues b and c (10 us each) only once a has finished, so
  // b starts 10 us after a ends and c 10 us after that although b runs 1 ms; without the
  // sync the host had issued both long before.
  Network net = single_switch_network(1, kB, Time::zero());
  for (bool sync : {false, true}) {
    TaskGraph g;
    TaskId a = g.add_compute(RankId(0), 0, Time::ms(1), Flops(0));
    TaskId b = g.add_compute(RankId(0), 0, Time::ms(1), Flops(0));
    TaskId c = g.add_compute(RankId(0), 1, Time::us(5), Flops(0));
    g.set_host(a, Time::us(10), sync);
    g.set_host(b, Time::us(10));
    g.set_host(c, Time::us(10));
    SimResult r = run(g, net);
    if (!sync) {
      EXPECT_EQ(r.tasks[b.value()].start, Time::ms(1) + Time::us(10));
      EXPECT_EQ(r.tasks[c.value()].start, Time::us(30)) << "stream 1 runs as soon as issued";
      continue;
    }
    EXPECT_EQ(r.tasks[b.value()].start, Time::ms(1) + Time::us(20));
    EXPECT_EQ(r.tasks[c.value()].start, Time::ms(1) + Time::us(30));
    EXPECT_EQ(r.makespan, Time::ms(2) + Time::us(20));
    EXPECT_EQ(r.ranks[0].host_wait, Time::ms(1)) << "a issued at 10 us, run until 1.01 ms";
  }
}

TEST(SimulateTest, ATaskOfManyCallsRunsItsKernelsAsTheHostIssuesThem) {
  // After a sync a (10 us, 1 call), the host issues b: 10 calls at 10 us each (100 us).
  // GPU-bound b (1 ms of 10 kernels) starts after its first call, 10 us after a ends;
  // host-bound b (20 us) ends with its last kernel (2 us) after the last call.
  Network net = single_switch_network(1, kB, Time::zero());
  const TaskId a(0), b(1);
  // The sync a, then b of `d` issued over 100 us as `calls` calls.
  auto simulate = [&](Time d, int32_t calls) {
    TaskGraph g;
    g.add_compute(RankId(0), 0, Time::us(10), Flops(0));
    g.add_compute(RankId(0), 0, d, Flops(0));
    g.set_host(a, Time::us(10), true);
    g.set_host(b, Time::us(100), false, calls);
    return run(g, net);
  };
  for (Time d : {Time::ms(1), Time::us(20)}) {
    SimResult r = simulate(d, 10);
    const Time a_end = Time::us(20);
    EXPECT_EQ(r.tasks[a.value()].end, a_end);
    if (d == Time::ms(1)) {
      EXPECT_EQ(r.tasks[b.value()].start, a_end + Time::us(10));
    } else {
      EXPECT_EQ(r.tasks[b.value()].end, a_end + Time::us(100) + Time::us(2));
      EXPECT_EQ(r.tasks[b.value()].end - r.tasks[b.value()].start, d) << "its span is its work";
    }
    // The GPU waited for a's launch (10 us) and for b's from a's end to b's start.
    EXPECT_EQ(r.ranks[0].launch_wait, Time::us(10) + (r.tasks[b.value()].start - a_end));
    // Issued as one call it would start only after all of its host time.
    EXPECT_EQ(simulate(d, 1).tasks[b.value()].start, a_end + Time::us(100));
  }
}

TEST(SimulateTest, TasksWithoutAHostCostAreNotHeldByTheHost) {
  // The host is held by the sync a until it ends (1.01 ms); b (no host cost) starts beside
  // it at 0, c 10 us after a.
  Network net = single_switch_network(1, kB, Time::zero());
  TaskGraph g;
  TaskId a = g.add_compute(RankId(0), 0, Time::ms(1), Flops(0));
  TaskId b = g.add_compute(RankId(0), 1, Time::ms(1), Flops(0));
  TaskId c = g.add_compute(RankId(0), 1, Time::ms(1), Flops(0));
  g.set_host(a, Time::us(10), true);
  g.set_host(c, Time::us(10));
  SimResult r = run(g, net);
  EXPECT_EQ(r.tasks[b.value()].start, Time::zero());
  EXPECT_EQ(r.tasks[c.value()].start, Time::ms(1) + Time::us(20));
}

TEST(SimulateTest, ACollectiveWaitsForTheLastHostToIssueIt) {
  // Rank 1's host spends 50 us on a kernel before it issues the all-reduce; rank 0's
  // issues it at once: the collective starts when both have.
  Network net = single_switch_network(2, kB, Time::zero());
  TaskGraph g;
  g.set_host(g.add_compute(RankId(1), 0, Time::us(1), Flops(0)), Time::us(50));
  std::vector<RankId> grp = {RankId(0), RankId(1)};
  TaskId ar = g.add_collective({.group = grp, .bytes = Bytes(0)});
  g.set_host(ar, Time::us(5));
  SimResult r = run(g, net);
  EXPECT_EQ(r.tasks[ar.value()].start, Time::us(55));
  EXPECT_EQ(r.ranks[0].host, Time::us(5));
  EXPECT_EQ(r.ranks[1].host, Time::us(55));
}

TEST(SimulateTest, ASyncWaitingOnWorkItsHostHasNotIssuedIsReported) {
  // The sync task a waits for b, which its host issues only after a: neither can run.
  Network net = single_switch_network(1, kB, Time::zero());
  TaskGraph g;
  TaskId a = g.add_compute(RankId(0), 0, Time::ms(1), Flops(0));
  TaskId b = g.add_compute(RankId(0), 1, Time::ms(1), Flops(0));
  g.add_dependency(b, a);
  g.set_host(a, Time::us(1), true);
  g.set_host(b, Time::us(1));
  auto r = simulate(g, net, SimOptions{});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("host order"), std::string::npos) << r.status().to_string();
}

// ---------------------------------------------------------------- collectives

std::vector<RankId> ranks(int n, int first = 0) {
  std::vector<RankId> v;
  for (int i = 0; i < n; ++i) v.push_back(RankId(first + i));
  return v;
}

// Simulated time of one collective alone on `net`.
Time collective_time(const Network& net, CollectiveKind kind, std::span<const RankId> grp, Bytes s,
                     Algorithm algo = Algorithm::kRing) {
  TaskGraph g;
  g.add_collective({.kind = kind, .group = grp, .bytes = s, .algorithm = algo});
  return run(g, net).makespan;
}

TEST(CollectiveTest, RingAllReduceOnOneSwitchMatchesClosedForm) {
  // t = ring_base + 2(n-1) intra hops + 2(n-1)/n * S / B.
  const int n = 8;
  Network net = single_switch_network(n, kB, Time::zero());
  const Bytes s = Bytes::GiB(1);
  auto grp = ranks(n);
  CollectiveConfig cfg;
  const Time latency = cfg.ring_base + cfg.intra_hop * (2 * (n - 1));
  EXPECT_EQ(latency, Time::us(15)) << "NCCL tuner: 6.6 + 14 x 0.6 us";
  const double bw_seconds = 2.0 * (n - 1) / n * s.as_double() / kB.bytes_per_s();
  const Time t = collective_time(net, CollectiveKind::kAllReduce, grp, s);
  EXPECT_NEAR(t.to_seconds(), latency.to_seconds() + bw_seconds, 1e-3 * t.to_seconds());
  EXPECT_EQ(t, idle_time(collective_pattern(CollectiveKind::kAllReduce, Algorithm::kRing, grp,
                                            RankId(0), net, cfg),
                         s, net));
}

TEST(CollectiveTest, RingAllGatherAndReduceScatterMatchClosedForm) {
  // t = ring_base + (n-1) intra hops + (n-1)/n * S / B, S = the total array.
  const int n = 4;
  Network net = single_switch_network(n, kB, Time::zero());
  const Bytes s = Bytes::GiB(2);
  CollectiveConfig cfg;
  const double want = (cfg.ring_base + cfg.intra_hop * (n - 1)).to_seconds() +
                      (n - 1.0) / n * s.as_double() / kB.bytes_per_s();
  for (CollectiveKind k : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter}) {
    Time t = collective_time(net, k, ranks(n), s);
    EXPECT_NEAR(t.to_seconds(), want, 1e-3 * want) << to_string(k);
  }
}

TEST(CollectiveTest, BusBandwidthEqualsLinkBandwidthForRingAlgorithms) {
  // nccl-tests: busbw = S / t x factor; for ring-based algorithms on one switch it is the
  // link bandwidth (latency removed, large S).
  const int n = 8;
  Network net = single_switch_network(n, kB, Time::zero());
  const Bytes s = Bytes::GiB(4);
  auto grp = ranks(n);
  for (CollectiveKind k :
       {CollectiveKind::kAllReduce, CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
        CollectiveKind::kAllToAll, CollectiveKind::kBroadcast, CollectiveKind::kReduce}) {
    auto pattern = collective_pattern(k, Algorithm::kRing, grp, RankId(3), net, {});
    Time t = collective_time(net, k, grp, s) - pattern.latency;
    double busbw = s.as_double() / t.to_seconds() * bus_bandwidth_factor(k, n);
    EXPECT_NEAR(busbw / kB.bytes_per_s(), 1.0, 1e-3) << to_string(k);
  }
}

TEST(CollectiveTest, TwoConcurrentCollectivesOnTheSameLinksEachTakeTwiceAsLong) {
  const int n = 4;
  Network net = single_switch_network(n, kB, Time::zero());
  const Bytes s = Bytes::GiB(1);
  auto grp = ranks(n);
  const Time alone = collective_time(net, CollectiveKind::kAllReduce, grp, s);
  const Time latency =
      collective_pattern(CollectiveKind::kAllReduce, Algorithm::kRing, grp, RankId(0), net, {})
          .latency;
  TaskGraph g;
  TaskId a =
      g.add_collective({.group = grp, .bytes = s, .stream = 0, .algorithm = Algorithm::kRing});
  TaskId b =
      g.add_collective({.group = grp, .bytes = s, .stream = 1, .algorithm = Algorithm::kRing});
  SimResult r = run(g, net);
  for (TaskId t : {a, b}) {
    Time took = r.tasks[t.value()].end - r.tasks[t.value()].start;
    EXPECT_NEAR((took - latency) / (alone - latency), 2.0, 1e-3);
  }
}

TEST(CollectiveTest, CrossNodeAllReduceIsLimitedByTheNics) {
  // 2 nodes x 8 GPUs, one 400 Gb/s NIC per GPU, NVLink 450 GB/s. NCCL runs one ring per
  // NIC (8 channels) ordered node by node; busbw ~ 8 NICs x 50 GB/s = 400 GB/s
  // (calibration.md §2.4: flat ring busbw ~ rails x per-NIC bandwidth).
  ClusterShape shape{.nodes = 2, .gpus_per_node = 8};
  Network net = cluster_network(shape);
  const Bytes s = Bytes::GiB(8);
  auto grp = ranks(16);
  auto pattern =
      collective_pattern(CollectiveKind::kAllReduce, Algorithm::kRing, grp, RankId(0), net, {});
  EXPECT_EQ(pattern.flows.size(), 16u * 8u) << "16 ring edges x 8 channels";
  EXPECT_NEAR(pattern.latency.to_us(), 6.6 + 28 * 0.6 + 2 * 2.7, 1e-6)
      << "inside the 25-50 us floor";
  Time t = collective_time(net, CollectiveKind::kAllReduce, grp, s) - pattern.latency;
  double busbw =
      s.as_double() / t.to_seconds() * bus_bandwidth_factor(CollectiveKind::kAllReduce, 16);
  EXPECT_NEAR(busbw / 1e9, 8 * shape.nic.to_GBps(), 0.01 * 400);
  // With one channel the ring crosses each way through a single NIC: 8x slower.
  Network same = cluster_network(shape);
  SimOptions one;
  one.collectives.channels = 1;
  TaskGraph g;
  g.add_collective({.group = grp, .bytes = s, .algorithm = Algorithm::kRing});
  Time t1 = run(g, same, one).makespan - pattern.latency;
  EXPECT_NEAR(t1 / t, 8.0, 0.05);
}

TEST(CollectiveTest, AllToAllAcrossNodesRunsAtOneNicPerRank) {
  // Each rank sends S/n to every peer at once; the 8 remote shares leave through its own
  // NIC: t ~ (S/2) / 50 GB/s (busbw ~ one NIC, calibration.md §2.4).
  Network net = cluster_network({.nodes = 2, .gpus_per_node = 8});
  const Bytes s = Bytes::GiB(1);
  auto grp = ranks(16);
  auto pattern =
      collective_pattern(CollectiveKind::kAllToAll, Algorithm::kRing, grp, RankId(0), net, {});
  Time t = collective_time(net, CollectiveKind::kAllToAll, grp, s) - pattern.latency;
  EXPECT_NEAR(t.to_seconds(), s.as_double() / 2 / 50e9, 1e-3 * t.to_seconds());
}

// SimOptions::bundle_flows on and off, for the same graph.
std::pair<SimResult, SimResult> bundled_and_not(const TaskGraph& g, const Network& net) {
  SimOptions flat;
  flat.bundle_flows = false;
  return {run(g, net), run(g, net, flat)};
}

TEST(CollectiveTest, BundledAllToAllsRunAsTheirFlowsDoWithTwoFlowsPerSource) {
  // Two concurrent all-to-alls over 4 nodes x 8 (they contend, so they run in the shared
  // flow network): each source's 7 NVLink flows and 24 NIC flows become two bundles, and
  // every task ends when it does flow by flow.
  Network net = cluster_network({.nodes = 4, .gpus_per_node = 8});
  auto grp = ranks(32);
  TaskGraph g;
  for (int stream = 0; stream < 2; ++stream)
    g.add_collective({.kind = CollectiveKind::kAllToAll,
                      .group = grp,
                      .bytes = Bytes::MiB(256 + 128 * stream),
                      .stream = stream});
  auto [bundled, flat] = bundled_and_not(g, net);
  EXPECT_EQ(bundled.flows_started, 2 * 32 * 2);
  EXPECT_EQ(flat.flows_started, 2 * 32 * 31);
  for (int t = 0; t < 2; ++t)
    EXPECT_NEAR(static_cast<double>(bundled.tasks[t].end.count_ps()),
                static_cast<double>(flat.tasks[t].end.count_ps()), 1e3)
        << "task " << t;
}

TEST(CollectiveTest, BundlesOfATaskWithCopiesWeighTheirMembersAndTheCopies) {
  // An all-to-all over the 8 GPUs of node 0 standing for the same on nodes 1..3, beside a
  // ring all-reduce over one GPU per node (sharing its NVLink and NIC links): bundles carry
  // their members times the copies' load on each link, as per-flow weights do.
  Network net = cluster_network({.nodes = 4, .gpus_per_node = 8});
  TaskGraph g;
  std::vector<RankId> copies;
  for (int node = 1; node < 4; ++node)
    for (RankId r : ranks(8, 8 * node)) copies.push_back(r);
  const auto node0 = ranks(8);
  g.add_collective({.kind = CollectiveKind::kAllToAll,
                    .group = node0,
                    .bytes = Bytes::GiB(1),
                    .copies = g.add_group(copies)});
  const std::vector<RankId> across = {RankId(0), RankId(8), RankId(16), RankId(24)};
  g.add_collective({.kind = CollectiveKind::kAllGather,
                    .group = across,
                    .bytes = Bytes::GiB(2),
                    .stream = 1,
                    .algorithm = Algorithm::kRing});
  const std::vector<RankId> inside = {RankId(0), RankId(1)};
  g.add_collective({.group = inside, .bytes = Bytes::GiB(1), .stream = 2});
  auto [bundled, flat] = bundled_and_not(g, net);
  EXPECT_LT(bundled.flows_started, flat.flows_started);
  for (int t = 0; t < 3; ++t)
    EXPECT_NEAR(static_cast<double>(bundled.tasks[t].end.count_ps()),
                static_cast<double>(flat.tasks[t].end.count_ps()), 1e3)
        << "task " << t;
}

TEST(CollectiveTest, ABundleWeighsItsMembersOnTheLinkTheyShare) {
  // Six ranks on one switch whose up links are 4x slower than its down links: a rank's two
  // all-to-all flows share its up link at C/2 each, so each S/3 takes 2S / (3C), bundled or
  // not, alone or standing for a copy on ranks 3..5.
  const Bandwidth up = Bandwidth::GBps(25);
  Network net(6);
  for (int r = 0; r < 6; ++r) net.add_link(up, Time::zero(), fmt::format("up {}", r));
  for (int r = 0; r < 6; ++r) net.add_link(up * 4.0, Time::zero(), fmt::format("down {}", r));
  net.set_router([](RankId src, RankId dst, std::vector<LinkId>& out) {
    out.push_back(LinkId(src.value()));
    out.push_back(LinkId(6 + dst.value()));
  });
  SimOptions zero;
  zero.collectives = {.ring_base = Time::zero(), .intra_hop = Time::zero()};
  SimOptions flat = zero;
  flat.bundle_flows = false;
  const Bytes s = Bytes::GB(3);
  const double want = 2.0 * s.as_double() / (3.0 * up.bytes_per_s());
  for (bool with_copies : {false, true}) {
    TaskGraph g;
    const auto copy = ranks(3, 3);
    g.add_collective({.kind = CollectiveKind::kAllToAll,
                      .group = ranks(3),
                      .bytes = s,
                      .copies = with_copies ? g.add_group(copy) : GroupId()});
    for (const SimOptions& o : {zero, flat})
      EXPECT_NEAR(run(g, net, o).makespan.to_seconds(), want, 1e-9)
          << (with_copies ? "with copies, " : "") << (o.bundle_flows ? "bundled" : "flat");
  }
}

TEST(CollectiveTest, ABundleUnderUnevenContentionEndsWithItsMostContendedMember) {
  // All-to-all of S over ranks 0..2 on one switch, beside a long transfer 3 -> 1: rank 1's
  // down link carries 0 -> 1, 2 -> 1 and 3 -> 1 at B/3 each, so the members into rank 1
  // (S/3 each) end at S / B, in both modes; the others end earlier (flow by flow) or move
  // at their bundle's pace (bundled), which the collective's end does not see.
  Network net = single_switch_network(4, kB, Time::zero());
  SimOptions zero;
  zero.collectives = {.ring_base = Time::zero(), .intra_hop = Time::zero()};
  const Bytes s = Bytes::GB(3);
  TaskGraph g;
  g.add_collective({.kind = CollectiveKind::kAllToAll, .group = ranks(3), .bytes = s});
  g.add_p2p(RankId(3), RankId(1), Bytes::GB(100), 1, 1);
  SimOptions flat = zero;
  flat.bundle_flows = false;
  const SimResult bundled = run(g, net, zero), per_flow = run(g, net, flat);
  EXPECT_EQ(bundled.flows_started, 3 + 1);
  EXPECT_EQ(per_flow.flows_started, 6 + 1);
  const double want = s.as_double() / kB.bytes_per_s();
  EXPECT_NEAR(bundled.tasks[0].end.to_seconds(), want, 1e-9);
  EXPECT_NEAR(per_flow.tasks[0].end.to_seconds(), want, 1e-9);
}

TEST(CollectiveTest, TreeAllReduceMovesAboutTwiceTheBufferPerRank) {
  // Double binary tree: each tree carries S/2 up and down every edge; summed over ranks
  // the shares are 2(n-1) (each of the 2 trees x (n-1) edges x 2 directions x 1/2).
  Network net = cluster_network({.nodes = 4, .gpus_per_node = 8});
  auto grp = ranks(32);
  auto p =
      collective_pattern(CollectiveKind::kAllReduce, Algorithm::kTree, grp, RankId(0), net, {});
  double total = 0;
  for (const auto& f : p.flows) total += f.share;
  EXPECT_NEAR(total, 2.0 * 31, 1e-9);
  CollectiveConfig cfg;
  EXPECT_EQ(p.latency, cfg.tree_base + (cfg.intra_hop * 7 + cfg.tree_inter_hop * 2) * 2);
}

TEST(CollectiveTest, AutoPicksTreeForSmallMessagesAcrossManyNodesAndRingOtherwise) {
  Network net = cluster_network({.nodes = 16, .gpus_per_node = 8});
  auto grp = ranks(128);
  auto one_node = ranks(8);
  const CollectiveConfig cfg;
  const auto ar = CollectiveKind::kAllReduce;
  EXPECT_EQ(choose_algorithm(ar, grp, RankId(0), Bytes::KiB(64), net, cfg), Algorithm::kTree);
  EXPECT_EQ(choose_algorithm(ar, grp, RankId(0), Bytes::GiB(16), net, cfg), Algorithm::kRing);
  EXPECT_EQ(choose_algorithm(ar, one_node, RankId(0), Bytes::KiB(64), net, cfg), Algorithm::kRing);
  EXPECT_EQ(choose_algorithm(CollectiveKind::kAllGather, grp, RankId(0), Bytes::KiB(64), net, cfg),
            Algorithm::kRing);
  // simulate() resolves kAuto the same way.
  TaskGraph g;
  TaskId small = g.add_collective({.group = grp, .bytes = Bytes::KiB(64)});
  SimResult r = run(g, net);
  EXPECT_EQ(r.algorithms[small.value()], Algorithm::kTree);
}

// A collective whose bytes are negligible next to its latency runs at its idle-network time
// even beside a transfer that shares its links (it skips the flow network).
TEST(CollectiveTest, ALatencyBoundCollectiveIsTimedAloneBesideTraffic) {
  Network net = single_switch_network(2, kB, Time::us(1));
  std::vector<RankId> grp = {RankId(0), RankId(1)};
  TaskGraph alone;
  alone.add_collective({.group = grp, .bytes = Bytes(64), .stream = 1});
  const Time isolated = run(alone, net).makespan;
  TaskGraph busy;
  busy.add_p2p(RankId(0), RankId(1), Bytes::GB(1), 0, 0);
  TaskId tiny = busy.add_collective({.group = grp, .bytes = Bytes(64), .stream = 1});
  SimResult r = run(busy, net);
  EXPECT_EQ(r.tasks[tiny.value()].end - r.tasks[tiny.value()].start, isolated);
  // A big one beside the same transfer shares the link and takes longer than alone.
  TaskGraph big_alone, big_busy;
  big_alone.add_collective({.group = grp, .bytes = Bytes::MiB(64), .stream = 1});
  big_busy.add_p2p(RankId(0), RankId(1), Bytes::GB(1), 0, 0);
  TaskId big = big_busy.add_collective({.group = grp, .bytes = Bytes::MiB(64), .stream = 1});
  SimResult rb = run(big_busy, net);
  EXPECT_GT(rb.tasks[big.value()].end - rb.tasks[big.value()].start, run(big_alone, net).makespan);
}

TEST(CollectiveTest, SingleRankCollectiveIsFree) {
  Network net = single_switch_network(2, kB, Time::zero());
  EXPECT_EQ(collective_time(net, CollectiveKind::kAllReduce, ranks(1), Bytes::GiB(1)),
            Time::zero());
}

// ---------------------------------------------------------------- trace

TEST(SimulateTest, CopyEngineCollectivesLeaveComputeAloneAndPayNoNcclLatency) {
  // The all-reduce of CollectivesSlowTheComputeTheyOverlap, moved by copy engines: the
  // 10 ms of compute beside it keep their time, and it takes its flows' time only.
  Network net = single_switch_network(2, kB, Time::zero());
  const auto grp = ranks(2);
  for (bool copy_engine : {false, true}) {
    TaskGraph g;
    g.add_compute(RankId(0), 0, Time::ms(10), Flops(0));
    const TaskId ar =
        g.add_collective({.group = grp, .bytes = Bytes::GB(0.5), .copy_engine = copy_engine});
    SimOptions o;
    o.record_tasks = true;
    o.collective_compute_slowdown = {0.5, 0.5};
    const SimResult r = *simulate(g, net, o);
    const Time flows = r.tasks[ar.value()].end;
    const Time latency =
        collective_pattern(CollectiveKind::kAllReduce, Algorithm::kRing, grp, RankId(0), net, {})
            .latency;
    if (copy_engine) {
      EXPECT_EQ(r.tasks[0].end, Time::ms(10));
      EXPECT_EQ(flows, Bytes::GB(0.5) / kB) << "one ring edge of S at B, no latency";
    } else {
      EXPECT_GT(r.tasks[0].end, Time::ms(10));
      EXPECT_EQ(flows, Bytes::GB(0.5) / kB + latency);
    }
  }
}

// CollectiveConfig's size scale: an NCCL collective of S bytes whose scope's curve gives
// factor f at S moves its flows at f of their rate (S / f bytes), and pays its latency as
// before; a copy-engine collective, a P2P and a kind without a curve keep their time. Here
// the curve is 0.5 at S / 2 and 1 at 2 S: 0.75 at S (log2-interpolated).
TEST(SimulateTest, SizeScaleSlowsNcclCollectivesOfMidSizeMessages) {
  Network net = single_switch_network(2, kB, Time::zero());
  const auto grp = ranks(2);
  const Bytes s = Bytes::GB(0.5);
  auto run = [&](bool scaled, bool copy_engine, CollectiveKind kind) {
    TaskGraph g;
    const TaskId t =
        g.add_collective({.kind = kind, .group = grp, .bytes = s, .copy_engine = copy_engine});
    SimOptions o;
    o.record_tasks = true;
    if (scaled)
      o.collectives.curves[0]
          .intra_node_size_scale[static_cast<size_t>(CollectiveKind::kAllReduce)] = {
          {s.count() / 2, 0.5}, {2 * s.count(), 1.0}};
    return simulate(g, net, o)->tasks[t.value()].end;
  };
  const Time latency =
      collective_pattern(CollectiveKind::kAllReduce, Algorithm::kRing, grp, RankId(0), net, {})
          .latency;
  const Time plain = run(false, false, CollectiveKind::kAllReduce);
  const Time scaled = run(true, false, CollectiveKind::kAllReduce);
  EXPECT_NEAR((scaled - latency).to_seconds() / (plain - latency).to_seconds(), 1 / 0.75, 1e-6);
  EXPECT_EQ(run(true, true, CollectiveKind::kAllReduce),
            run(false, true, CollectiveKind::kAllReduce));
  EXPECT_EQ(run(true, false, CollectiveKind::kAllGather),
            run(false, false, CollectiveKind::kAllGather));
  // The inter-node curve does not reach a group inside one node.
  TaskGraph g;
  const TaskId t = g.add_collective({.group = grp, .bytes = s});
  SimOptions o;
  o.record_tasks = true;
  o.collectives.curves[0].inter_node_size_scale[static_cast<size_t>(CollectiveKind::kAllReduce)] = {
      {s.count(), 0.5}};
  EXPECT_EQ(simulate(g, net, o)->tasks[t.value()].end, plain);
}

// CollectiveConfig's node scale: an NCCL collective across k nodes moves its flows at the
// curve's factor at k of their rate (a ring of NCCL's all_gather / reduce_scatter below the
// per-NIC rate at scale), on top of the size scale; inside one node, on a copy engine or for
// a kind without a curve it keeps its time. Here the curve is 1 at 2 nodes, 0.5 at 4.
TEST(SimulateTest, NodeScaleSlowsRingsThatSpanManyNodes) {
  Network net = single_switch_network(4, kB, Time::zero());
  for (int r = 0; r < 4; ++r) net.set_node(RankId(r), NodeId(r));  // one rank per node
  const Bytes s = Bytes::GB(0.5);
  auto run = [&](int n, bool scaled, bool copy_engine, CollectiveKind kind) {
    TaskGraph g;
    const TaskId t =
        g.add_collective({.kind = kind, .group = ranks(n), .bytes = s, .copy_engine = copy_engine});
    SimOptions o;
    o.record_tasks = true;
    if (scaled)
      o.collectives.curves[0]
          .inter_node_node_scale[static_cast<size_t>(CollectiveKind::kReduceScatter)] = {{2, 1.0},
                                                                                         {4, 0.5}};
    return simulate(g, net, o)->tasks[t.value()].end;
  };
  const Time latency = collective_pattern(CollectiveKind::kReduceScatter, Algorithm::kRing,
                                          ranks(4), RankId(0), net, {})
                           .latency;
  const Time plain = run(4, false, false, CollectiveKind::kReduceScatter);
  EXPECT_NEAR((run(4, true, false, CollectiveKind::kReduceScatter) - latency).to_seconds() /
                  (plain - latency).to_seconds(),
              2.0, 1e-6);
  EXPECT_EQ(run(2, true, false, CollectiveKind::kReduceScatter),
            run(2, false, false, CollectiveKind::kReduceScatter));  // 2 nodes: factor 1
  EXPECT_EQ(run(4, true, true, CollectiveKind::kReduceScatter),
            run(4, false, true, CollectiveKind::kReduceScatter));  // copy engines
  EXPECT_EQ(run(4, true, false, CollectiveKind::kAllGather),
            run(4, false, false, CollectiveKind::kAllGather));  // no curve of its own
  // Inside one node the curve does not apply.
  Network one = single_switch_network(4, kB, Time::zero());
  TaskGraph g;
  const TaskId t =
      g.add_collective({.kind = CollectiveKind::kReduceScatter, .group = ranks(4), .bytes = s});
  SimOptions o;
  o.record_tasks = true;
  const Time alone = simulate(g, one, o)->tasks[t.value()].end;
  o.collectives.curves[0]
      .inter_node_node_scale[static_cast<size_t>(CollectiveKind::kReduceScatter)] = {{2, 0.5}};
  EXPECT_EQ(simulate(g, one, o)->tasks[t.value()].end, alone);
}

// Nodes of different kinds (CollectiveConfig::node_curves): a ring over nodes of the kind
// with a node scale slows, one over nodes of the other kind does not, and one spanning
// both runs at its slowest kind's factor.
TEST(SimulateTest, EachKindOfNodeFollowsItsOwnRamps) {
  Network net = single_switch_network(4, kB, Time::zero());
  for (int r = 0; r < 4; ++r) net.set_node(RankId(r), NodeId(r));  // one rank per node
  const Bytes s = Bytes::GB(0.5);
  SimOptions o;
  o.record_tasks = true;
  o.collectives.curves.resize(2);
  o.collectives.curves[1]
      .inter_node_node_scale[static_cast<size_t>(CollectiveKind::kReduceScatter)] = {{2, 0.5}};
  o.collectives.node_curves = {0, 0, 1, 1};
  auto run = [&](std::vector<RankId> group) {
    TaskGraph g;
    const TaskId t =
        g.add_collective({.kind = CollectiveKind::kReduceScatter, .group = group, .bytes = s});
    return simulate(g, net, o)->tasks[t.value()].end;
  };
  const std::vector<RankId> first_two = {RankId(0), RankId(1)};
  const Time latency = collective_pattern(CollectiveKind::kReduceScatter, Algorithm::kRing,
                                          first_two, RankId(0), net, {})
                           .latency;
  const Time plain = run(first_two);
  const Time scaled = run({RankId(2), RankId(3)});
  EXPECT_NEAR((scaled - latency).to_seconds() / (plain - latency).to_seconds(), 2.0, 1e-6);
  EXPECT_EQ(run({RankId(1), RankId(2)}), scaled);
  EXPECT_EQ(o.collectives.curves_of(NodeId(7)).inter_node_node_scale,
            o.collectives.curves[0].inter_node_node_scale);  // past node_curves: kind 0
  // Per-step latencies: a kind's own where set (else the config's), the largest of the kinds
  // a ring spans.
  o.collectives.curves[1].ring_inter_hop = Time::us(10);
  auto ring_latency = [&](std::vector<RankId> group) {
    return collective_pattern(CollectiveKind::kReduceScatter, Algorithm::kRing, group,
                              group.front(), net, o.collectives)
        .latency;
  };
  EXPECT_EQ(ring_latency(first_two), latency);
  EXPECT_EQ(ring_latency({RankId(2), RankId(3)}) - latency,
            Time::us(10) - o.collectives.ring_inter_hop);
  EXPECT_EQ(ring_latency({RankId(1), RankId(2)}), ring_latency({RankId(2), RankId(3)}));
}

// A collective from NCCL-registered buffers (CollectiveSpec::registered) slows the compute
// beside it by its own figure: by kind (all-gather or reduction) inside one node and over
// one member per node; across nodes with two members on a node by the cross-node figure,
// as an unregistered one; without registered figures as an unregistered one.
TEST(SimulateTest, RegisteredCollectivesSlowComputeByTheirOwnFigures) {
  // Two nodes of two GPUs: ranks 0, 1 on node 0, ranks 2, 3 on node 1.
  Network net = cluster_network({.nodes = 2, .gpus_per_node = 2});
  const RankId in_node[] = {RankId(0), RankId(1)};
  const RankId one_per_node[] = {RankId(0), RankId(2)};
  const RankId across[] = {RankId(0), RankId(1), RankId(2)};
  // Rank 0's 10 ms of compute beside one collective; the factor it ran at while the
  // collective was in flight, from its end: d + (10 ms - d / f).
  auto factor = [&](std::span<const RankId> group, CollectiveKind kind, bool registered,
                    bool figures) {
    TaskGraph g;
    g.add_compute(RankId(0), 0, Time::ms(10), Flops(0));
    const TaskId c = g.add_collective(
        {.kind = kind, .group = group, .bytes = Bytes(10000000), .registered = registered});
    SimOptions o;
    o.record_tasks = true;
    o.collective_compute_slowdown.assign(4, 0.5);
    o.cross_node_collective_compute_slowdown.assign(4, 0.25);
    if (figures)
      o.registered_collective_compute_slowdown.assign(4, {.in_node_gather = 0.01,
                                                          .in_node_reduce = 0.02,
                                                          .one_per_node_gather = 0.03,
                                                          .one_per_node_reduce = 0.04});
    const SimResult r = *simulate(g, net, o);
    const double d = r.tasks[c.value()].end.to_seconds();
    EXPECT_LT(d, 0.005);
    const double end = r.tasks[0].end.to_seconds();
    return d / (d - (end - 0.010));  // d / (work done while it ran) = 1 + slowdown
  };
  const CollectiveKind ag = CollectiveKind::kAllGather, rs = CollectiveKind::kReduceScatter,
                       ar = CollectiveKind::kAllReduce;
  EXPECT_NEAR(factor(in_node, ag, true, true), 1.01, 1e-6);
  EXPECT_NEAR(factor(in_node, rs, true, true), 1.02, 1e-6);
  EXPECT_NEAR(factor(in_node, ar, true, true), 1.02, 1e-6);
  EXPECT_NEAR(factor(one_per_node, ag, true, true), 1.03, 1e-6);
  EXPECT_NEAR(factor(one_per_node, rs, true, true), 1.04, 1e-6);
  EXPECT_NEAR(factor(across, ag, true, true), 1.25, 1e-6);
  // Unregistered, or without figures: the in-node and cross-node ones.
  EXPECT_NEAR(factor(in_node, ag, false, true), 1.5, 1e-6);
  EXPECT_NEAR(factor(one_per_node, rs, false, true), 1.25, 1e-6);
  EXPECT_NEAR(factor(in_node, rs, true, false), 1.5, 1e-6);
  EXPECT_NEAR(factor(one_per_node, ag, true, false), 1.25, 1e-6);
}

TEST(SimulateTest, CollectivesSlowTheComputeTheyOverlap) {
  // 10 ms of compute on rank 0 beside an all-reduce of d on ranks 0 and 1, slowdown 0.5:
  // the compute does d / 1.5 of its work while the collective runs, the rest at full
  // speed afterwards. Rank 1's compute, started when the collective ends, is not slowed.
  Network net = single_switch_network(2, kB, Time::us(1));
  const auto grp = ranks(2);
  TaskGraph g;
  g.add_compute(RankId(0), 0, Time::ms(10), Flops(0));
  const TaskId ar = g.add_collective({.group = grp, .bytes = Bytes::GB(0.5)});
  const TaskId after = g.add_compute(RankId(1), 0, Time::ms(3), Flops(0));
  g.add_dependency(ar, after);
  SimOptions o;
  o.record_tasks = true;
  const SimResult plain = *simulate(g, net, o);
  const Time d = plain.tasks[ar.value()].end;
  ASSERT_GT(d, Time::ms(1));
  ASSERT_LT(d, Time::ms(10));
  EXPECT_EQ(plain.tasks[0].end, Time::ms(10));

  o.collective_compute_slowdown = {0.5, 0.5};
  const SimResult slowed = *simulate(g, net, o);
  EXPECT_EQ(slowed.tasks[ar.value()].end, d) << "the collective itself is not slowed";
  const double expect_ps = d.count_ps() + (Time::ms(10).count_ps() - d.count_ps() / 1.5);
  EXPECT_NEAR(static_cast<double>(slowed.tasks[0].end.count_ps()), expect_ps, 2.0);
  EXPECT_EQ(slowed.tasks[after.value()].end - slowed.tasks[after.value()].start, Time::ms(3));

  // A compute task that starts inside the collective runs slowed until it ends.
  TaskGraph g2;
  const TaskId ar2 = g2.add_collective({.group = grp, .bytes = Bytes::GB(1)});
  const TaskId inside = g2.add_compute(RankId(1), 0, Time::us(100), Flops(0));
  const SimResult r2 = *simulate(g2, net, o);
  EXPECT_LT(r2.tasks[inside.value()].end, r2.tasks[ar2.value()].end);
  EXPECT_EQ(r2.tasks[inside.value()].end, Time::us(150));

  // P2P transfers leave compute alone.
  TaskGraph g3;
  g3.add_compute(RankId(0), 0, Time::ms(10), Flops(0));
  g3.add_p2p(RankId(0), RankId(1), Bytes::GB(1), 0, 0);
  EXPECT_EQ(simulate(g3, net, o)->tasks[0].end, Time::ms(10));

  // So do collectives across nodes under the in-node slowdown; one inside a node slows its
  // members only.
  Network two_nodes = cluster_network({.nodes = 2, .gpus_per_node = 2});
  TaskGraph g4;
  g4.add_compute(RankId(0), 0, Time::ms(10), Flops(0));
  g4.add_compute(RankId(2), 0, Time::ms(10), Flops(0));
  const RankId across[] = {RankId(0), RankId(2)};
  const TaskId ar4 = g4.add_collective({.group = across, .bytes = Bytes::GB(0.01)});
  o.collective_compute_slowdown = {0.5, 0.5, 0.5, 0.5};
  const SimResult r4 = *simulate(g4, two_nodes, o);
  EXPECT_EQ(r4.tasks[0].end, Time::ms(10));
  EXPECT_EQ(r4.tasks[1].end, Time::ms(10));
  // The cross-node slowdown (0.25 here) takes them: d / 1.25 of the work done while it
  // runs, the rest at full speed; rank 0's own figure applies to rank 0 only.
  o.cross_node_collective_compute_slowdown = {0.25, 0.0, 0.0, 0.0};
  const SimResult x4 = *simulate(g4, two_nodes, o);
  const Time d4 = x4.tasks[ar4.value()].end;
  EXPECT_EQ(d4, r4.tasks[ar4.value()].end) << "the collective itself is not slowed";
  EXPECT_NEAR(static_cast<double>(x4.tasks[0].end.count_ps()),
              d4.count_ps() + (Time::ms(10).count_ps() - d4.count_ps() / 1.25), 2.0);
  EXPECT_EQ(x4.tasks[1].end, Time::ms(10)) << "rank 2's cross-node slowdown is 0";
  TaskGraph g5;
  g5.add_compute(RankId(0), 0, Time::ms(10), Flops(0));
  g5.add_compute(RankId(2), 0, Time::ms(10), Flops(0));
  const RankId inside_node[] = {RankId(0), RankId(1)};
  g5.add_collective({.group = inside_node, .bytes = Bytes::GB(0.01)});
  const SimResult r5 = *simulate(g5, two_nodes, o);
  EXPECT_GT(r5.tasks[0].end, Time::ms(10));
  EXPECT_EQ(r5.tasks[1].end, Time::ms(10)) << "rank 2 is not a member";
  // Inside a node the in-node figure (0.5) applies, not the cross-node one; with a short
  // cross-node collective in flight too, the larger of the two (not their sum).
  auto beside_in_node = [&](bool with_cross) {
    TaskGraph g6;
    g6.add_compute(RankId(0), 0, Time::ms(10), Flops(0));
    g6.add_compute(RankId(2), 0, Time::ms(10), Flops(0));
    g6.add_collective({.group = inside_node, .bytes = Bytes::GB(0.5)});
    if (with_cross) g6.add_collective({.group = across, .bytes = Bytes(1024), .stream = 1});
    return *simulate(g6, two_nodes, o);
  };
  o.cross_node_collective_compute_slowdown = {0.25, 0.25, 0.25, 0.25};
  const SimResult alone = beside_in_node(false), r6 = beside_in_node(true);
  ASSERT_LT(r6.tasks[3].end, r6.tasks[2].end) << "the cross-node one ends first";
  EXPECT_GT(alone.tasks[0].end, Time::ms(10));
  EXPECT_NEAR(static_cast<double>(r6.tasks[0].end.count_ps()),
              static_cast<double>(alone.tasks[0].end.count_ps()), 2.0);
  EXPECT_GT(r6.tasks[1].end, Time::ms(10)) << "rank 2 computes beside the cross-node one";
}

TEST(SimulateTest, RanksSharingComputeUnitsShareTheirSpeed) {
  // 4 ranks on one node with 2 units: three 10 ms tasks and one 5 ms task start together.
  // All four run at half speed until the short one ends at 10 ms (5 ms of work each done),
  // then three share 2 units: the rest takes 5 x 1.5 ms, ending at 17.5 ms = 35 ms / 2.
  Network net = single_switch_network(4, kB, Time::us(1));
  TaskGraph g;
  for (int r = 0; r < 3; ++r) g.add_compute(RankId(r), 0, Time::ms(10), Flops(0));
  const TaskId short_task = g.add_compute(RankId(3), 0, Time::ms(5), Flops(0));
  SimOptions o;
  o.record_tasks = true;
  o.node_compute_units = {2};
  const SimResult r = *simulate(g, net, o);
  EXPECT_EQ(r.tasks[short_task.value()].end, Time::ms(10));
  for (int t = 0; t < 3; ++t) EXPECT_EQ(r.tasks[t].end, Time::us(17500)) << t;
  EXPECT_EQ(r.makespan, Time::us(17500));
  // As many units as ranks: nothing shared.
  o.node_compute_units = {4};
  EXPECT_EQ(simulate(g, net, o)->makespan, Time::ms(10));
}

TEST(TraceTest, TheHostHasATrackWithEachLaunchAndEachWaitForTheGpu) {
  // a (1 ms, a sync) and b: the host launches a over [0, 10 us), waits for it until 1 ms,
  // then launches b over [1 ms, 1 ms + 10 us).
  Network net = single_switch_network(1, kB, Time::zero());
  TaskGraph g;
  TaskId a = g.add_compute(RankId(0), 0, Time::ms(1), Flops(0), {.name = g.label("router")});
  TaskId b = g.add_compute(RankId(0), 0, Time::ms(1), Flops(0), {.name = g.label("experts")});
  g.set_host(a, Time::us(10), true);
  g.set_host(b, Time::us(10));
  std::ostringstream out;
  {
    ChromeTraceWriter writer(out);
    ASSERT_TRUE(simulate(g, net, {}, &writer).is_ok());
  }
  nlohmann::json doc = nlohmann::json::parse(out.str());
  std::vector<nlohmann::json> host;
  bool named = false;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && e["tid"] == ChromeTraceWriter::kHostThread) host.push_back(e);
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "host") named = true;
  }
  EXPECT_TRUE(named);
  ASSERT_EQ(host.size(), 3u);
  EXPECT_EQ(host[0]["name"], "router");
  EXPECT_DOUBLE_EQ(host[0]["dur"].get<double>(), 10.0);
  EXPECT_EQ(host[1]["name"], "wait for GPU: router");
  EXPECT_EQ(host[1]["cat"], "host_wait");
  EXPECT_DOUBLE_EQ(host[1]["ts"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(host[1]["dur"].get<double>(), 1000.0);
  EXPECT_EQ(host[2]["name"], "experts");
  EXPECT_DOUBLE_EQ(host[2]["ts"].get<double>(), 1010.0);
}

TEST(TraceTest, ChromeTraceIsValidJsonWithOneEventPerTaskStream) {
  Network net = single_switch_network(2, kB, Time::us(1));
  TaskGraph g;
  TaskId a = g.add_compute(RankId(0), 0, Time::us(1.5), Flops(0),
                           {.category = g.label("fwd"), .name = g.label("layer \"0\"\n")});
  std::vector<RankId> grp = {RankId(0), RankId(1)};
  TaskId ar = g.add_collective({.group = grp, .bytes = Bytes::MiB(1), .stream = 1},
                               {.category = g.label("dp_comm")});
  g.add_dependency(a, ar);
  std::ostringstream out;
  {
    ChromeTraceWriter writer(out);
    ASSERT_TRUE(simulate(g, net, {}, &writer).is_ok());
  }
  nlohmann::json doc = nlohmann::json::parse(out.str());  // throws if invalid
  std::vector<nlohmann::json> complete;
  std::set<std::string> processes, threads;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") complete.push_back(e);
    if (e["ph"] == "M" && e["name"] == "process_name") processes.insert(e["args"]["name"]);
    if (e["ph"] == "M" && e["name"] == "thread_name")
      threads.insert(
          fmt::format("{}/{}", e["pid"].get<int>(), e["args"]["name"].get<std::string>()));
  }
  ASSERT_EQ(complete.size(), 3u) << "compute on rank 0 + all_reduce on ranks 0 and 1";
  EXPECT_EQ(complete[0]["name"], "layer \"0\"\n");
  EXPECT_EQ(complete[0]["cat"], "fwd");
  EXPECT_DOUBLE_EQ(complete[0]["ts"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(complete[0]["dur"].get<double>(), 1.5);
  EXPECT_EQ(complete[1]["name"], "all_reduce");
  EXPECT_EQ(complete[1]["cat"], "dp_comm");
  EXPECT_DOUBLE_EQ(complete[1]["ts"].get<double>(), 1.5);
  EXPECT_EQ(complete[1]["tid"], ChromeTraceWriter::thread_id({RankId(0), StreamKind::kComm, 1}));
  EXPECT_EQ(processes, (std::set<std::string>{"rank 0", "rank 1"}));
  EXPECT_EQ(threads, (std::set<std::string>{"0/compute 0", "0/comm 1", "1/comm 1"}));

  // A named stream carries its name on every rank's track.
  g.set_stream_name(StreamKind::kComm, 1, "dp \"collectives\"");
  EXPECT_EQ(g.stream_name(StreamKind::kComm, 1), "dp \"collectives\"");
  EXPECT_EQ(g.stream_name(StreamKind::kComm, 5), "");
  std::ostringstream named;
  {
    ChromeTraceWriter writer(named);
    ASSERT_TRUE(simulate(g, net, {}, &writer).is_ok());
  }
  threads.clear();
  const nlohmann::json named_doc = nlohmann::json::parse(named.str());
  for (const auto& e : named_doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name")
      threads.insert(
          fmt::format("{}/{}", e["pid"].get<int>(), e["args"]["name"].get<std::string>()));
  EXPECT_EQ(threads, (std::set<std::string>{"0/compute 0", "0/comm 1: dp \"collectives\"",
                                            "1/comm 1: dp \"collectives\""}));
}

// ---------------------------------------------------------------- determinism

// A small pipeline: 4 stages x 2 DP replicas on 2 nodes, forward/backward microbatches
// with P2P between stages, DP all-reduce at the end overlapping the next compute.
TaskGraph pipeline_graph() {
  TaskGraph g;
  const int stages = 4, dp = 2, micro = 6;
  LabelId fwd = g.label("fwd"), bwd = g.label("bwd"), pp = g.label("pp_comm"),
          dpc = g.label("dp_comm");
  auto rank = [&](int stage, int replica) { return RankId(stage * dp + replica); };
  for (int rep = 0; rep < dp; ++rep) {
    std::vector<TaskId> prev(micro);
    for (int s = 0; s < stages; ++s)
      for (int m = 0; m < micro; ++m) {
        TaskId f =
            g.add_compute(rank(s, rep), 0, Time::us(300 + 10 * s), Flops(1e12), {.category = fwd});
        if (s > 0) {
          TaskId x =
              g.add_p2p(rank(s - 1, rep), rank(s, rep), Bytes::MiB(64), 0, 0, {.category = pp});
          g.add_dependency(prev[m], x);
          g.add_dependency(x, f);
        }
        prev[m] = f;
      }
    for (int s = stages - 1; s >= 0; --s)
      for (int m = 0; m < micro; ++m) {
        TaskId b = g.add_compute(rank(s, rep), 0, Time::us(600), Flops(2e12), {.category = bwd});
        g.add_dependency(prev[m], b);
        prev[m] = b;
      }
  }
  for (int s = 0; s < stages; ++s) {
    std::vector<RankId> grp = {rank(s, 0), rank(s, 1)};
    g.add_collective({.group = grp, .bytes = Bytes::MiB(512), .stream = 1}, {.category = dpc});
  }
  return g;
}

void expect_same(const SimResult& a, const SimResult& b) {
  EXPECT_EQ(a.makespan, b.makespan);
  ASSERT_EQ(a.tasks.size(), b.tasks.size());
  for (size_t t = 0; t < a.tasks.size(); ++t) {
    EXPECT_EQ(a.tasks[t].start, b.tasks[t].start) << "task " << t;
    EXPECT_EQ(a.tasks[t].end, b.tasks[t].end) << "task " << t;
  }
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    EXPECT_EQ(a.ranks[r].comm, b.ranks[r].comm);
    EXPECT_EQ(a.ranks[r].exposed_comm, b.ranks[r].exposed_comm);
  }
}

TEST(DeterminismTest, SameInputsGiveIdenticalResultsAcrossRunsAndThreads) {
  const TaskGraph g = pipeline_graph();
  const Network net = cluster_network({.nodes = 2, .gpus_per_node = 4});
  SimOptions opt;
  opt.record_tasks = true;
  SimResult first = run(g, net, opt);
  EXPECT_GT(first.makespan, Time::ms(10));
  expect_same(first, run(g, net, opt));

  SimResult on_thread[2];
  std::thread t0([&] { on_thread[0] = *simulate(g, net, opt); });
  std::thread t1([&] { on_thread[1] = *simulate(g, net, opt); });
  t0.join();
  t1.join();
  expect_same(first, on_thread[0]);
  expect_same(first, on_thread[1]);
}

// Deferred transfers (SimOptions::defer_flows) time what the shared network times: random
// collectives and transfers on overlapping groups and streams, staggered by compute of
// random length, on two nodes; half of them overlap the transfers after them.
TEST(DeterminismTest, DeferredTransfersTimeWhatTheSharedNetworkTimes) {
  const Network net = cluster_network({.nodes = 2, .gpus_per_node = 4});
  std::mt19937 rng(7);
  const CollectiveKind kinds[] = {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                                  CollectiveKind::kReduceScatter, CollectiveKind::kAllToAll};
  int64_t deferred = 0, contended = 0;
  for (int trial = 0; trial < 12; ++trial) {
    TaskGraph g;
    std::vector<TaskId> last(8);
    for (int r = 0; r < 8; ++r)
      last[r] = g.add_compute(RankId(r), 0, Time::us(std::uniform_int_distribution(1, 300)(rng)),
                              Flops(1e9));
    for (int step = 0; step < 40; ++step) {
      std::vector<RankId> grp;
      for (int r = 0; r < 8; ++r)
        if (rng() % 2) grp.push_back(RankId(r));
      const int32_t stream = static_cast<int32_t>(rng() % 3);
      TaskId x;
      if (grp.size() < 2) {
        const int a = static_cast<int>(rng() % 8), b = (a + 1 + static_cast<int>(rng() % 7)) % 8;
        x = g.add_p2p(RankId(a), RankId(b), Bytes::MiB(std::uniform_int_distribution(1, 64)(rng)),
                      stream, stream);
        grp = {RankId(a), RankId(b)};
      } else {
        x = g.add_collective({.kind = kinds[rng() % 4],
                              .group = grp,
                              .bytes = Bytes::MiB(std::uniform_int_distribution(1, 256)(rng)),
                              .stream = stream});
      }
      for (RankId r : grp) {
        g.add_dependency(last[r.value()], x);
        last[r.value()] =
            g.add_compute(r, 0, Time::us(std::uniform_int_distribution(1, 900)(rng)), Flops(1e9));
        if (rng() % 2) g.add_dependency(x, last[r.value()]);  // else x runs on beside it
      }
    }
    SimOptions eager;
    eager.defer_flows = false;
    const SimResult want = run(g, net, eager);
    const SimResult got = run(g, net);
    SCOPED_TRACE(fmt::format("trial {}", trial));
    expect_same(want, got);
    EXPECT_EQ(want.flows_started, got.flows_started);
    EXPECT_EQ(want.deferred_transfers, 0);
    deferred += got.deferred_transfers;
    contended += got.contended_deferrals;
  }
  // Both paths ran: transfers timed alone throughout, and ones met midway and replayed.
  EXPECT_GT(contended, 0);
  EXPECT_GT(deferred, contended);
}

// A workspace carries only capacity: a smaller graph simulated after a larger one (its
// arrays hold the larger one's stale values) gives what a fresh engine gives, and a graph
// refilled after clear() is the graph built afresh.
TEST(DeterminismTest, AReusedWorkspaceAndAClearedGraphChangeNothing) {
  const Network net = cluster_network({.nodes = 2, .gpus_per_node = 4});
  SimOptions opt;
  opt.record_tasks = true;
  auto small = [](TaskGraph& g) {
    const LabelId fwd = g.label("fwd");
    TaskId a = g.add_compute(RankId(0), 0, Time::us(200), Flops(1e12), {.category = fwd});
    TaskId x = g.add_p2p(RankId(0), RankId(5), Bytes::MiB(8), 0, 0);
    TaskId b = g.add_compute(RankId(5), 0, Time::us(100), Flops(1e12), {.category = fwd});
    g.add_dependency(a, x);
    g.add_dependency(x, b);
    std::vector<RankId> grp = {RankId(0), RankId(5)};
    g.add_collective({.group = grp, .bytes = Bytes::MiB(4), .stream = 1});
  };
  TaskGraph fresh;
  small(fresh);
  const SimResult expected = *simulate(fresh, net, opt);

  SimWorkspace ws;
  TaskGraph g = pipeline_graph();
  SimResult big = *simulate(g, net, opt, nullptr, &ws);
  EXPECT_EQ(big.tasks.size(), static_cast<size_t>(g.num_tasks()));
  ws.recycle(std::move(big));
  g.clear();
  EXPECT_EQ(g.num_tasks(), 0);
  EXPECT_EQ(g.num_labels(), 0);
  EXPECT_EQ(g.num_groups(), 0);
  small(g);
  ASSERT_EQ(g.num_tasks(), fresh.num_tasks());
  EXPECT_EQ(g.label_text(LabelId(0)), "fwd");
  EXPECT_TRUE(g.validate(net.num_ranks()).is_ok());
  const SimResult reused = *simulate(g, net, opt, nullptr, &ws);
  expect_same(expected, reused);
  EXPECT_EQ(expected.categories.size(), reused.categories.size());
  // And the large graph again, after the small one.
  expect_same(*simulate(pipeline_graph(), net, opt),
              *simulate(pipeline_graph(), net, opt, nullptr, &ws));
}

}  // namespace
}  // namespace hetpar::sim
