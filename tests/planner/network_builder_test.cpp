#include "hetpar/planner/network_builder.h"

#include <gtest/gtest.h>

#include "hetpar/planner/scenario.h"
#include "hetpar/sim/simulate.h"

namespace hetpar::planner {
namespace {

hardware::ClusterSpec cluster(std::string_view json) {
  auto c = hardware::parse_cluster_text(json, "cluster");
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return *c;
}

// Simulated nccl-tests busbw of one collective over `ranks` (latency removed).
double busbw_GBps(const hardware::ClusterSpec& c, sim::CollectiveKind kind,
                  std::vector<RankId> ranks) {
  sim::Network net = build_network(c);
  sim::TaskGraph g;
  const Bytes size = Bytes::GiB(1);
  g.add_collective({kind, ranks, size, 0, sim::Algorithm::kRing});
  sim::SimOptions o;
  o.collectives = collective_config(c);
  auto r = sim::simulate(g, net, o);
  EXPECT_TRUE(r.is_ok());
  const sim::CollectivePattern p =
      sim::collective_pattern(kind, sim::Algorithm::kRing, ranks, ranks[0], net, o.collectives);
  const double seconds = (r->makespan - p.latency).to_seconds();
  return size.as_double() / seconds *
         sim::bus_bandwidth_factor(kind, static_cast<int>(ranks.size())) * 1e-9;
}

std::vector<RankId> range(int from, int to, int step = 1) {
  std::vector<RankId> out;
  for (int r = from; r < to; r += step) out.push_back(RankId(r));
  return out;
}

TEST(NetworkBuilder, RingCollectivesReachTheProfilesBusBandwidth) {
  auto c = cluster(R"({"profile": "dgx-h100", "nodes": 4})");
  const auto& prof = c.profile_of_node(NodeId(0));
  const double intra =
      prof.collective(hardware::CollectiveScope::kIntraNode, hardware::Collective::kAllGather)
          .bus_bandwidth(8)
          .to_GBps();
  // At 1 GiB NCCL's ramp (the collectives' size_scale) is nearly done: intra-node rings
  // reach that factor of the profile's bus bandwidth.
  auto ramp = [&](hardware::Collective op) {
    return curve_factor(prof.collective(hardware::CollectiveScope::kIntraNode, op).size_scale,
                        Bytes::GiB(1).count());
  };
  const double ag = intra * ramp(hardware::Collective::kAllGather);
  // An all_reduce at its own figure's busbw: NVLS's at 8 GPUs (473.1 GB/s, not 361.4).
  const double ar =
      prof.collective(hardware::CollectiveScope::kIntraNode, hardware::Collective::kAllReduce)
          .bus_bandwidth(8)
          .to_GBps() *
      ramp(hardware::Collective::kAllReduce);
  EXPECT_GT(ag, 0.95 * intra);
  EXPECT_NEAR(busbw_GBps(c, sim::CollectiveKind::kAllGather, range(0, 8)), ag, 0.01 * ag);
  EXPECT_NEAR(busbw_GBps(c, sim::CollectiveKind::kAllReduce, range(0, 8)), ar, 0.01 * ar);
  const double inter =
      prof.collective(hardware::CollectiveScope::kInterNode, hardware::Collective::kAllReduce)
          .bus_bandwidth(4)
          .to_GBps();
  EXPECT_NEAR(busbw_GBps(c, sim::CollectiveKind::kAllReduce, range(0, 32)), inter, 0.01 * inter);
}

// Inside a node an all_reduce runs at its profile figure's busbw for its group size: NVLS
// from nvls_min_group GPUs up (the H100's 5, the B200's 6), the ring below it, and the ring
// at every size where the cluster switches NVLS off. The links themselves carry all_gather's.
TEST(NetworkBuilder, IntraNodeAllReducesRunAtTheirGroupSizesFigure) {
  struct Case {
    const char* cluster;
    int ranks;
    double busbw;  // the profile's, GB/s
  };
  const Case cases[] = {
      {R"({"profile": "dgx-h100", "nodes": 1})", 8, 473.1},
      {R"({"profile": "dgx-h100", "nodes": 1})", 6, 435.6},
      {R"({"profile": "dgx-h100", "nodes": 1})", 4, 363.3},
      {R"({"profile": "dgx-h100", "nodes": 1})", 2, 363.3},  // below the listed sizes
      {R"({"profile": "dgx-h100", "nodes": 1, "nvls": false})", 8, 368.3},
      {R"({"profile": "dgx-h100", "nodes": 1, "nvls": false})", 6, 363.3},
      {R"({"profile": "dgx-b200", "nodes": 1})", 8, 842.0},
      {R"({"profile": "dgx-b200", "nodes": 1})", 4, 682.0},  // a step, not interpolated
      {R"({"profile": "dgx-a100-80gb", "nodes": 1})", 8, 234.6},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.cluster) + " x" + std::to_string(k.ranks));
    auto c = cluster(k.cluster);
    const auto& ar = c.profile_of_node(NodeId(0)).collective(hardware::CollectiveScope::kIntraNode,
                                                             hardware::Collective::kAllReduce);
    const double want = k.busbw * curve_factor(ar.size_scale, Bytes::GiB(1).count());
    EXPECT_NEAR(busbw_GBps(c, sim::CollectiveKind::kAllReduce, range(0, k.ranks)), want,
                0.01 * want);
  }
}

