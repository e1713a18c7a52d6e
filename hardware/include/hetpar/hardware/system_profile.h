// SystemProfile: one node type — its GPU (DeviceProfile), intra-node fabric, NICs,
// optional WAN link, and per-(scope, collective) latency and achievable bus bandwidth —
// plus a provenance map naming the source of every default number. Built-in profiles
// are profiles/*.json compiled into the binary; user files use the same schema:
//
//   {
//     "name": "dgx-h100", "description": "...", "gpus_per_node": 8,
//     "shared_compute_units": 2,            // optional (0): cores the ranks share (cpu)
//     "host": {"op_us": 13.5},              // optional (0: no host modelled): CPU time
//                                           // the trainer spends issuing one kernel or
//                                           // communication call (sim: TaskGraph "Host")
//     "gpu": {"model": "H100-SXM5-80GB", "sm_count": 132, "l2_MiB": 50, "memory_GiB": 80,
//             "memory_GBps": 3350,          // HBM datasheet peak
//             "memory_efficiency": 0.90,    // achievable fraction for streaming kernels
//             "host_link_GBps": 55.4,       // PCIe per direction, achievable
//             "collective_overlap_slowdown": 0.189,  // optional (0): compute under a
//                                           // collective takes (1 + this) x as long
//             "clock_spread": 0.0047,       // optional (0): relative std of the sustained
//                                           // clock across GPUs; a job of N runs its
//                                           // tensor-core work at its slowest's rate
//             "compute": {"bf16": {"peak_tflops": 989.4, "eta_max": 0.803}, ...},
//                                           // dense peaks; keys fp32|tf32|bf16|fp16|fp8;
//                                           // bf16 required, absent = unsupported
//             "gemm": {"tiles": [[256, 128, 1.0], ...],   // [Tm, Tn, relative efficiency]
//                      "launch_us": 4, "split_k": true,
//                      "measured": {"bf16": [[m, n, k, tflops], ...]},  // optional,
//                                            // from `hetpar calibrate` (device_profile.h)
//                      "measured_accumulate": {"fp8": [[m, n, k, tflops], ...]},
//                                            // optional: GEMMs adding into fp32 (wgrad)
//                      "accumulate_exposed": 0.45,  // optional (0): the fraction of such
//                                            // a GEMM's fp32 output traffic not hidden
//                      "k_scale": {"bf16": [[K, factor], ...]}},  // optional: sustained
//                                            // rate against K, a factor on eta_max
//             "attention": {"fwd_efficiency": 0.6, "bwd_efficiency": 0.45,
//                                           // FlashAttention benchmark rates (bwd counted
//                                           // as 2.5x forward FLOPs, device_profile.h)
//                           "fwd_seq_scale": [[seq, factor], ...],  // optional, and
//                           "bwd_seq_scale": [[seq, factor], ...],  // the rates against
//                                           // the key/value length per call
//                           "sustain": 0.88,  // optional (1): the fraction of these
//                                           // burst rates a step sustains at the power limit
//                           "head_dim_scale": [[64, 0.694], [128, 1]],  // optional:
//                                           // the rates against the head dim
//                           "fwd_element_ps": 2.0, "bwd_element_ps": 3.0}},  // optional
//                                           // (0): time per score element (the softmax)
//     "intra_node": {"fabric": "nvswitch|pcie|none",
//                    "GBps": 450,            // per GPU, one direction
//                    "latency_us": 0.6,      // GPU to GPU through the fabric
//                    "nvls": true, "nvls_min_group": 5,  // in-switch reduction
//                    "registered_collective_sms": {"all_gather": 4, "reduce_scatter": 5}},
//                                            // optional (0): SMs a collective from
//                                            // registered buffers holds (nccl_ub)
//     "inter_node": {"nics_per_node": 8, "nic_gbps": 400,  // per NIC, one direction
//                    "latency_us": 2.7,      // GPU to GPU across the network
//                    "collective_sms": 16,   // optional (0): SMs an NCCL collective
//                                            // across nodes holds while it runs
//                    "registered_collective_sms": {"all_gather": 1, "reduce_scatter": 4}},
//                                            // optional (0): the same from registered
//                                            // buffers, one member per node
//     "wan": {"up_gbps": 0.02, "down_gbps": 0.1, "latency_ms": 50},  // optional
//     "collectives": [{"scope": "intra_node|inter_node",
//                      "op": "all_reduce|all_gather|reduce_scatter|all_to_all|broadcast|send_recv",
//                      "alpha_us": 15,       // latency of a tiny call
//                      "busbw_GBps": [[4, 363.3], [8, 473.1]],
//                                            // [group size, nccl-tests busbw]; group size
//                                            // counts GPUs (intra_node) or nodes (inter_node);
//                                            // inter_node all_gather / reduce_scatter below
//                                            // all_reduce's slow the rings spanning that many
//                                            // nodes (planner/network_builder.h)
//                      "size_scale": [[67108864, 0.82], ...]}, ...],  // optional: the
//                                            // share of busbw a message of that many bytes
//                                            // reaches after alpha (NCCL's ramp)
//     "provenance": {"gpu.memory_GBps": "source ...", "collectives.inter_node": "..."}
//   }
//
// Every scope/op pair must appear once (intra_node ones only when gpus_per_node > 1).
// Units: GB/s = 1e9 B/s, gb/s = 1e9 bit/s, one direction; memory in GiB; latencies are
// one-way. A provenance key covers its own field and every field below it.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hetpar/core/status.h"
#include "hetpar/core/units.h"
#include "hetpar/hardware/device_profile.h"

