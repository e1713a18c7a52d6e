#include "hetpar/executor/boundary_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "hetpar/hardware/precision.h"
#include "hetpar/planner/boundary.h"

namespace hetpar::executor {

using runtime::Buffer;
using runtime::DType;
using runtime::kComputeStream;

std::string describe(const BoundaryComm& c) {
  std::string ranks = fmt::format("{}", fmt::join(c.ranks, ","));
  if (c.p2p) return fmt::format("p2p {} -> {} {} B", c.ranks[0], c.ranks[1], c.bytes.count());
  return fmt::format("{} [{}]{} {} B", sim::to_string(c.kind), ranks,
                     c.root >= 0 ? fmt::format(" root {}", c.root) : "", c.bytes.count());
}

std::vector<BoundaryComm> lowered_boundary_comms(const sim::TaskGraph& g, int rank) {
  std::vector<BoundaryComm> out;
  for (int t = 0; t < g.num_tasks(); ++t) {
    const sim::Task& task = g.task(TaskId(t));
    if (g.label_text(task.label.category) != "boundary_comm") continue;
    BoundaryComm c;
    c.bytes = task.bytes;
    if (task.kind == sim::TaskKind::kP2P) {
      c.p2p = true;
      c.ranks = {task.src.value(), task.dst.value()};
    } else if (task.kind == sim::TaskKind::kCollective) {
      c.kind = task.collective;
      for (RankId r : g.group(task.group)) c.ranks.push_back(r.value());
      if (task.collective == sim::CollectiveKind::kBroadcast) c.root = task.root.value();
    } else {
      continue;
    }
    if (std::find(c.ranks.begin(), c.ranks.end(), rank) != c.ranks.end())
      out.push_back(std::move(c));
  }
  return out;
}

namespace {

constexpr uint64_t kActivationSeed = 1'000'000;
constexpr uint64_t kGradSeed = 2'000'000;
constexpr uint64_t kWeightSeed = 7;
constexpr int64_t kF = 32;  // columns of the LLM's first layer in the check

using Tensor = std::vector<float>;

class Check {
 public:
  Check(runtime::Backend& b, const planner::Scenario& s, const planner::Plan& p)
      : b_(b), s_(s), p_(p), E_(p.modules[0].layout), L_(p.layout) {}
  Result<BoundaryCheckResult> run();

 private:
  // Layout helpers.
  bool is_enc(int r) const { return r >= enc_off_ && r < enc_off_ + E_.tp * E_.dp; }
  int enc_replica(int r) const { return (r - enc_off_) / E_.tp; }
  int enc_rank(int e, int tt) const { return enc_off_ + e * E_.tp + tt; }
  int llm_group() const { return L_.tp * L_.cp; }
  bool is_llm0(int r) const { return r >= llm_off_ && r < llm_off_ + llm_group() * L_.dp; }
  int llm_replica(int r) const { return (r - llm_off_) / llm_group(); }
  int llm_cp(int r) const { return ((r - llm_off_) / L_.tp) % L_.cp; }
  int llm_rank(int d, int c, int t) const { return llm_off_ + t + L_.tp * (c + L_.cp * d); }
  // Row of encoder replica source_replica(d, i)'s step output holding row q of LLM
  // replica d's micro-batch i (boundary.h's data mapping).
  int64_t encoder_row(int d, int64_t i, int64_t q) const {
    const int64_t R = (i % bd_.llm_per_step) * bd_.llm_micro_batch + q;
    const int64_t c = bd_.llm_per_step * bd_.llm_micro_batch;
    if (bd_.fan_in > 1) return R % bd_.enc_micro_batch;
    if (bd_.fan_out > 1) return (d % bd_.fan_out) * c + R;
    return R;
  }
  int64_t sample(int e, int64_t t, int64_t row) const {
    return (e * bd_.enc_steps + t) * bd_.enc_micro_batch + row;
  }
  std::vector<int64_t> tokens(int c) const;
  // Colocated, LLM pp 1: the backward all-gather groups (boundary.h), {r0 + q*tp} over
  // (fan-out r) x cp members; none without fan-out and cp.
  std::vector<std::vector<int>> backward_groups() const;
  // The CP group of LLM replica d's leader (tp index 0 of stage 0).
  std::vector<int> cp_group(int d) const;
  Status gather_cp(const std::vector<int>& members, const Tensor& mine_full, int64_t rows,
                   Tensor& out);