// A mid-size all_gather inside a DGX H100 takes what nccl-tests measures, not the large
// message's rate: 64 MiB over 8 GPUs ran in 210.89 us (together-nccl-tests, the profile's
// size_scale source), against 173 us at the 8 GiB rate.
TEST(NetworkBuilder, MidSizeCollectivesTakeTheMeasuredTime) {
  auto c = cluster(R"({"profile": "dgx-h100", "nodes": 1})");
  sim::Network net = build_network(c);
  sim::TaskGraph g;
  g.add_collective(
      {sim::CollectiveKind::kAllGather, range(0, 8), Bytes::MiB(64), 0, sim::Algorithm::kRing});
  sim::SimOptions o;
  o.collectives = collective_config(c);
  auto r = sim::simulate(g, net, o);
  ASSERT_TRUE(r.is_ok());
  EXPECT_NEAR(r->makespan.to_us(), 210.89, 0.02 * 210.89);
  o.collectives.curves[0].intra_node_size_scale = {};
  EXPECT_NEAR(sim::simulate(g, net, o)->makespan.to_us(), 173.3, 2.0);
}

// Inside a DGX A100 the all_gather and reduce_scatter ramps are measured ones (SuperBench's
// nccl-tests capture on 8 A100 SXM4): 16 MiB in 167.7 / 152.4 us, 64 MiB in 379.7 / 356.1
// us. The all_reduce's ramp at the same size, which the profile had taken for them, runs a
// 64 MiB all_gather in ~300 us: an all_gather of S ramps like an all_reduce of S / 2.
TEST(NetworkBuilder, A100AllGatherAndReduceScatterTakeTheMeasuredTime) {
  auto c = cluster(R"({"profile": "dgx-a100-80gb", "nodes": 1})");
  sim::Network net = build_network(c);
  sim::SimOptions o;
  o.collectives = collective_config(c);
  auto time_us = [&](sim::CollectiveKind kind, Bytes size) {
    sim::TaskGraph g;
    g.add_collective({kind, range(0, 8), size, 0, sim::Algorithm::kRing});
    auto r = sim::simulate(g, net, o);
    EXPECT_TRUE(r.is_ok());
    return r->makespan.to_us();
  };
  EXPECT_NEAR(time_us(sim::CollectiveKind::kAllGather, Bytes::MiB(16)), 167.7, 0.02 * 167.7);
  EXPECT_NEAR(time_us(sim::CollectiveKind::kAllGather, Bytes::MiB(64)), 379.7, 0.02 * 379.7);
  EXPECT_NEAR(time_us(sim::CollectiveKind::kReduceScatter, Bytes::MiB(16)), 152.4, 0.02 * 152.4);
  EXPECT_NEAR(time_us(sim::CollectiveKind::kReduceScatter, Bytes::MiB(64)), 356.1, 0.02 * 356.1);
}