namespace hetpar::hardware {

enum class FabricKind { kNvSwitch, kPcie, kNone };
enum class CollectiveScope { kIntraNode, kInterNode };
enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kSendRecv };

inline constexpr std::array<CollectiveScope, 2> kAllScopes = {CollectiveScope::kIntraNode,
                                                              CollectiveScope::kInterNode};
inline constexpr std::array<Collective, 6> kAllCollectives = {
    Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
    Collective::kAllToAll,  Collective::kBroadcast, Collective::kSendRecv};

std::string_view to_string(FabricKind k);
std::string_view to_string(CollectiveScope s);
std::string_view to_string(Collective c);
std::optional<FabricKind> parse_fabric_kind(std::string_view name);
std::optional<CollectiveScope> parse_collective_scope(std::string_view name);
std::optional<Collective> parse_collective(std::string_view name);

/// SMs an NCCL collective from registered buffers holds on each member GPU while it runs
/// (Megatron's nccl_ub: user buffers, which NCCL moves with SM-efficient kernels), by
/// kind; 0 = not modelled: it holds what an unregistered one does.
struct RegisteredCollectiveSms {
  int all_gather = 0;      // and broadcast
  int reduce_scatter = 0;  // and all-reduce, reduce
  bool operator==(const RegisteredCollectiveSms&) const = default;
};

struct IntraNodeFabric {
  FabricKind kind = FabricKind::kNone;
  Bandwidth bandwidth;  // per GPU, one direction
  Time latency;         // GPU to GPU
  bool nvls = false;    // in-switch reduction (NVLink SHARP)
  int nvls_min_group = 0;
  RegisteredCollectiveSms registered_collective_sms;  // a group inside the node
  bool operator==(const IntraNodeFabric&) const = default;
};

struct InterNodeNetwork {
  int nics_per_node = 0;
  Bandwidth nic_bandwidth;  // per NIC, one direction
  Time latency;             // GPU to GPU across the network
  /// SMs one NCCL collective whose group spans nodes occupies on each member GPU for its
  /// whole duration (one CTA per channel, never sharing its SM with a compute kernel);
  /// 0 = not modelled. SystemProfile::cross_node_collective_slowdown() turns it into the
  /// compute slowdown beside such a collective.
  int collective_sms = 0;
  /// A registered collective's SMs when its group has one member per node (a rail; NCCL's
  /// "IB" domain). One with several members on a node holds collective_sms.
  RegisteredCollectiveSms registered_collective_sms;
  bool operator==(const InterNodeNetwork&) const = default;
};

/// A node's internet link: separate upload and download rates.
struct WanLink {
  Bandwidth up;
  Bandwidth down;
  Time latency;  // one-way node to node
  bool operator==(const WanLink&) const = default;
};

/// Measured behaviour of one collective in one scope (nccl-tests conventions).
struct CollectiveFigure {
  CollectiveScope scope = CollectiveScope::kIntraNode;
  Collective op = Collective::kAllReduce;
  Time alpha;  // latency of a tiny call
  /// (group size, bus bandwidth), sorted by group size, at least one entry.
  std::vector<std::pair<int, Bandwidth>> busbw;
  /// How much of `busbw` a message of `at` bytes (nccl-tests size) reaches once `alpha` is
  /// paid: NCCL's protocols and pipelining ramp up over mid-size messages. Empty = all of it.
  std::vector<CurvePoint> size_scale;
  /// The intra-node all_reduce of a profile with NVLS only: the figure of the ring NCCL
  /// runs with NVLS disabled (NCCL_NVLS_ENABLE=0), which a cluster's `nvls: false` puts in
  /// place of `busbw` and `size_scale` (cluster.h). Empty: not measured.
  std::vector<std::pair<int, Bandwidth>> busbw_without_nvls;
  std::vector<CurvePoint> size_scale_without_nvls;
  bool operator==(const CollectiveFigure&) const = default;