  // Backend helpers (host tensors in and out).
  Result<Tensor> random(int64_t count, uint64_t seed);
  Result<runtime::Group> group(const std::vector<int>& ranks);
  Status p2p(int src, int dst, Tensor& data);
  Status broadcast(const std::vector<int>& ranks, int root, Tensor& data);
  Status all_gather(const std::vector<int>& ranks, const Tensor& send, Tensor& recv);
  Status all_reduce(const std::vector<int>& ranks, Tensor& data);
  Result<Buffer> upload(const Tensor& t);
  Status download(const Buffer& b, Tensor& t);
  void record(BoundaryComm c) { res_.comms.push_back(std::move(c)); }
  Bytes model_bytes(int64_t elements) const { return Bytes(elements * bpe_); }

  Status forward();
  Status llm_backward();
  Status backward();
  Status compare();

  runtime::Backend& b_;
  const planner::Scenario& s_;
  const planner::Plan& p_;
  const planner::Layout& E_;
  const planner::Layout& L_;
  planner::Boundary bd_;
  int rank_ = 0;
  int enc_off_ = 0, llm_off_ = 0;
  bool leaders_ = false;  // non-colocated or three-phase: leader P2P + broadcast
  int64_t V_ = 0, H_ = 0, seq_ = 0;
  int64_t bpe_ = 2;
  std::map<std::vector<int>, runtime::Group> groups_;
  std::vector<Tensor> enc_out_;     // per encoder step: enc_mb x V x H (encoder ranks)
  std::map<int64_t, Tensor> act_;   // per LLM micro-batch: llm_mb x V x H (LLM stage 0)
  std::map<int64_t, Tensor> dact_;  // per LLM micro-batch: its gradient, local tokens only
  std::vector<Tensor> enc_grad_;    // per encoder step: what arrived
  BoundaryCheckResult res_;
};

std::vector<int64_t> Check::tokens(int c) const {
  std::vector<int64_t> out;
  const int64_t cs = seq_ / (2 * L_.cp);
  for (int64_t v = 0; v < V_; ++v) {
    const int64_t chunk = v / cs;
    if (L_.cp == 1 || chunk == c || chunk == 2 * L_.cp - 1 - c) out.push_back(v);
  }
  return out;
}

std::vector<int> Check::cp_group(int d) const {
  std::vector<int> g;
  for (int q = 0; q < L_.cp; ++q) g.push_back(llm_rank(d, q, 0));
  return g;
}

// Member q holds, of `rows` samples, the tokens of CP rank q % cp of sibling replica q / cp;
// each packs its tokens, the all-gather concatenates, and `out` gets the members' samples
// one after another with every token in place.
Status Check::gather_cp(const std::vector<int>& members, const Tensor& mine_full, int64_t rows,
                        Tensor& out) {
  const int cp = L_.cp;
  size_t most = 0;
  for (int q = 0; q < cp; ++q) most = std::max(most, tokens(q).size());
  const auto m = static_cast<int64_t>(most);
  const std::vector<int64_t> mine = tokens(llm_cp(rank_));
  Tensor packed(static_cast<size_t>(rows * m * H_), 0.0f);
  for (int64_t x = 0; x < rows; ++x)
    for (size_t y = 0; y < mine.size(); ++y)
      std::copy_n(mine_full.begin() + (x * V_ + mine[y]) * H_, H_,
                  packed.begin() + (x * m + static_cast<int64_t>(y)) * H_);
  Tensor got;
  HETPAR_RETURN_IF_ERROR(all_gather(members, packed, got));
  const int n = static_cast<int>(members.size());
  out.assign(static_cast<size_t>(n / cp * rows * V_ * H_), 0.0f);
  for (int q = 0; q < n; ++q) {
    const std::vector<int64_t> tq = tokens(q % cp);
    for (int64_t x = 0; x < rows; ++x)
      for (size_t y = 0; y < tq.size(); ++y)
        std::copy_n(got.begin() + ((q * rows + x) * m + static_cast<int64_t>(y)) * H_, H_,
                    out.begin() + (((q / cp) * rows + x) * V_ + tq[y]) * H_);
  }
  return Status::ok();
}

std::vector<std::vector<int>> Check::backward_groups() const {
  std::vector<std::vector<int>> out;
  if (bd_.fan_out == 1 && L_.cp == 1) return out;
  const int n = (bd_.fan_out > 1 ? bd_.fan_out : 1) * L_.cp;
  const int world = E_.tp * E_.dp;
  for (int r0 = 0; r0 < world; ++r0) {
    if (r0 % (L_.tp * n) >= L_.tp) continue;
    std::vector<int> g;
    for (int q = 0; q < n; ++q) g.push_back(r0 + q * L_.tp);
    out.push_back(std::move(g));
  }
  return out;
}

Result<Tensor> Check::random(int64_t count, uint64_t seed) {
  HETPAR_ASSIGN_OR_RETURN(Buffer buf, b_.allocate(Bytes(count * 4)));
  HETPAR_RETURN_IF_ERROR(b_.fill_random(kComputeStream, buf, DType::kF32, count, seed, 1.0f));
  Tensor t(static_cast<size_t>(count));
  HETPAR_RETURN_IF_ERROR(download(buf, t));
  return t;
}

Result<Buffer> Check::upload(const Tensor& t) {
  HETPAR_ASSIGN_OR_RETURN(Buffer buf, b_.allocate(Bytes(std::max<int64_t>(4, 4 * t.size()))));
  if (!t.empty())
    HETPAR_RETURN_IF_ERROR(
        b_.copy_from_host(kComputeStream, std::as_bytes(std::span<const float>(t)), buf));
  return buf;
}

Status Check::download(const Buffer& b, Tensor& t) {
  if (t.empty()) return Status::ok();
  return b_.copy_to_host(kComputeStream, b, std::as_writable_bytes(std::span<float>(t)));
}

Result<runtime::Group> Check::group(const std::vector<int>& ranks) {
  auto it = groups_.find(ranks);
  if (it == groups_.end())
    return Status::internal(
        fmt::format("boundary check: group [{}] not created up front", fmt::join(ranks, ",")));
  return it->second;
}

Status Check::p2p(int src, int dst, Tensor& data) {
  if (rank_ != src && rank_ != dst) return Status::ok();
  const auto n = static_cast<int64_t>(data.size());
  record({.p2p = true, .ranks = {src, dst}, .bytes = model_bytes(n)});
  HETPAR_ASSIGN_OR_RETURN(Buffer buf, upload(data));
  if (rank_ == src) return b_.send(kComputeStream, buf, n, DType::kF32, dst);
  HETPAR_RETURN_IF_ERROR(b_.recv(kComputeStream, buf, n, DType::kF32, src));
  return download(buf, data);
}

Status Check::broadcast(const std::vector<int>& ranks, int root, Tensor& data) {
  if (std::find(ranks.begin(), ranks.end(), rank_) == ranks.end()) return Status::ok();
  const auto n = static_cast<int64_t>(data.size());
  record({.p2p = false,
          .kind = sim::CollectiveKind::kBroadcast,
          .ranks = ranks,
          .root = root,
          .bytes = model_bytes(n)});
  HETPAR_ASSIGN_OR_RETURN(runtime::Group g, group(ranks));
  HETPAR_ASSIGN_OR_RETURN(Buffer buf, upload(data));
  const int pos = static_cast<int>(std::find(ranks.begin(), ranks.end(), root) - ranks.begin());
  HETPAR_RETURN_IF_ERROR(b_.broadcast(kComputeStream, g, buf, n, DType::kF32, pos));
  return download(buf, data);
}

Status Check::all_gather(const std::vector<int>& ranks, const Tensor& send, Tensor& recv) {
  const auto n = static_cast<int64_t>(send.size());
  recv.assign(send.size() * ranks.size(), 0.0f);
  record({.p2p = false,
          .kind = sim::CollectiveKind::kAllGather,
          .ranks = ranks,
          .bytes = model_bytes(n * static_cast<int64_t>(ranks.size()))});
  HETPAR_ASSIGN_OR_RETURN(runtime::Group g, group(ranks));
  HETPAR_ASSIGN_OR_RETURN(Buffer in, upload(send));
  HETPAR_ASSIGN_OR_RETURN(Buffer out, upload(recv));
  HETPAR_RETURN_IF_ERROR(b_.all_gather(kComputeStream, g, in, out, n, DType::kF32));
  return download(out, recv);
}

Status Check::all_reduce(const std::vector<int>& ranks, Tensor& data) {
  HETPAR_ASSIGN_OR_RETURN(runtime::Group g, group(ranks));
  HETPAR_ASSIGN_OR_RETURN(Buffer in, upload(data));
  HETPAR_ASSIGN_OR_RETURN(Buffer out, upload(data));
  HETPAR_RETURN_IF_ERROR(
      b_.all_reduce(kComputeStream, g, in, out, static_cast<int64_t>(data.size()), DType::kF32));
  return download(out, data);
}

// Encoder outputs, then the boundary's forward: every rank runs the same loops, taking
// part in the communications that involve it (so members meet in the same order).
Status Check::forward() {
  const int64_t VH = V_ * H_;
  const int64_t emb = bd_.enc_micro_batch, lmb = bd_.llm_micro_batch;
  if (is_enc(rank_)) {
    const int e = enc_replica(rank_);
    for (int64_t t = 0; t < bd_.enc_steps; ++t) {
      Tensor out;
      for (int64_t q = 0; q < emb; ++q) {
        HETPAR_ASSIGN_OR_RETURN(Tensor x, random(VH, kActivationSeed + sample(e, t, q)));
        out.insert(out.end(), x.begin(), x.end());
      }
      enc_out_.push_back(std::move(out));
    }
  }
  if (leaders_) {
    for (int64_t i = 0; i < bd_.llm_steps; ++i)
      for (int d = 0; d < L_.dp; ++d) {
        const int64_t t = bd_.step_of(i);
        const int e = bd_.source_replica(d, i);
        const int enc_leader = enc_rank(e, 0), llm_leader = llm_rank(d, 0, 0);
        Tensor mb(static_cast<size_t>(lmb * VH), 0.0f);
        if (rank_ == enc_leader)
          for (int64_t q = 0; q < lmb; ++q)
            std::copy_n(enc_out_[t].begin() + encoder_row(d, i, q) * VH, VH, mb.begin() + q * VH);
        if (enc_leader != llm_leader) HETPAR_RETURN_IF_ERROR(p2p(enc_leader, llm_leader, mb));
        std::vector<int> members;
        for (int q = 0; q < llm_group(); ++q) members.push_back(llm_leader + q);
        if (llm_group() > 1) HETPAR_RETURN_IF_ERROR(broadcast(members, llm_leader, mb));
        if (is_llm0(rank_) && llm_replica(rank_) == d) act_[i] = std::move(mb);
      }
    return Status::ok();
  }
  // Colocated, LLM pp 1: every rank is an encoder rank and an LLM rank.
  const int64_t k = bd_.llm_per_step;
  const int64_t c = k * lmb;
  const int d_mine = llm_replica(rank_);
  for (int64_t t = 0; t < bd_.enc_steps; ++t) {
    Tensor step;  // this rank's LLM replica's c samples of step t
    if (bd_.fan_in > 1) {
      for (int d = 0; d < L_.dp; ++d)
        for (int tt = 0; tt < E_.tp; ++tt) {
          std::vector<int> members;
          for (int q = 0; q < bd_.fan_in; ++q) members.push_back(tt + E_.tp * (d * bd_.fan_in + q));
          if (std::find(members.begin(), members.end(), rank_) == members.end()) continue;
          HETPAR_RETURN_IF_ERROR(all_gather(members, enc_out_[t], step));
        }
    } else if (bd_.fan_out > 1) {  // narrow: this LLM replica's slice
      const int64_t first = (d_mine % bd_.fan_out) * c;
      step.assign(enc_out_[t].begin() + first * VH, enc_out_[t].begin() + (first + c) * VH);
    } else {
      step = enc_out_[t];
    }
    for (int64_t j = 0; j < k; ++j)
      act_[t * k + j] = Tensor(step.begin() + j * lmb * VH, step.begin() + (j + 1) * lmb * VH);
  }
  return Status::ok();
}

// The LLM's first-layer input gradient on stage-0 ranks: partial products per TP rank,
// summed by the TP all-reduce.
Status Check::llm_backward() {
  const int64_t lmb = bd_.llm_micro_batch;
  const int64_t fs = kF / L_.tp;
  HETPAR_ASSIGN_OR_RETURN(Tensor w, random(H_ * kF, kWeightSeed));  // [h][f]
  for (int64_t i = 0; i < bd_.llm_steps; ++i)
    for (int d = 0; d < L_.dp; ++d)
      for (int cp = 0; cp < L_.cp; ++cp) {
        std::vector<int> tp_group;
        for (int t = 0; t < L_.tp; ++t) tp_group.push_back(llm_rank(d, cp, t));
        if (std::find(tp_group.begin(), tp_group.end(), rank_) == tp_group.end()) continue;
        const int tp_i = (rank_ - llm_off_) % L_.tp;
        const std::vector<int64_t> tok = tokens(cp);
        const auto nt = static_cast<int64_t>(tok.size());
        const int64_t T = lmb * nt;
        // A = W[:, shard] (H x fs), B = dY[tokens, shard]^T (fs x T), C = A B (H x T),
        // column-major: C's column ti is the gradient of token ti, row-major [token][h].
        Tensor a(static_cast<size_t>(H_ * fs)), bm(static_cast<size_t>(fs * T));
        for (int64_t h = 0; h < H_; ++h)
          for (int64_t f = 0; f < fs; ++f) a[h + H_ * f] = w[h * kF + tp_i * fs + f];
        for (int64_t q = 0; q < lmb; ++q) {
          const int e = bd_.source_replica(d, i);
          const int64_t n = sample(e, bd_.step_of(i), encoder_row(d, i, q));
          HETPAR_ASSIGN_OR_RETURN(Tensor dy, random(V_ * kF, kGradSeed + n));  // [v][f]
          for (int64_t x = 0; x < nt; ++x)
            for (int64_t f = 0; f < fs; ++f)
              bm[f + fs * (q * nt + x)] = dy[tok[x] * kF + tp_i * fs + f];
        }
        Tensor cm(static_cast<size_t>(H_ * T), 0.0f);
        HETPAR_ASSIGN_OR_RETURN(Buffer ab, upload(a));
        HETPAR_ASSIGN_OR_RETURN(Buffer bb, upload(bm));
        HETPAR_ASSIGN_OR_RETURN(Buffer cb, upload(cm));
        runtime::GemmDesc g;
        g.m = H_;
        g.n = T;
        g.k = fs;
        g.dtype = DType::kF32;
        HETPAR_RETURN_IF_ERROR(b_.gemm(kComputeStream, g, ab, bb, cb));
        HETPAR_RETURN_IF_ERROR(download(cb, cm));
        if (L_.tp > 1) HETPAR_RETURN_IF_ERROR(all_reduce(tp_group, cm));
        Tensor grad(static_cast<size_t>(lmb * V_ * H_), 0.0f);
        for (int64_t q = 0; q < lmb; ++q)
          for (int64_t x = 0; x < nt; ++x)
            std::copy_n(cm.begin() + (q * nt + x) * H_, H_, grad.begin() + (q * V_ + tok[x]) * H_);
        dact_[i] = std::move(grad);
      }
  return Status::ok();
}

// The boundary's backward (boundary.h): the summed gradient moves back, never re-added.
Status Check::backward() {
  const int64_t VH = V_ * H_;
  const int64_t emb = bd_.enc_micro_batch, lmb = bd_.llm_micro_batch;
  if (is_enc(rank_))
    enc_grad_.assign(static_cast<size_t>(bd_.enc_steps), Tensor(static_cast<size_t>(emb * VH)));
  if (leaders_) {
    for (int64_t i = 0; i < bd_.llm_steps; ++i)
      for (int d = 0; d < L_.dp; ++d) {
        const int64_t t = bd_.step_of(i);
        const int e = bd_.source_replica(d, i);
        const int enc_leader = enc_rank(e, 0), llm_leader = llm_rank(d, 0, 0);
        Tensor mb(static_cast<size_t>(lmb * VH), 0.0f);
        if (L_.cp > 1) {  // the leader gathers the CP chunks first (boundary.h)
          const std::vector<int> members = cp_group(d);
          if (std::find(members.begin(), members.end(), rank_) != members.end())
            HETPAR_RETURN_IF_ERROR(gather_cp(members, dact_[i], lmb, mb));
        } else if (rank_ == llm_leader) {
          mb = dact_[i];
        }
        if (enc_leader != llm_leader) HETPAR_RETURN_IF_ERROR(p2p(llm_leader, enc_leader, mb));
        std::vector<int> members;
        for (int q = 0; q < E_.tp; ++q) members.push_back(enc_rank(e, q));
        if (E_.tp > 1) HETPAR_RETURN_IF_ERROR(broadcast(members, enc_leader, mb));
        if (is_enc(rank_) && enc_replica(rank_) == e)
          for (int64_t q = 0; q < lmb; ++q)
            std::copy_n(mb.begin() + q * VH, VH, enc_grad_[t].begin() + encoder_row(d, i, q) * VH);
      }
    return Status::ok();
  }
  const int64_t k = bd_.llm_per_step;
  const int64_t c = k * lmb;
  for (int64_t t = 0; t < bd_.enc_steps; ++t) {
    Tensor step;  // this rank's LLM replica's step gradient (c samples), its CP tokens
    for (int64_t j = 0; j < k; ++j)
      step.insert(step.end(), dact_[t * k + j].begin(), dact_[t * k + j].end());
    Tensor full;  // the gradient this rank's encoder replica needs (or its LLM replica's)
    if (bd_.fan_out > 1 || L_.cp > 1) {
      // Gathered over the LLM ranks with this TP index that hold parts of it (boundary.h).
      for (const std::vector<int>& members : backward_groups())
        if (std::find(members.begin(), members.end(), rank_) != members.end())
          HETPAR_RETURN_IF_ERROR(gather_cp(members, step, c, full));
      if (bd_.fan_out > 1) {  // the encoder replica's whole step
        enc_grad_[t] = full;
        continue;
      }
    } else {
      full = step;
    }
    // Narrow to this encoder replica's rows (fan-in), or take it whole (equal).
    const int64_t first = bd_.fan_in > 1 ? (enc_replica(rank_) % bd_.fan_in) * emb : 0;
    enc_grad_[t].assign(full.begin() + first * VH, full.begin() + (first + emb) * VH);
  }
  return Status::ok();
}

Status Check::compare() {
  const int64_t VH = V_ * H_;
  if (is_llm0(rank_)) {
    const int d = llm_replica(rank_);
    const std::vector<int64_t> tok = tokens(llm_cp(rank_));
    for (const auto& [i, mb] : act_)
      for (int64_t q = 0; q < bd_.llm_micro_batch; ++q) {
        const int e = bd_.source_replica(d, i);
        const int64_t n = sample(e, bd_.step_of(i), encoder_row(d, i, q));
        HETPAR_ASSIGN_OR_RETURN(Tensor ref, random(VH, kActivationSeed + n));
        for (int64_t v : tok)
          for (int64_t h = 0; h < H_; ++h) {
            ++res_.activation_values;
            const float got = mb[q * VH + v * H_ + h], want = ref[v * H_ + h];
            if (std::memcmp(&got, &want, sizeof got) != 0) ++res_.activation_mismatches;
          }
      }
  }
  if (!is_enc(rank_) || s_.workload.frozen_encoders) return Status::ok();
  HETPAR_ASSIGN_OR_RETURN(Tensor w, random(H_ * kF, kWeightSeed));
  const int e = enc_replica(rank_);
  for (int64_t t = 0; t < bd_.enc_steps; ++t)
    for (int64_t q = 0; q < bd_.enc_micro_batch; ++q) {
      HETPAR_ASSIGN_OR_RETURN(Tensor dy, random(V_ * kF, kGradSeed + sample(e, t, q)));
      for (int64_t v = 0; v < V_; ++v)
        for (int64_t h = 0; h < H_; ++h) {
          double ref = 0;
          for (int64_t f = 0; f < kF; ++f)
            ref += static_cast<double>(dy[v * kF + f]) * static_cast<double>(w[h * kF + f]);
          const double got = enc_grad_[t][q * VH + v * H_ + h];
          ++res_.gradient_values;
          res_.max_gradient_error =
              std::max(res_.max_gradient_error, std::abs(got - ref) / std::max(std::abs(ref), 1.0));
        }
    }
  return Status::ok();
}

Result<BoundaryCheckResult> Check::run() {
  if (p_.placement == planner::Placement::kHomogeneous || p_.modules.size() != 1)
    return Status::invalid_argument(
        "the boundary check needs a colocated or non-colocated plan with one encoder");
  const int world = s_.cluster.total_gpus();
  if (b_.info().world != world)
    return Status::invalid_argument(
        fmt::format("the plan needs {} ranks but {} processes run it (mpirun -np {})", world,
                    b_.info().world, world));
  rank_ = b_.info().rank;
  bd_ = planner::make_boundary(s_, p_, p_.modules[0]);
  const bool colocated = p_.placement == planner::Placement::kColocated;
  leaders_ = !colocated || L_.pp > 1;
  enc_off_ = colocated ? 0 : p_.modules[0].first_rank;
  llm_off_ = colocated ? 0 : p_.llm_first_rank;
  V_ = bd_.tokens_per_sample;
  H_ = std::get<models::LlmSpec>(s_.model.modules[s_.model.llm_index()].spec).block.hidden;
  seq_ = s_.workload.seq_len;
  bpe_ = hardware::bytes_per_element(s_.workload.precision);
  if (kF % L_.tp != 0)
    return Status::invalid_argument(fmt::format("llm tp {} must divide {}", L_.tp, kF));
  // Every group any rank uses, created by every rank in one order.
  std::vector<std::vector<int>> needed;
  for (int d = 0; d < L_.dp; ++d)
    for (int c = 0; c < L_.cp; ++c) {
      std::vector<int> g;
      for (int t = 0; t < L_.tp; ++t) g.push_back(llm_rank(d, c, t));
      needed.push_back(g);
    }
  if (leaders_) {
    for (int d = 0; d < L_.dp; ++d) {
      std::vector<int> g;
      for (int q = 0; q < llm_group(); ++q) g.push_back(llm_rank(d, 0, 0) + q);
      needed.push_back(g);
    }
    for (int e = 0; e < E_.dp; ++e) {
      std::vector<int> g;
      for (int q = 0; q < E_.tp; ++q) g.push_back(enc_rank(e, q));
      needed.push_back(g);
    }
    for (int d = 0; d < L_.dp; ++d) needed.push_back(cp_group(d));
  } else {
    for (int d = 0; d < L_.dp && bd_.fan_in > 1; ++d)
      for (int tt = 0; tt < E_.tp; ++tt) {
        std::vector<int> g;
        for (int q = 0; q < bd_.fan_in; ++q) g.push_back(tt + E_.tp * (d * bd_.fan_in + q));
        needed.push_back(g);
      }
    for (const std::vector<int>& g : backward_groups()) needed.push_back(g);
  }
  for (const std::vector<int>& g : needed) {
    if (g.size() < 2 || groups_.contains(g)) continue;
    HETPAR_ASSIGN_OR_RETURN(runtime::Group grp, b_.make_group(g));
    groups_.emplace(g, std::move(grp));
  }
  HETPAR_RETURN_IF_ERROR(forward());
  if (!s_.workload.frozen_encoders) {
    HETPAR_RETURN_IF_ERROR(llm_backward());
    HETPAR_RETURN_IF_ERROR(backward());
  }
  HETPAR_RETURN_IF_ERROR(compare());
  HETPAR_RETURN_IF_ERROR(b_.barrier());
  return res_;
}

}  // namespace

Result<BoundaryCheckResult> check_boundary(runtime::Backend& b, const planner::Scenario& s,
                                           const planner::Plan& p) {
  return Check(b, s, p).run();
}

}  // namespace hetpar::executor
