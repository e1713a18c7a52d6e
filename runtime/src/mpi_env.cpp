// MPI initialisation, finalisation and the reduction ops for 16- and 8-bit floats.
#include "mpi_env.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "hetpar/runtime/host_data.h"

namespace hetpar::runtime {
namespace {

// inout[i] = in[i] + inout[i] for values of type T, in fp32, rounded back.
template <DType T>
void sum_op(void* in, void* inout, int* len, MPI_Datatype*) {
  constexpr int kChunk = 1024;
  const int es = dtype_bytes(T);
  float a[kChunk], b[kChunk];
  for (int i = 0; i < *len; i += kChunk) {
    int n = std::min(kChunk, *len - i);
    auto* x = static_cast<std::byte*>(in) + static_cast<size_t>(i) * es;
    auto* y = static_cast<std::byte*>(inout) + static_cast<size_t>(i) * es;
    to_float(T, x, a, n);
    to_float(T, y, b, n);
    for (int j = 0; j < n; ++j) b[j] += a[j];
    from_float(T, b, y, n);
  }
}

// Whether a launcher (mpirun/mpiexec, srun with PMI/PMIx) started this process.
bool under_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

class MpiState {
 public:
  MpiState() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      if (!under_launcher()) {
        // A singleton (world of one) never spawns nor talks to peers: spare Open MPI's
        // helper daemon and its UCX start-up (0.6 of 0.9 s here). Users' settings win.
        setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
        setenv("OMPI_MCA_pml", "ob1", 0);
        // Every isolated singleton on a host has job family 0, so all share the session
        // directory <tmp>/ompi.<host>.<uid>/jf.0, and one finishing removes it while another
        // starts (mkdir ENOENT in MPI_Init, seen when ctest runs tests in parallel). Give
        // this process its own session-directory base unless the user chose one.
        if (std::getenv("OMPI_MCA_orte_tmpdir_base") == nullptr) {
          std::error_code ec;
          std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
          if (ec) tmp = "/tmp";
          std::string templ = (tmp / "hetpar-mpi-XXXXXX").string();
          if (mkdtemp(templ.data()) != nullptr) {
            session_base_ = templ;
            setenv("OMPI_MCA_orte_tmpdir_base", templ.c_str(), 1);
          }
        }
      }
      int provided = 0;
      int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      if (rc != MPI_SUCCESS) {
        error_ = Status::unavailable("MPI_Init_thread failed");
        remove_session_base();
        return;
      }
      owns_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &world_.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_.size);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_.rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &world_.local_rank);
    MPI_Comm_size(local, &world_.local_size);
    MPI_Comm_free(&local);
    int leader = world_.local_rank == 0 ? 1 : 0;
    MPI_Allreduce(&leader, &world_.hosts, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    world_.version.assign(version, static_cast<size_t>(len));
    if (auto nl = world_.version.find_first_of("\n,"); nl != std::string::npos) {
      world_.version.resize(nl);
    }
    MPI_Op_create(&sum_op<DType::kBf16>, 1, &sum_bf16_);
    MPI_Op_create(&sum_op<DType::kF16>, 1, &sum_f16_);
    MPI_Op_create(&sum_op<DType::kF8E4M3>, 1, &sum_f8_);
  }
  ~MpiState() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (error_.is_ok() && !finalized) {
      MPI_Op_free(&sum_bf16_);
      MPI_Op_free(&sum_f16_);
      MPI_Op_free(&sum_f8_);
      if (owns_) MPI_Finalize();
    }
    remove_session_base();
  }
  MpiState(const MpiState&) = delete;
  MpiState& operator=(const MpiState&) = delete;

  const Status& error() const { return error_; }
  const MpiWorld& world() const { return world_; }
  MPI_Op sum(DType t) const {
    switch (t) {
      case DType::kF32:
        return MPI_SUM;
      case DType::kBf16:
        return sum_bf16_;
      case DType::kF16:
        return sum_f16_;
      case DType::kF8E4M3:
        return sum_f8_;
    }
    return MPI_OP_NULL;
  }

 private:
  void remove_session_base() {
    if (session_base_.empty()) return;
    std::error_code ec;  // best effort: a leftover empty directory in /tmp is harmless
    std::filesystem::remove_all(session_base_, ec);
    session_base_.clear();
  }

  Status error_;
  bool owns_ = false;
  std::string session_base_;  // this singleton's Open MPI session-directory base, if made
  MpiWorld world_;
  MPI_Op sum_bf16_ = MPI_OP_NULL, sum_f16_ = MPI_OP_NULL, sum_f8_ = MPI_OP_NULL;
};

MpiState& state() {
  static MpiState s;  // constructed once (thread-safe), destroyed (MPI_Finalize) at exit
  return s;
}

}  // namespace

Result<const MpiWorld*> mpi_world() {
  const MpiState& s = state();
  if (!s.error().is_ok()) return s.error();
  return &s.world();
}

Status mpi_check(int rc, std::string_view what) {
  if (rc == MPI_SUCCESS) return Status::ok();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return Status::internal(fmt::format("{}: {}", what, std::string_view(msg, len)));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kBf16:
    case DType::kF16:
      return MPI_UINT16_T;
    case DType::kF8E4M3:
      return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_sum(DType t) {
  return state().sum(t);
}

}  // namespace hetpar::runtime
