#include "cpu_backend.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <Eigen/Core>
#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "../checks.h"
#include "../mpi_env.h"
#include "cpu_kernels.h"
#include "hetpar/runtime/host_data.h"

namespace hetpar::runtime {
namespace {

using ColMat = Eigen::MatrixXf;
using ConstMat = Eigen::Map<const ColMat>;
using MutMat = Eigen::Map<ColMat>;

constexpr size_t kAlign = 64;

void release_host(void* /*owner*/, void* p) {
  std::free(p);
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      if (auto colon = line.find(':'); colon != std::string::npos) {
        return line.substr(line.find_first_not_of(" \t", colon + 1));
      }
    }
  }
  return "cpu";
}

// A dtype's values as fp32: the buffer itself for fp32, else a converted copy in `scratch`.
const float* as_f32(DType t, const void* data, int64_t n, std::vector<float>& scratch) {
  if (t == DType::kF32) return static_cast<const float*>(data);
  scratch.resize(static_cast<size_t>(n));
  to_float(t, data, scratch.data(), n);
  return scratch.data();
}

const std::byte* bytes_of(const Buffer& b) {
  return static_cast<const std::byte*>(b.data());
}
std::byte* bytes_of(Buffer& b) {
  return static_cast<std::byte*>(b.data());
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const MpiWorld& w) {
    info_.backend = "cpu";
    info_.name = cpu_model_name();
    info_.memory = Bytes(static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE));
    info_.versions = fmt::format("Eigen {}.{}.{}; {}", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION,
                                 EIGEN_MINOR_VERSION, w.version);
    info_.world = w.size;
    info_.rank = w.rank;
    info_.local_rank = w.local_rank;
    info_.hosts = w.hosts;
    cpu_set_t cores;
    CPU_ZERO(&cores);
    info_.host_cores = sched_getaffinity(0, sizeof(cores), &cores) == 0
                           ? CPU_COUNT(&cores)
                           : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    MPI_Comm_dup(MPI_COMM_WORLD, &p2p_);
    MPI_Comm_set_errhandler(p2p_, MPI_ERRORS_RETURN);
  }
  ~CpuBackend() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Comm& c : comms_) {
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    }
    MPI_Comm_free(&p2p_);
  }

  const DeviceInfo& info() const override { return info_; }

  Result<Buffer> allocate(Bytes size) override {
    if (size.count() < 0) return Status::invalid_argument("allocate: negative size");
    const size_t rounded =
        (static_cast<size_t>(std::max<int64_t>(size.count(), 1)) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      return Status::unavailable(fmt::format("allocate: out of host memory ({} bytes)", rounded));
    }
    return Buffer(p, size, &release_host, nullptr);
  }

  Status fill_random(Stream s, Buffer& b, DType t, int64_t count, uint64_t seed,
                     float scale) override {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    HETPAR_RETURN_IF_ERROR(check_buffer("fill_random", b, count, t));
    constexpr int64_t kChunk = 4096;
    float vals[kChunk];
    for (int64_t i = 0; i < count; i += kChunk) {
      const int64_t n = std::min(kChunk, count - i);
      for (int64_t j = 0; j < n; ++j) vals[j] = random_uniform(seed, i + j, scale);
      from_float(t, vals, bytes_of(b) + i * dtype_bytes(t), n);
    }
    return Status::ok();
  }

  Status copy_to_host(Stream s, const Buffer& b, std::span<std::byte> host) override {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    HETPAR_RETURN_IF_ERROR(
        check_buffer("copy_to_host", b, static_cast<int64_t>(host.size()), DType::kF8E4M3));
    if (!host.empty()) std::memcpy(host.data(), b.data(), host.size());
    return Status::ok();
  }

  Status copy_from_host(Stream s, std::span<const std::byte> host, Buffer& b) override {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    HETPAR_RETURN_IF_ERROR(
        check_buffer("copy_from_host", b, static_cast<int64_t>(host.size()), DType::kF8E4M3));
    if (!host.empty()) std::memcpy(b.data(), host.data(), host.size());
    return Status::ok();
  }

  Status gemm(Stream s, const GemmDesc& d, const Buffer& a, const Buffer& b, Buffer& c) override {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    HETPAR_RETURN_IF_ERROR(check_gemm(d, a, b, c));
    const int64_t a_elems = d.m * d.k, b_elems = d.k * d.n, c_elems = d.m * d.n;
    const int64_t in_bytes = dtype_bytes(d.dtype);
    const DType ct = d.c_dtype();
    const int64_t c_bytes = dtype_bytes(ct);
    for (int64_t i = 0; i < d.batch; ++i) {
      const float* pa = as_f32(d.dtype, bytes_of(a) + i * a_elems * in_bytes, a_elems, sa_);
      const float* pb = as_f32(d.dtype, bytes_of(b) + i * b_elems * in_bytes, b_elems, sb_);
      std::byte* c_raw = bytes_of(c) + i * c_elems * c_bytes;
      float* pc = reinterpret_cast<float*>(c_raw);
      if (ct != DType::kF32) {
        sc_.resize(static_cast<size_t>(c_elems));
        pc = sc_.data();
        if (d.beta != 0.0f) to_float(ct, c_raw, pc, c_elems);
      }
      ConstMat A(pa, d.trans_a ? d.k : d.m, d.trans_a ? d.m : d.k);
      ConstMat B(pb, d.trans_b ? d.n : d.k, d.trans_b ? d.k : d.n);
      MutMat C(pc, d.m, d.n);
      if (d.trans_a && d.trans_b) {
        multiply(C, A.transpose(), B.transpose(), d.alpha, d.beta);
      } else if (d.trans_a) {
        multiply(C, A.transpose(), B, d.alpha, d.beta);
      } else if (d.trans_b) {
        multiply(C, A, B.transpose(), d.alpha, d.beta);
      } else {
        multiply(C, A, B, d.alpha, d.beta);
      }
      if (ct != DType::kF32) from_float(ct, pc, c_raw, c_elems);
    }
    return Status::ok();
  }

  Status attention_forward(Stream s, const AttentionDesc& d, const Buffer& q, const Buffer& k,
                           const Buffer& v, const Buffer* sinks, Buffer& out,
                           Buffer& softmax_stats) override {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    HETPAR_RETURN_IF_ERROR(check_attention(d, q, k, v, sinks, out, softmax_stats));
    std::vector<float> sq, sk, sv;
    const int64_t nq = attention_q_elements(d), nkv = attention_kv_elements(d);
    const float* fq = as_f32(d.dtype, q.data(), nq, sq);
    const float* fk = as_f32(d.dtype, k.data(), nkv, sk);
    const float* fv = as_f32(d.dtype, v.data(), nkv, sv);
    std::vector<float> o(static_cast<size_t>(nq));
    cpu::attention_forward(d, fq, fk, fv,
                           sinks ? static_cast<const float*>(sinks->data()) : nullptr, o.data(),
                           static_cast<float*>(softmax_stats.data()));
    from_float(d.dtype, o.data(), out.data(), nq);
    return Status::ok();
  }

  Status attention_backward(Stream s, const AttentionDesc& d, const Buffer& q, const Buffer& k,
                            const Buffer& v, const Buffer* sinks, const Buffer& out,
                            const Buffer& d_out, const Buffer& softmax_stats, Buffer& d_q,
                            Buffer& d_k, Buffer& d_v, Buffer* d_sinks) override {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    HETPAR_RETURN_IF_ERROR(check_attention_backward(d, q, k, v, sinks, out, d_out, softmax_stats,
                                                    d_q, d_k, d_v, d_sinks));
    std::vector<float> sq, sk, sv, so, sdo;
    const int64_t nq = attention_q_elements(d), nkv = attention_kv_elements(d);
    const float* fq = as_f32(d.dtype, q.data(), nq, sq);
    const float* fk = as_f32(d.dtype, k.data(), nkv, sk);
    const float* fv = as_f32(d.dtype, v.data(), nkv, sv);
    const float* fo = as_f32(d.dtype, out.data(), nq, so);
    const float* fdo = as_f32(d.dtype, d_out.data(), nq, sdo);
    std::vector<float> dq(static_cast<size_t>(nq)), dk(static_cast<size_t>(nkv), 0.0f),
        dv(static_cast<size_t>(nkv), 0.0f);
    cpu::attention_backward(d, fq, fk, fv,
                            sinks ? static_cast<const float*>(sinks->data()) : nullptr, fo, fdo,
                            static_cast<const float*>(softmax_stats.data()), dq.data(), dk.data(),
                            dv.data(), d_sinks ? static_cast<float*>(d_sinks->data()) : nullptr);
    from_float(d.dtype, dq.data(), d_q.data(), nq);
    from_float(d.dtype, dk.data(), d_k.data(), nkv);
    from_float(d.dtype, dv.data(), d_v.data(), nkv);
    return Status::ok();
  }

  Status elementwise(Stream s, const ElementwiseDesc& d, std::span<const Buffer* const> inputs,
                     Buffer& out) override {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    HETPAR_RETURN_IF_ERROR(check_elementwise(d, inputs, out));
    const int64_t es = dtype_bytes(d.dtype);
    if (d.op == ElementwiseOp::kCopy) {
      if (d.elements > 0) std::memmove(out.data(), inputs[0]->data(), d.elements * es);
      return Status::ok();
    }
    // Chunks of whole rows for the row ops, converted to fp32 and back.
    const bool rows = d.row_size > 0 &&
                      (d.op == ElementwiseOp::kRmsNorm || d.op == ElementwiseOp::kRmsNormBackward);
    const int64_t chunk = rows ? std::max<int64_t>(1, 8192 / d.row_size) * d.row_size : 8192;
    std::vector<float> in_scratch[2];
    std::vector<float> out_scratch;
    for (int64_t i = 0; i < d.elements; i += chunk) {
      const int64_t n = std::min(chunk, d.elements - i);
      const float* in[2] = {nullptr, nullptr};
      for (size_t j = 0; j < inputs.size(); ++j) {
        in[j] = as_f32(d.dtype, bytes_of(*inputs[j]) + i * es, n, in_scratch[j]);
      }
      float* o = reinterpret_cast<float*>(bytes_of(out) + i * es);
      if (d.dtype != DType::kF32) {
        out_scratch.resize(static_cast<size_t>(n));
        o = out_scratch.data();
      }
      cpu::elementwise(d, in, o, n);
      if (d.dtype != DType::kF32) from_float(d.dtype, o, bytes_of(out) + i * es, n);
    }
    return Status::ok();
  }

  Status flush_cache(Stream s) override {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    if (flush_.empty()) {
      // Twice the L3, between 16 and 64 MiB: sysconf reports a whole package's L3 on some
      // CPUs (256 MiB on an EPYC whose cores each see 32 MiB).
      const int64_t l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
      const int64_t bytes = std::clamp<int64_t>(2 * l3, int64_t{16} << 20, int64_t{64} << 20);
      HETPAR_ASSIGN_OR_RETURN(flush_, allocate(Bytes(bytes)));
    }
    std::memset(flush_.data(), ++flush_value_, static_cast<size_t>(flush_.size().count()));
    return Status::ok();
  }

  Result<Group> make_group(std::span<const int> ranks) override {
    HETPAR_ASSIGN_OR_RETURN(
        Group g, new_group(ranks, info_.world, static_cast<int64_t>(comms_.size()), info_.rank));
    MPI_Comm comm = MPI_COMM_NULL;
    HETPAR_RETURN_IF_ERROR(
        mpi_check(MPI_Comm_split(MPI_COMM_WORLD, g.rank < 0 ? MPI_UNDEFINED : 0, g.rank, &comm),
                  "make_group: MPI_Comm_split"));
    if (comm != MPI_COMM_NULL) MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    comms_.push_back(comm);
    return g;
  }

  Status all_reduce(Stream s, const Group& g, const Buffer& send, Buffer& recv, int64_t count,
                    DType t) override {
    HETPAR_ASSIGN_OR_RETURN(MPI_Comm comm, comm_for("all_reduce", s, g, count));
    HETPAR_ASSIGN_OR_RETURN(bool in_place, check_collective("all_reduce", Collective::kAllReduce, g,
                                                            send, recv, count, t));
    const void* src = in_place ? MPI_IN_PLACE : send.data();
    return mpi_check(
        MPI_Allreduce(src, recv.data(), static_cast<int>(count), mpi_type(t), mpi_sum(t), comm),
        "all_reduce: MPI_Allreduce");
  }

  Status all_gather(Stream s, const Group& g, const Buffer& send, Buffer& recv, int64_t count,
                    DType t) override {
    HETPAR_ASSIGN_OR_RETURN(MPI_Comm comm, comm_for("all_gather", s, g, count * g.size()));
    HETPAR_ASSIGN_OR_RETURN(bool in_place, check_collective("all_gather", Collective::kAllGather, g,
                                                            send, recv, count, t));
    const void* src = in_place ? MPI_IN_PLACE : send.data();
    return mpi_check(MPI_Allgather(src, static_cast<int>(count), mpi_type(t), recv.data(),
                                   static_cast<int>(count), mpi_type(t), comm),
                     "all_gather: MPI_Allgather");
  }

  Status reduce_scatter(Stream s, const Group& g, const Buffer& send, Buffer& recv, int64_t count,
                        DType t) override {
    HETPAR_ASSIGN_OR_RETURN(MPI_Comm comm, comm_for("reduce_scatter", s, g, count * g.size()));
    HETPAR_ASSIGN_OR_RETURN(
        bool in_place,
        check_collective("reduce_scatter", Collective::kReduceScatter, g, send, recv, count, t));
    // In place (NCCL's form): recv is this rank's slot of send; MPI's differs, so stage.
    const void* src = send.data();
    if (in_place) {
      HETPAR_RETURN_IF_ERROR(stage(send, count * dtype_bytes(t) * g.size()));
      src = staging_.data();
    }
    return mpi_check(MPI_Reduce_scatter_block(src, recv.data(), static_cast<int>(count),
                                              mpi_type(t), mpi_sum(t), comm),
                     "reduce_scatter: MPI_Reduce_scatter_block");
  }

  Status all_to_all(Stream s, const Group& g, const Buffer& send, Buffer& recv, int64_t count,
                    DType t) override {
    HETPAR_ASSIGN_OR_RETURN(MPI_Comm comm, comm_for("all_to_all", s, g, count * g.size()));
    HETPAR_RETURN_IF_ERROR(
        check_collective("all_to_all", Collective::kAllToAll, g, send, recv, count, t).status());
    return mpi_check(MPI_Alltoall(send.data(), static_cast<int>(count), mpi_type(t), recv.data(),
                                  static_cast<int>(count), mpi_type(t), comm),
                     "all_to_all: MPI_Alltoall");
  }

  Status broadcast(Stream s, const Group& g, Buffer& buf, int64_t count, DType t,
                   int root) override {
    HETPAR_ASSIGN_OR_RETURN(MPI_Comm comm, comm_for("broadcast", s, g, count));
    HETPAR_RETURN_IF_ERROR(check_buffer("broadcast", buf, count, t));
    HETPAR_RETURN_IF_ERROR(check_root("broadcast", g, root));
    return mpi_check(MPI_Bcast(buf.data(), static_cast<int>(count), mpi_type(t), root, comm),
                     "broadcast: MPI_Bcast");
  }

  Status send(Stream s, const Buffer& buf, int64_t count, DType t, int peer) override {
    HETPAR_RETURN_IF_ERROR(check_p2p("send", s, count, peer));
    HETPAR_RETURN_IF_ERROR(check_buffer("send", buf, count, t));
    if (group_depth_ > 0) {
      pending_.emplace_back();
      return mpi_check(MPI_Isend(buf.data(), static_cast<int>(count), mpi_type(t), peer, 0, p2p_,
                                 &pending_.back()),
                       "send: MPI_Isend");
    }
    return mpi_check(MPI_Send(buf.data(), static_cast<int>(count), mpi_type(t), peer, 0, p2p_),
                     "send: MPI_Send");
  }

  Status recv(Stream s, Buffer& buf, int64_t count, DType t, int peer) override {
    HETPAR_RETURN_IF_ERROR(check_p2p("recv", s, count, peer));
    HETPAR_RETURN_IF_ERROR(check_buffer("recv", buf, count, t));
    if (group_depth_ > 0) {
      pending_.emplace_back();
      return mpi_check(MPI_Irecv(buf.data(), static_cast<int>(count), mpi_type(t), peer, 0, p2p_,
                                 &pending_.back()),
                       "recv: MPI_Irecv");
    }
    return mpi_check(MPI_Recv(buf.data(), static_cast<int>(count), mpi_type(t), peer, 0, p2p_,
                              MPI_STATUS_IGNORE),
                     "recv: MPI_Recv");
  }

  Status group_start() override {
    ++group_depth_;
    return Status::ok();
  }

  Status group_end() override {
    if (group_depth_ == 0) return Status::invalid_argument("group_end without group_start");
    if (--group_depth_ > 0 || pending_.empty()) return Status::ok();
    std::vector<MPI_Request> requests = std::move(pending_);
    pending_.clear();
    return mpi_check(
        MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
        "group_end: MPI_Waitall");
  }

  Result<Event> record(Stream s) override {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    event_ns_.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
    return Event{static_cast<int64_t>(event_ns_.size()) - 1};
  }

  Status wait(Stream s, Event e) override {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    return check_event(e);  // streams are synchronous: the event has completed
  }

  Status synchronize() override { return Status::ok(); }

  Result<Time> elapsed(Event from, Event to) override {
    HETPAR_RETURN_IF_ERROR(check_event(from));
    HETPAR_RETURN_IF_ERROR(check_event(to));
    return Time::ns(static_cast<double>(event_ns_[to.id] - event_ns_[from.id]));
  }

  // A barrier that does not spin: ranks that wait (e.g. while rank 0 alone runs timed
  // kernels in `hetpar calibrate`) would otherwise take cores from it when ranks outnumber
  // cores. Polls MPI_Test, spinning for the first 50 us, then sleeping 20 us between polls.
  Status barrier() override {
    MPI_Request req;
    HETPAR_RETURN_IF_ERROR(mpi_check(MPI_Ibarrier(p2p_, &req), "barrier: MPI_Ibarrier"));
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      HETPAR_RETURN_IF_ERROR(
          mpi_check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "barrier: MPI_Test"));
      if (done) return Status::ok();
      if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(50)) ::usleep(20);
    }
  }

 private:
  template <class A, class B>
  static void multiply(MutMat& c, const A& a, const B& b, float alpha, float beta) {
    if (beta == 0.0f) {
      c.noalias() = alpha * a * b;
    } else {
      c *= beta;
      c.noalias() += alpha * a * b;
    }
  }

  Result<MPI_Comm> comm_for(std::string_view op, Stream s, const Group& g, int64_t elements) {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    HETPAR_RETURN_IF_ERROR(check_member(op, g, static_cast<int64_t>(comms_.size())));
    HETPAR_RETURN_IF_ERROR(check_count(op, elements));
    if (elements > INT_MAX) {
      return Status::invalid_argument(
          fmt::format("{}: {} elements exceed MPI's int counts", op, elements));
    }
    return comms_[static_cast<size_t>(g.id)];
  }

  Status check_p2p(std::string_view op, Stream s, int64_t count, int peer) {
    HETPAR_RETURN_IF_ERROR(check_stream(s));
    return check_peer(op, peer, info_.world, info_.rank, count, INT_MAX);  // MPI's int counts
  }

  Status check_event(Event e) const {
    if (e.id < 0 || e.id >= static_cast<int64_t>(event_ns_.size())) {
      return Status::invalid_argument(fmt::format("event {} was not recorded here", e.id));
    }
    return Status::ok();
  }

  // A private copy of `b`'s first `bytes` bytes, for an in-place reduce-scatter.
  Status stage(const Buffer& b, int64_t bytes) {
    if (staging_.size().count() < bytes) {
      HETPAR_ASSIGN_OR_RETURN(staging_, allocate(Bytes(bytes)));
    }
    std::memcpy(staging_.data(), b.data(), static_cast<size_t>(bytes));
    return Status::ok();
  }

  DeviceInfo info_;
  MPI_Comm p2p_ = MPI_COMM_NULL;  // world duplicate: P2P and barriers
  std::vector<MPI_Comm> comms_;   // by Group::id; MPI_COMM_NULL where not a member
  int group_depth_ = 0;
  std::vector<MPI_Request> pending_;  // P2P posted inside group_start/group_end
  std::vector<int64_t> event_ns_;     // by Event::id: steady-clock time of record()
  std::vector<float> sa_, sb_, sc_;   // GEMM conversion scratch
  Buffer flush_, staging_;
  unsigned char flush_value_ = 0;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cpu_backend() {
  HETPAR_ASSIGN_OR_RETURN(const MpiWorld* world, mpi_world());
  return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(*world));
}

}  // namespace hetpar::runtime
