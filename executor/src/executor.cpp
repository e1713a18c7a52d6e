#include "hetpar/executor/executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>

#include "hetpar/executor/program.h"
#include "hetpar/planner/kernels.h"

namespace hetpar::executor {

using runtime::Backend;
using runtime::Buffer;
using runtime::DType;
using runtime::Stream;
using sim::Kernel;
using sim::KernelKind;

std::string phase_of(std::string_view c) {
  if (c.starts_with("enc_")) return "encoder";
  if (c == "boundary_comm") return "boundary";
  if (c == "fwd") return "llm forward";
  if (c == "bwd" || c == "wgrad" || c == "recompute") return "llm backward";
  if (c == "dp_comm") return "dp sync";
  if (c == "optimizer") return "optimizer";
  if (c.ends_with("_comm")) return fmt::format("{} comm", c.substr(0, c.size() - 5));
  return std::string(c);
}

std::vector<planner::PhaseTime> group_phases(const std::vector<planner::PhaseTime>& categories) {
  static constexpr std::array<std::string_view, 10> kOrder = {
      "encoder", "boundary", "llm forward", "llm backward", "tp comm",
      "cp comm", "pp comm",  "ep comm",     "dp sync",      "optimizer"};
  std::map<std::string, Time> sum;
  for (const planner::PhaseTime& p : categories) sum[phase_of(p.phase)] += p.per_rank;
  std::vector<planner::PhaseTime> out;
  for (std::string_view name : kOrder)
    if (auto it = sum.find(std::string(name)); it != sum.end()) {
      out.push_back({it->first, it->second});
      sum.erase(it);
    }
  for (const auto& [name, t] : sum) out.push_back({name, t});
  return out;
}

namespace {

// The head width an attention kernel runs at: the runtime's kernels take one width for Q, K
// and V, so latent attention's narrower values (sim::Kernel::v_head_dim) run padded to the
// query's width, more work than the simulation counts.
int64_t run_head_dim(const sim::Kernel& k) {
  return std::max(k.head_dim, k.value_dim());
}

// Whether `k` does any work: a kernel with an empty shape (a shard of nothing) is skipped.
bool runs(const Kernel& k) {
  switch (k.kind) {
    case KernelKind::kGemm:
      return k.m > 0 && k.n > 0 && k.k > 0 && k.batch > 0;
    case KernelKind::kAttentionForward:
    case KernelKind::kAttentionBackward:
      return k.seq_q > 0 && k.seq_kv > 0 && k.heads > 0;
    case KernelKind::kMemory:
      return k.bytes / 4 > 0;  // run as a copy of bytes / 4 bf16 elements
  }
  return false;
}

DType kernel_dtype(const Kernel& k) {
  return k.element_bytes == 1 ? DType::kF8E4M3 : k.element_bytes == 4 ? DType::kF32 : DType::kBf16;
}

// Buffer roles of the compute stream.
enum Slot : int {
  kA,
  kB,
  kC,
  kQ,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSinks,
  kDSinks,
  kIn,
  kOut,
  kSlots
};

// How a communication task runs on this rank.
struct CommShape {
  DType dtype = DType::kBf16;
  int64_t count = 0;  // the backend call's count argument
  int64_t send = 0;   // elements of the send buffer
  int64_t recv = 0;   // elements of the receive buffer
};

CommShape comm_shape(const sim::Task& t, int group_size, bool fp32) {
  CommShape c;
  c.dtype = fp32 && t.bytes.count() % 4 == 0 ? DType::kF32 : DType::kBf16;
  const int64_t e = runtime::dtype_bytes(c.dtype);
  const int64_t elements = (t.bytes.count() + e - 1) / e;
  const int64_t n = std::max(1, group_size);
  const int64_t per_rank = (elements + n - 1) / n;
  if (t.kind == sim::TaskKind::kP2P) {
    c.count = c.send = c.recv = elements;
    return c;
  }
  switch (t.collective) {
    case sim::CollectiveKind::kAllReduce:
    case sim::CollectiveKind::kReduce:
    case sim::CollectiveKind::kBroadcast:
      c.count = c.send = c.recv = elements;
      break;
    case sim::CollectiveKind::kAllGather:
      c.count = c.send = per_rank;
      c.recv = per_rank * n;
      break;
    case sim::CollectiveKind::kReduceScatter:
      c.count = c.recv = per_rank;
      c.send = per_rank * n;
      break;
    case sim::CollectiveKind::kAllToAll:
      c.count = per_rank;
      c.send = c.recv = per_rank * n;
      break;
  }
  return c;
}

class Runner {
 public:
  Runner(Backend& b, const planner::LoweredPlan& lp) : b_(b), lp_(lp), g_(lp.graph) {}

