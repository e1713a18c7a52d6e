// DeepEP's fixed terms, for plans with Layout::moe_dispatcher deepep: the EP group sizes its
// normal (high-throughput) kernels take, and the communication buffers a rank allocates
// for them. Read from DeepEP's source (deepseek-ai/DeepEP, deep_ep/buffer.py at dcfd954's
// get_dispatch_config / get_combine_config, csrc/config.hpp's buffer size hints,
// csrc/kernels/configs.cuh) and Megatron-Core's fused_a2a.get_buffer, which sizes the one
// Buffer a rank keeps from those hints with hidden_bytes = hidden x max(element size, 2).
// This is DeepEP V1's (NVSHMEM) Buffer, the one Megatron-Core's flex dispatcher runs with
// --moe-flex-dispatcher-backend deepep; DeepEP V2's ElasticBuffer (backend deepepv2) sizes
// its buffers and SMs otherwise and is not modelled. HybridEP (backend hybridep) takes the
// same routes, so the shares below are its too; its buffers are its own
// (hybridep_buffer_bytes).
#pragma once

#include <cstdint>

#include "hetpar/core/units.h"
#include "hetpar/models/spec.h"

namespace hetpar::planner {

/// GPUs DeepEP's kernels reach over NVLink from one GPU (NUM_MAX_NVL_PEERS): a group of
/// more ranks spans nodes of exactly this many GPUs each, paired by local index.
inline constexpr int kDeepEpNvlPeers = 8;

/// SMs its normal kernels run on (Megatron-Core's moe_deepep_num_sms default, DeepEP's
/// Buffer.num_sms): 10 channels of 2.
inline constexpr int kDeepEpSms = 20;

/// Whether DeepEP has a dispatch and combine configuration for an EP group of `ranks`
/// (any other size fails its assertion "Unsupported number of EP ranks").
bool deepep_supports(int ranks);

/// The bytes DeepEP sends across nodes per byte of the plain all-to-all's buffer, for an
/// EP group spanning `nodes` > 1 nodes, each holding its contiguous experts/nodes of the
/// model's experts (Megatron-Core numbers experts by EP rank): a token goes once to each node
/// holding one of its top_k experts, where the buffer holds top_k copies, so the share is the
/// nodes a token reaches over top_k. Its experts are drawn evenly from the experts, or, with
/// grouped routing (MoeSpec::groups: DeepSeek-V3's node-limited routing), from the experts of
/// group_topk groups drawn evenly from the contiguous groups: a node misses a token unless a
/// chosen group overlaps it and one of the token's experts falls in the overlap. 0 for one
/// node. REQUIRES experts % nodes == 0.
double deepep_rail_share(const models::MoeSpec& moe, int64_t nodes);

/// The bytes DeepEP moves over NVLink per byte of the plain all-to-all's buffer, for an EP
/// group of `ep` ranks: its kernels send a token once to each rank holding one of its
/// experts (get_dispatch_layout's is_token_in_rank), and the combine returns one sum per
/// token and rank, where the all-to-all dispatcher moves a copy per expert; the ranks a token
/// reaches over top_k, deepep_rail_share() with ranks for nodes (1 for one rank).
/// REQUIRES experts % ep == 0.
double deepep_nvlink_share(const models::MoeSpec& moe, int64_t ep);

/// Device memory one rank of an EP group of `ranks` holds for DeepEP: the NVLink buffer
/// (cudaMalloc, mapped by its node's peers), the RDMA buffer (NVSHMEM's symmetric heap,
/// groups over nodes only), each the larger of the dispatch and combine configurations'
/// hints, and the 32 MiB workspace. REQUIRES deepep_supports(ranks), hidden >= 1.
Bytes deepep_buffer_bytes(int ranks, int64_t hidden);

/// Device memory one rank holds for HybridEP: the one HybridEPBuffer of its process, which
/// Megatron-Core's flex dispatcher (backend hybridep, fused_a2a.init_hybrid_ep_buffer)
/// creates at the first dispatch for that call's `tokens` per rank (a micro-batch's tokens
/// over TP with SP and over CP; the buffer takes at least 512) and keeps for every MoE layer,
/// BF16 dispatch (Megatron-Core asserts it). Read from DeepEP's hybrid-ep sources
/// (deepseek-ai/DeepEP 2540b8ab: buffer/intranode.cu's NVLink buffers, which the dispatch
/// shares with the combine by default, for M = tokens x ranks_per_node x nodes tokens:
/// M x hidden BF16 tokens, M x local_experts x ranks_per_node fp32 probabilities, M x
/// ceil(hidden / 128) fp32 scales; extension/allgather.cu's routing map, one byte per token
/// of the group and expert of the group; buffer/internode.cu's RDMA staging, for groups over
/// `nodes` > 1). Not counted: flags, queue pairs, a few KiB of scratch.
/// REQUIRES tokens, hidden, local_experts, ranks_per_node, nodes >= 1.
Bytes hybridep_buffer_bytes(int64_t tokens, int64_t hidden, int64_t local_experts,
                            int64_t ranks_per_node, int64_t nodes);

}  // namespace hetpar::planner
