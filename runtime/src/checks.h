// Argument checks shared by the backends, so that every backend rejects the same calls
// with the same messages (a buffer too small, a shape that does not divide, a group this
// rank is not in). Internal to runtime/.
#pragma once

#include <span>
#include <string_view>

#include "hetpar/runtime/backend.h"

namespace hetpar::runtime {

/// `b` holds at least `elements` values of `t`; the message names `what`.
Status check_buffer(std::string_view what, const Buffer& b, int64_t elements, DType t);
Status check_gemm(const GemmDesc& d, const Buffer& a, const Buffer& b, const Buffer& c);
/// The attention buffers' sizes and dtypes; `sinks` / `d_sinks` present exactly when d.sinks.
Status check_attention(const AttentionDesc& d, const Buffer& q, const Buffer& k, const Buffer& v,
                       const Buffer* sinks, const Buffer& out, const Buffer& stats);
Status check_attention_backward(const AttentionDesc& d, const Buffer& q, const Buffer& k,
                                const Buffer& v, const Buffer* sinks, const Buffer& out,
                                const Buffer& d_out, const Buffer& stats, const Buffer& d_q,
                                const Buffer& d_k, const Buffer& d_v, const Buffer* d_sinks);
Status check_elementwise(const ElementwiseDesc& d, std::span<const Buffer* const> inputs,
                         const Buffer& out);
/// `ranks` are distinct world ranks of a world of `world` processes.
Status check_group_ranks(std::span<const int> ranks, int world);
/// The Group of world ranks `ranks` (checked as above) with id `id`, seen from world rank
/// `me` (rank -1 when not a member).
Result<Group> new_group(std::span<const int> ranks, int world, int64_t id, int me);
/// `root` is a position in `g`.
Status check_root(std::string_view op, const Group& g, int root);
/// `peer` is another world rank than `me`, and `count` fits `max_count`.
Status check_peer(std::string_view op, int peer, int world, int me, int64_t count,
                  int64_t max_count);
/// This rank is a member of `g`, and `g` was made by this backend (`groups` made so far).
Status check_member(std::string_view op, const Group& g, int64_t groups);
Status check_count(std::string_view op, int64_t count);
enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll };
/// The buffers of collective `c` on `g` (this rank a member) hold what `count` needs, and
/// overlap only in the op's in-place form (NCCL's: all_reduce send == recv; all_gather send
/// = this rank's slot of recv; reduce_scatter recv = this rank's slot of send; all_to_all
/// never). Returns whether the call is in place.
Result<bool> check_collective(std::string_view op, Collective c, const Group& g, const Buffer& send,
                              const Buffer& recv, int64_t count, DType t);
Status check_stream(Stream s);

/// The elements an attention tensor has: q/out [b, sq, h, d], k/v [b, skv, kvh, d], stats
/// [b, h, sq].
int64_t attention_q_elements(const AttentionDesc& d);
int64_t attention_kv_elements(const AttentionDesc& d);
int64_t attention_stats_elements(const AttentionDesc& d);

}  // namespace hetpar::runtime