  Status prepare();
  Status iteration(bool timed);
  Status census(const ExecuteOptions& o);
  Result<Measurement> finish(const ExecuteOptions& o);

 private:
  Status run_task(const ProgramTask& pt);
  Status run_kernel(Stream s, const Kernel& k);
  Status run_comm(Stream s, const sim::Task& t);
  bool is_fp32(const sim::Task& t) const {
    return dp_category_.valid() && t.label.category == dp_category_;
  }

  Backend& b_;
  const planner::LoweredPlan& lp_;
  const sim::TaskGraph& g_;
  RankProgram prog_;
  int rank_ = 0;
  sim::LabelId dp_category_;
  std::array<int64_t, kSlots> slot_bytes_{};
  std::array<Buffer, kSlots> slots_;
  std::vector<Buffer> send_, recv_;  // per runtime stream
  std::vector<int64_t> send_bytes_, recv_bytes_;
  std::map<int32_t, runtime::Group> groups_;  // sim group id -> backend group
  std::vector<sim::LabelId> categories_;      // every category of the graph, in id order
  std::vector<int> category_index_;           // label id -> index in categories_, or -1
  std::vector<runtime::Event> end_;           // per program task, this iteration
  std::vector<runtime::Event> start_;
  std::vector<double> category_us_;   // this rank, summed over timed iterations
  std::vector<double> iteration_us_;  // this rank, per timed iteration
  int64_t pool_bytes_ = 0;
  static constexpr int kKinds = 4;  // sim::KernelKind values
  std::array<double, kKinds> census_calls_{}, census_predicted_us_{}, census_measured_us_{};
};

Status Runner::prepare() {
  rank_ = b_.info().rank;
  HETPAR_ASSIGN_OR_RETURN(std::vector<TaskId> order, issue_order(g_));
  HETPAR_ASSIGN_OR_RETURN(prog_, rank_program(g_, order, rank_));
  if (prog_.foreign_dependencies > 0)
    return Status::invalid_argument(fmt::format(
        "rank {}: {} dependencies from tasks of other ranks with no transfer between them", rank_,
        prog_.foreign_dependencies));
  // Categories, the same list on every rank.
  category_index_.assign(static_cast<size_t>(g_.num_labels()), -1);
  for (int t = 0; t < g_.num_tasks(); ++t) {
    const sim::LabelId c = g_.task(TaskId(t)).label.category;
    if (c.valid() && category_index_[c.value()] < 0) {
      category_index_[c.value()] = static_cast<int>(categories_.size());
      categories_.push_back(c);
      if (g_.label_text(c) == "dp_comm") dp_category_ = c;
    }
  }
  category_us_.assign(categories_.size(), 0.0);
  // Groups: every rank creates every collective group, in group-id order.
  std::vector<int32_t> ids;
  for (int t = 0; t < g_.num_tasks(); ++t) {
    const sim::Task& task = g_.task(TaskId(t));
    if (task.kind == sim::TaskKind::kCollective) ids.push_back(task.group.value());
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int32_t id : ids) {
    std::vector<int> ranks;
    for (RankId r : g_.group(sim::GroupId(id))) ranks.push_back(r.value());
    HETPAR_ASSIGN_OR_RETURN(runtime::Group grp, b_.make_group(ranks));
    groups_.emplace(id, std::move(grp));
  }
  // Pool sizes from this rank's kernels and messages.
  send_bytes_.assign(static_cast<size_t>(prog_.num_streams), 0);
  recv_bytes_.assign(static_cast<size_t>(prog_.num_streams), 0);
  auto need = [&](int slot, int64_t bytes) {
    slot_bytes_[slot] = std::max(slot_bytes_[slot], bytes);
  };
  for (const ProgramTask& pt : prog_.tasks) {
    const sim::Task& t = g_.task(pt.id);
    if (t.kind == sim::TaskKind::kCompute) {
      if (!t.kernels.valid())
        return Status::invalid_argument(fmt::format(
            "task {} (\"{}\") has no kernels: lower with LowerOptions::kernels to execute a plan",
            pt.id.value(), g_.label_text(t.label.name)));
      for (const Kernel& k : g_.kernels(t.kernels)) {
        const int64_t e = runtime::dtype_bytes(kernel_dtype(k));
        switch (k.kind) {
          case KernelKind::kGemm:
            need(kA, k.m * k.k * k.batch * e);
            need(kB, k.k * k.n * k.batch * e);
            // fp8: C is bf16; adding into an fp32 main_grad: fp32
            need(kC, k.m * k.n * k.batch * (k.accumulate_fp32 ? 4 : e == 1 ? 2 : e));
            break;
          case KernelKind::kAttentionForward:
          case KernelKind::kAttentionBackward: {
            const int64_t d = run_head_dim(k);
            const int64_t q = k.batch * k.seq_q * k.heads * d * e;
            const int64_t kv = k.batch * k.seq_kv * k.kv_heads * d * e;
            need(kQ, q);
            need(kK, kv);
            need(kV, kv);
            need(kO, q);
            need(kStats, k.batch * k.heads * k.seq_q * 4);
            if (k.sinks) need(kSinks, k.heads * 4);  // fp32 logits
            if (k.kind == KernelKind::kAttentionBackward) {
              need(kDO, q);
              need(kDQ, q);
              need(kDK, kv);
              need(kDV, kv);
              if (k.sinks) need(kDSinks, k.heads * 4);
            }
            break;
          }
          case KernelKind::kMemory:
            need(kIn, k.bytes / 2);
            need(kOut, k.bytes / 2);
            break;
        }
      }
      continue;
    }
    const int n =
        t.kind == sim::TaskKind::kCollective ? static_cast<int>(g_.group(t.group).size()) : 2;
    const CommShape c = comm_shape(t, n, is_fp32(t));
    const int64_t e = runtime::dtype_bytes(c.dtype);
    send_bytes_[pt.stream] = std::max(send_bytes_[pt.stream], c.send * e);
    recv_bytes_[pt.stream] = std::max(recv_bytes_[pt.stream], c.recv * e);
  }
  auto alloc = [&](Buffer& buf, int64_t bytes, uint64_t seed) -> Status {
    if (bytes <= 0) return Status::ok();
    bytes = (bytes + 3) / 4 * 4;
    HETPAR_ASSIGN_OR_RETURN(buf, b_.allocate(Bytes(bytes)));
    pool_bytes_ += bytes;
    // bf16 values in [-1, 1]: finite and normal whichever dtype later reads them (fp32
    // reads two of them as one value with a bf16 exponent).
    return b_.fill_random(runtime::kComputeStream, buf, DType::kBf16, bytes / 2, seed, 1.0f);
  };
  for (int s = 0; s < kSlots; ++s) HETPAR_RETURN_IF_ERROR(alloc(slots_[s], slot_bytes_[s], 17 + s));
  send_.resize(send_bytes_.size());
  recv_.resize(recv_bytes_.size());
  for (size_t s = 0; s < send_.size(); ++s) {
    HETPAR_RETURN_IF_ERROR(alloc(send_[s], send_bytes_[s], 1000 + s));
    HETPAR_RETURN_IF_ERROR(alloc(recv_[s], recv_bytes_[s], 2000 + s));
  }
  end_.resize(prog_.tasks.size());
  start_.resize(prog_.tasks.size());
  return b_.synchronize();
}

Status Runner::run_kernel(Stream s, const Kernel& k) {
  if (!runs(k)) return Status::ok();
  const DType t = kernel_dtype(k);
  switch (k.kind) {
    case KernelKind::kGemm: {
      runtime::GemmDesc d;
      d.m = k.m;
      d.n = k.n;
      d.k = k.k;
      d.batch = k.batch;
      d.dtype = t;
      d.trans_a = t == DType::kF8E4M3;  // fp8 tensor cores take "TN" only (backend.h)
      if (k.accumulate_fp32) {          // a weight gradient added into the fp32 main_grad
        d.fp32_c = true;
        d.beta = 1.0f;
      }
      return b_.gemm(s, d, slots_[kA], slots_[kB], slots_[kC]);
    }
    case KernelKind::kAttentionForward:
    case KernelKind::kAttentionBackward: {
      runtime::AttentionDesc d;
      d.batch = k.batch;
      d.heads = k.heads;
      d.kv_heads = k.kv_heads;
      d.seq_q = k.seq_q;
      d.seq_kv = k.seq_kv;
      d.head_dim = run_head_dim(k);
      d.causal = k.causal;
      d.window = k.window;
      d.sinks = k.sinks;
      d.dtype = t;
      const Buffer* sinks = k.sinks ? &slots_[kSinks] : nullptr;
      if (k.kind == KernelKind::kAttentionForward)
        return b_.attention_forward(s, d, slots_[kQ], slots_[kK], slots_[kV], sinks, slots_[kO],
                                    slots_[kStats]);
      return b_.attention_backward(s, d, slots_[kQ], slots_[kK], slots_[kV], sinks, slots_[kO],
                                   slots_[kDO], slots_[kStats], slots_[kDQ], slots_[kDK],
                                   slots_[kDV], k.sinks ? &slots_[kDSinks] : nullptr);
    }
    case KernelKind::kMemory: {
      // Read bytes/2 and write bytes/2: a copy of bytes/4 bf16 elements.
      const int64_t elements = k.bytes / 4;
      runtime::ElementwiseDesc d;
      d.op = runtime::ElementwiseOp::kCopy;
      d.elements = elements;
      d.dtype = DType::kBf16;
      const Buffer* in[] = {&slots_[kIn]};
      return b_.elementwise(s, d, in, slots_[kOut]);
    }
  }
  return Status::ok();
}

Status Runner::run_comm(Stream s, const sim::Task& t) {
  Buffer& send = send_[s.index];
  Buffer& recv = recv_[s.index];
  if (t.kind == sim::TaskKind::kP2P) {
    const CommShape c = comm_shape(t, 2, is_fp32(t));
    if (c.count <= 0) return Status::ok();
    std::vector<std::pair<int, int>> pairs;
    if (t.group.valid()) {
      const auto members = g_.group(t.group);
      for (size_t i = 0; i + 1 < members.size(); i += 2)
        pairs.emplace_back(members[i].value(), members[i + 1].value());
    } else {
      pairs.emplace_back(t.src.value(), t.dst.value());
    }
    const bool grouped = pairs.size() > 1;
    if (grouped) HETPAR_RETURN_IF_ERROR(b_.group_start());
    for (const auto& [src, dst] : pairs) {
      if (src == dst) continue;
      if (src == rank_) HETPAR_RETURN_IF_ERROR(b_.send(s, send, c.count, c.dtype, dst));
      if (dst == rank_) HETPAR_RETURN_IF_ERROR(b_.recv(s, recv, c.count, c.dtype, src));
    }
    if (grouped) HETPAR_RETURN_IF_ERROR(b_.group_end());
    return Status::ok();
  }
  const runtime::Group& grp = groups_.at(t.group.value());
  if (grp.size() < 2) return Status::ok();
  const CommShape c = comm_shape(t, grp.size(), is_fp32(t));
  if (c.count <= 0) return Status::ok();
  switch (t.collective) {
    case sim::CollectiveKind::kAllReduce:
    case sim::CollectiveKind::kReduce:
      return b_.all_reduce(s, grp, send, recv, c.count, c.dtype);
    case sim::CollectiveKind::kAllGather:
      return b_.all_gather(s, grp, send, recv, c.count, c.dtype);
    case sim::CollectiveKind::kReduceScatter:
      return b_.reduce_scatter(s, grp, send, recv, c.count, c.dtype);
    case sim::CollectiveKind::kAllToAll:
      return b_.all_to_all(s, grp, send, recv, c.count, c.dtype);
    case sim::CollectiveKind::kBroadcast: {
      int root = 0;
      for (int i = 0; i < grp.size(); ++i)
        if (grp.ranks[i] == t.root.value()) root = i;
      return b_.broadcast(s, grp, recv, c.count, c.dtype, root);
    }
  }
  return Status::ok();
}

Status Runner::run_task(const ProgramTask& pt) {
  const sim::Task& t = g_.task(pt.id);
  const Stream s{pt.stream};
  if (t.kind == sim::TaskKind::kCompute) {
    for (const Kernel& k : g_.kernels(t.kernels)) HETPAR_RETURN_IF_ERROR(run_kernel(s, k));
    return Status::ok();
  }
  return run_comm(s, t);
}

Status Runner::iteration(bool timed) {
  HETPAR_RETURN_IF_ERROR(b_.barrier());
  HETPAR_ASSIGN_OR_RETURN(runtime::Event begin, b_.record(runtime::kComputeStream));
  std::vector<bool> started(static_cast<size_t>(prog_.num_streams), false);
  started[0] = true;
  for (size_t i = 0; i < prog_.tasks.size(); ++i) {
    const ProgramTask& pt = prog_.tasks[i];
    const Stream s{pt.stream};
    if (!started[pt.stream]) {  // nothing on this stream starts before the iteration
      HETPAR_RETURN_IF_ERROR(b_.wait(s, begin));
      started[pt.stream] = true;
    }
    for (int32_t w : pt.waits) HETPAR_RETURN_IF_ERROR(b_.wait(s, end_[w]));
    HETPAR_ASSIGN_OR_RETURN(start_[i], b_.record(s));
    HETPAR_RETURN_IF_ERROR(run_task(pt));
    HETPAR_ASSIGN_OR_RETURN(end_[i], b_.record(s));
  }
  HETPAR_RETURN_IF_ERROR(b_.synchronize());
  if (!timed) return Status::ok();
  Time last;
  for (size_t i = 0; i < prog_.tasks.size(); ++i) {
    HETPAR_ASSIGN_OR_RETURN(Time to_end, b_.elapsed(begin, end_[i]));
    last = std::max(last, to_end);
    HETPAR_ASSIGN_OR_RETURN(Time d, b_.elapsed(start_[i], end_[i]));
    const sim::LabelId c = g_.task(prog_.tasks[i].id).label.category;
    if (c.valid()) category_us_[category_index_[c.value()]] += d.to_us();
  }
  iteration_us_.push_back(last.to_us());
  return Status::ok();
}

Status Runner::census(const ExecuteOptions& o) {
  if (o.census_device == nullptr) return Status::ok();
  std::vector<const Kernel*> run;  // this rank's kernels, in program order
  for (const ProgramTask& pt : prog_.tasks) {
    const sim::Task& t = g_.task(pt.id);
    if (t.kind != sim::TaskKind::kCompute) continue;
    for (const Kernel& k : g_.kernels(t.kernels)) {
      if (!runs(k)) continue;
      run.push_back(&k);
      const int kind = static_cast<int>(k.kind);
      census_calls_[kind] += 1;
      census_predicted_us_[kind] +=
          planner::kernel_time(k, *o.census_device, o.census_precision, o.census_attention).to_us();
    }
  }
  std::array<std::vector<double>, kKinds> passes;
  std::vector<runtime::Event> before(run.size()), after(run.size());
  for (int rep = 0; rep < std::max(1, o.census_reps); ++rep) {
    for (size_t i = 0; i < run.size(); ++i) {
      HETPAR_ASSIGN_OR_RETURN(before[i], b_.record(runtime::kComputeStream));
      HETPAR_RETURN_IF_ERROR(run_kernel(runtime::kComputeStream, *run[i]));
      HETPAR_ASSIGN_OR_RETURN(after[i], b_.record(runtime::kComputeStream));
    }
    HETPAR_RETURN_IF_ERROR(b_.synchronize());
    std::array<double, kKinds> sum{};
    for (size_t i = 0; i < run.size(); ++i) {
      HETPAR_ASSIGN_OR_RETURN(Time d, b_.elapsed(before[i], after[i]));
      sum[static_cast<int>(run[i]->kind)] += d.to_us();
    }
    for (int k = 0; k < kKinds; ++k) passes[k].push_back(sum[k]);
  }
  for (int k = 0; k < kKinds; ++k) {
    std::sort(passes[k].begin(), passes[k].end());
    census_measured_us_[k] = passes[k][passes[k].size() / 2];
  }
  return Status::ok();
}

Result<Measurement> Runner::finish(const ExecuteOptions& o) {
  // Gather every rank's figures: [iteration times..., category times..., census (calls,
  // predicted, measured per kind), pool bytes (MiB)].
  const int world = b_.info().world;
  const int64_t census_at = static_cast<int64_t>(iteration_us_.size() + category_us_.size());
  const int64_t n = census_at + 3 * kKinds + 1;
  std::vector<float> mine;
  for (double v : iteration_us_) mine.push_back(static_cast<float>(v));
  for (double v : category_us_) mine.push_back(static_cast<float>(v / o.iterations));
  for (int k = 0; k < kKinds; ++k) {
    mine.push_back(static_cast<float>(census_calls_[k]));
    mine.push_back(static_cast<float>(census_predicted_us_[k]));
    mine.push_back(static_cast<float>(census_measured_us_[k]));
  }
  mine.push_back(static_cast<float>(static_cast<double>(pool_bytes_) / (1 << 20)));
  HETPAR_ASSIGN_OR_RETURN(Buffer send, b_.allocate(Bytes(n * 4)));
  HETPAR_ASSIGN_OR_RETURN(Buffer recv, b_.allocate(Bytes(n * 4 * world)));
  HETPAR_RETURN_IF_ERROR(b_.copy_from_host(runtime::kComputeStream,
                                           std::as_bytes(std::span<const float>(mine)), send));
  std::vector<float> all(static_cast<size_t>(n * world));
  if (world > 1) {
    std::vector<int> ranks(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) ranks[r] = r;
    HETPAR_ASSIGN_OR_RETURN(runtime::Group everyone, b_.make_group(ranks));
    HETPAR_RETURN_IF_ERROR(
        b_.all_gather(runtime::kComputeStream, everyone, send, recv, n, DType::kF32));
    HETPAR_RETURN_IF_ERROR(b_.copy_to_host(runtime::kComputeStream, recv,
                                           std::as_writable_bytes(std::span<float>(all))));
  } else {
    all = mine;
  }
  Measurement m;
  m.world = world;
  m.tasks = g_.num_tasks();
  m.model_flops_per_iteration = lp_.model_flops_per_iteration;
  for (size_t it = 0; it < iteration_us_.size(); ++it) {
    float worst = 0;
    for (int r = 0; r < world; ++r) worst = std::max(worst, all[r * n + it]);
    m.iterations.push_back(Time::us(worst));
  }
  std::vector<Time> sorted = m.iterations;
  std::sort(sorted.begin(), sorted.end());
  if (!sorted.empty()) m.iteration_time = sorted[sorted.size() / 2];
  for (size_t c = 0; c < categories_.size(); ++c) {
    double sum = 0;
    for (int r = 0; r < world; ++r) sum += all[r * n + iteration_us_.size() + c];
    m.phases.push_back({std::string(g_.label_text(categories_[c])), Time::us(sum / world)});
  }
  std::sort(
      m.phases.begin(), m.phases.end(),
      [](const planner::PhaseTime& a, const planner::PhaseTime& b) { return a.phase < b.phase; });
  if (o.census_device != nullptr)
    for (int k = 0; k < kKinds; ++k) {
      KernelTiming kt;
      kt.kind = static_cast<KernelKind>(k);
      double predicted = 0, measured = 0;
      for (int r = 0; r < world; ++r) {
        const float* c = &all[r * n + census_at + 3 * k];
        kt.calls += c[0];
        predicted += c[1];
        measured += c[2];
      }
      if (kt.calls == 0) continue;
      kt.calls /= world;
      kt.predicted = Time::us(predicted / world);
      kt.measured = Time::us(measured / world);
      m.kernels.push_back(kt);
    }
  double pool = 0;
  for (int r = 0; r < world; ++r) pool = std::max<double>(pool, all[r * n + n - 1]);
  m.pool_bytes = Bytes(static_cast<int64_t>(pool * (1 << 20)));
  if (m.iteration_time > Time::zero())
    m.tflops_per_gpu =
        m.model_flops_per_iteration.count() / (m.iteration_time.to_seconds() * world) / 1e12;
  return m;
}

}  // namespace

Result<Measurement> execute(Backend& backend, const planner::LoweredPlan& lp,
                            const ExecuteOptions& o) {
  if (backend.info().world != lp.world)
    return Status::invalid_argument(
        fmt::format("the plan needs {} ranks but {} processes run it (mpirun -np {})", lp.world,
                    backend.info().world, lp.world));
  if (o.iterations < 1 || o.warmup < 0)
    return Status::invalid_argument(
        fmt::format("iterations {} must be >= 1 and warm-up {} >= 0", o.iterations, o.warmup));
  Runner r(backend, lp);
  HETPAR_RETURN_IF_ERROR(r.prepare());
  for (int i = 0; i < o.warmup; ++i) HETPAR_RETURN_IF_ERROR(r.iteration(false));
  for (int i = 0; i < o.iterations; ++i) HETPAR_RETURN_IF_ERROR(r.iteration(true));
  HETPAR_RETURN_IF_ERROR(r.census(o));
  return r.finish(o);
}

}  // namespace hetpar::executor