  /// Bus bandwidth of the largest listed group size <= `group_size` (the smallest listed
  /// one when `group_size` is below all of them).
  Bandwidth bus_bandwidth(int group_size) const;
};

struct SystemProfile {
  std::string name;
  std::string description;
  DeviceProfile gpu;
  int gpus_per_node = 0;
  /// Compute units the node's ranks share (a CPU host's cores, when its ranks outnumber
  /// them); 0 = every rank has a device of its own (GPUs). While more ranks of a node
  /// compute than it has units, each computes at units / computing ranks of its speed.
  int shared_compute_units = 0;
  /// Host (CPU) time the trainer's program spends issuing one GPU kernel or one
  /// communication call, from Python through the framework's dispatch to the launch
  /// (PyTorch eager); zero = the host is not modelled. It overlaps the GPU's work except
  /// where the program waits for the GPU (sim/task_graph.h, "Host").
  Time host_op;
  IntraNodeFabric intra_node;
  InterNodeNetwork inter_node;
  std::optional<WanLink> wan;
  /// Sorted by (scope, op); each pair at most once.
  std::vector<CollectiveFigure> collectives;
  /// JSON field path ("gpu.compute.bf16.eta_max") -> where the number comes from.
  std::map<std::string, std::string> provenance;

  bool operator==(const SystemProfile&) const = default;

  /// How much longer compute takes beside an NCCL collective across nodes: the GPU's SMs
  /// over those the collective leaves it, minus one (sm / (sm - collective_sms) - 1); 0
  /// when inter_node.collective_sms is 0. Compute-bound kernels lose that share of the
  /// GPU; memory-bound ones, which saturate HBM with fewer SMs, lose less.
  double cross_node_collective_slowdown() const;
  /// The same beside a collective from registered buffers (RegisteredCollectiveSms): inside
  /// a node or over one member per node, an all-gather (`gather`) or a reduction; where the
  /// profile gives no figure, what an unregistered one costs (collective_overlap_slowdown,
  /// cross_node_collective_slowdown()).
  double registered_collective_slowdown(bool in_node, bool gather) const;

  bool has_collective(CollectiveScope scope, Collective op) const;
  /// REQUIRES: has_collective(scope, op) (always true for a validated profile, except
  /// intra_node figures of a one-GPU node).
  const CollectiveFigure& collective(CollectiveScope scope, Collective op) const;
};

/// The longest latency a profile may give one call: a kernel launch, a collective's alpha,
/// a fabric hop, the host's issue. Far above any real one; it keeps an iteration's sum of
/// them well inside integer-picosecond Time.
inline constexpr Time kMaxCallLatency = Time::seconds(1);
/// The largest size or rate a profile may give, in its field's unit (GiB, MiB, GB/s, Gb/s,
/// TFLOP/s): a billion, far above any hardware (an HBM of 8e3 GB/s, a GPU of 1e4 TFLOP/s)
/// and low enough that the bytes and rates derived from it stay finite and inside int64.
inline constexpr double kMaxProfileQuantity = 1e9;
/// The longest one-way latency of a node's internet link (WanLink::latency).
inline constexpr Time kMaxWanLatency = Time::seconds(10);

/// Checks the invariants the parser enforces (rates and sizes in (0, kMaxProfileQuantity],
/// fractions in (0, 1],
/// latencies in [0, kMaxCallLatency], every collective figure present, consistent fabric);
/// errors name the JSON field.
Status validate_profile(const SystemProfile& p);
/// JSON field paths of the numbers in `p` that no provenance entry covers.
std::vector<std::string> missing_provenance(const SystemProfile& p);

/// Names of the built-in profiles, sorted.
std::vector<std::string> builtin_profile_names();
/// A built-in profile by name, else a profile JSON file at that path (relative paths
/// resolve against `base_dir` when it is not empty).
Result<SystemProfile> load_profile(std::string_view name_or_path, std::string_view base_dir = "");
/// Parses profile JSON text; errors are prefixed by `source`.
Result<SystemProfile> parse_profile_text(std::string_view text, std::string_view source);
/// The profile as pretty-printed JSON in the schema above (parses back to an equal profile).
std::string profile_to_json_text(const SystemProfile& p);

}  // namespace hetpar::hardware