// A cluster of two kinds of node: each node's collectives follow its own profile's ramps
// (collective_config's curves, one per node group), so an all_gather inside the A100 node
// takes the pure A100 cluster's time and one inside the H100 node the pure H100's; the
// H100's rings slow down across many nodes, the A100's do not.
TEST(NetworkBuilder, EachNodeGroupKeepsItsOwnRamps) {
  auto mixed = cluster(R"({"node_groups": [{"profile": "dgx-h100", "nodes": 1},
                                           {"profile": "dgx-a100-80gb", "nodes": 1}]})");
  const sim::CollectiveConfig cfg = collective_config(mixed);
  ASSERT_EQ(cfg.curves.size(), 2u);
  EXPECT_EQ(cfg.node_curves, (std::vector<int32_t>{0, 1}));
  const auto rs = static_cast<size_t>(sim::CollectiveKind::kReduceScatter);
  EXPECT_FALSE(cfg.curves_of(NodeId(0)).inter_node_node_scale[rs].empty());
  EXPECT_TRUE(cfg.curves_of(NodeId(1)).inter_node_node_scale[rs].empty());
  auto time_us = [](const hardware::ClusterSpec& c, int first, Bytes size) {
    sim::SimOptions o;
    o.collectives = collective_config(c);
    sim::TaskGraph g;
    g.add_collective(
        {sim::CollectiveKind::kAllGather, range(first, first + 8), size, 0, sim::Algorithm::kRing});
    auto r = sim::simulate(g, build_network(c), o);
    EXPECT_TRUE(r.is_ok());
    return r->makespan.to_us();
  };
  auto a100 = cluster(R"({"profile": "dgx-a100-80gb", "nodes": 1})");
  auto h100 = cluster(R"({"profile": "dgx-h100", "nodes": 1})");
  EXPECT_DOUBLE_EQ(time_us(mixed, 8, Bytes::MiB(16)), time_us(a100, 0, Bytes::MiB(16)));
  EXPECT_DOUBLE_EQ(time_us(mixed, 0, Bytes::MiB(16)), time_us(h100, 0, Bytes::MiB(16)));
  EXPECT_NE(time_us(a100, 0, Bytes::MiB(16)), time_us(h100, 0, Bytes::MiB(16)));
  // Each kind keeps its own hop latencies too: a tree all-reduce over the two A100 nodes of
  // two A100 + two H100 nodes pays the A100's (its all-reduce floor across nodes is 44 us,
  // the H100's 46 us), as on two A100 nodes alone; one spanning both kinds the larger.
  auto tree_us = [](const hardware::ClusterSpec& c, int first, int count) {
    sim::SimOptions o;
    o.collectives = collective_config(c);
    sim::TaskGraph g;
    g.add_collective({sim::CollectiveKind::kAllReduce, range(first, first + count), Bytes::KiB(64),
                      0, sim::Algorithm::kTree});
    auto r = sim::simulate(g, build_network(c), o);
    EXPECT_TRUE(r.is_ok());
    return r->makespan.to_us();
  };
  auto four = cluster(R"({"node_groups": [{"profile": "dgx-a100-80gb", "nodes": 2},
                                          {"profile": "dgx-h100", "nodes": 2}]})");
  const sim::CollectiveConfig four_cfg = collective_config(four);
  EXPECT_LT(*four_cfg.curves[0].tree_inter_hop, *four_cfg.curves[1].tree_inter_hop);
  EXPECT_EQ(four_cfg.tree_inter_hop, *four_cfg.curves[1].tree_inter_hop);  // the slowest's
  auto a100x2 = cluster(R"({"profile": "dgx-a100-80gb", "nodes": 2})");
  EXPECT_DOUBLE_EQ(tree_us(four, 0, 16), tree_us(a100x2, 0, 16));
  EXPECT_GT(tree_us(four, 8, 16), tree_us(a100x2, 0, 16));
}

TEST(NetworkBuilder, PointToPointPaysTheSendRecvAlpha) {
  auto c = cluster(R"({"profile": "dgx-a100-80gb", "nodes": 2})");
  sim::Network net = build_network(c);
  std::vector<LinkId> route;
  net.route(RankId(1), RankId(2), route);
  EXPECT_EQ(route.size(), 2u);
  EXPECT_EQ(net.latency(route), Time::us(7.2));
  net.route(RankId(1), RankId(10), route);
  EXPECT_EQ(net.latency(route), Time::us(9.3));
  EXPECT_EQ(net.link(route[0]).name, "node 0 nic 1 up");
  EXPECT_EQ(net.link(route[1]).name, "node 1 nic 2 down");
  EXPECT_NEAR(net.link(route[0]).capacity.to_GBps(), 192.0 / 8, 1e-9);
}

TEST(NetworkBuilder, WanLinksSitBetweenNicsAndTheCore) {
  auto c = cluster(R"({"profile": "dgx-h100", "nodes": 2, "nics_per_node": 1,
                       "wan": {"up_gbps": 1, "down_gbps": 2, "latency_ms": 20}})");
  sim::Network net = build_network(c);
  std::vector<LinkId> route;
  net.route(RankId(3), RankId(12), route);
  ASSERT_EQ(route.size(), 4u);
  EXPECT_EQ(net.link(route[1]).name, "node 0 wan up");
  EXPECT_EQ(net.link(route[2]).name, "node 1 wan down");
  EXPECT_NEAR(net.link(route[1]).capacity.to_GBps(), 0.125, 1e-12);
  EXPECT_GE(net.latency(route), Time::ms(20));
}

// The rings' node scale: the profile's inter-node all_gather / reduce_scatter busbw over
// all_reduce's at each node count of the figure (the H100's falls to 260 of 350 GB/s at 128
// nodes); a profile whose figures never fall below all_reduce's gives none.
TEST(NetworkBuilder, RingsSlowDownAsTheySpanMoreNodes) {
  auto h100 = cluster(R"({"profile": "dgx-h100", "nodes": 4})");
  const sim::CollectiveConfig cfg = collective_config(h100);
  for (sim::CollectiveKind k :
       {sim::CollectiveKind::kAllGather, sim::CollectiveKind::kReduceScatter}) {
    const auto& curve = cfg.curves[0].inter_node_node_scale[static_cast<size_t>(k)];
    EXPECT_DOUBLE_EQ(curve_factor(curve, 2), 1.0);
    EXPECT_NEAR(curve_factor(curve, 128), 260.0 / 350.0, 1e-12);
    EXPECT_NEAR(curve_factor(curve, 1024), 260.0 / 350.0, 1e-12);  // clamped
    EXPECT_LT(curve_factor(curve, 16), curve_factor(curve, 8));
  }
  EXPECT_TRUE(cfg.curves[0]
                  .inter_node_node_scale[static_cast<size_t>(sim::CollectiveKind::kAllReduce)]
                  .empty());
  EXPECT_TRUE(cfg.curves[0]
                  .inter_node_node_scale[static_cast<size_t>(sim::CollectiveKind::kAllToAll)]
                  .empty());
  auto a100 = cluster(R"({"profile": "dgx-a100-80gb", "nodes": 4})");
  for (const auto& curve : collective_config(a100).curves[0].inter_node_node_scale)
    EXPECT_TRUE(curve.empty());
}

TEST(NetworkBuilder, CollectiveLatenciesFitTheProfileAlphas) {
  auto c = cluster(R"({"profile": "dgx-a100-80gb", "nodes": 2})");
  sim::CollectiveConfig cfg = collective_config(c);
  EXPECT_EQ(cfg.intra_hop, Time::us(0.6));  // (10.8 - 6.6) / 7
  sim::Network net = build_network(c);
  auto ag = sim::collective_pattern(sim::CollectiveKind::kAllGather, sim::Algorithm::kRing,
                                    range(0, 16), RankId(0), net, cfg);
  EXPECT_EQ(ag.latency, Time::us(25));  // the inter-node all_gather alpha
}

}  // namespace
}  // namespace hetpar::planner
