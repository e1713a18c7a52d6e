// The process's MPI world, shared by both backends: initialised once per process on first
// use (MPI_Init_thread, funneled), finalised at exit unless someone else initialised MPI.
// Process-wide by nature (MPI is), hence the one static inside mpi_world(). A process run
// without mpirun is a world of one (MPI singleton init). Internal to runtime/.
#pragma once

#include <mpi.h>

#include <string>
#include <string_view>

#include "hetpar/core/status.h"
#include "hetpar/runtime/backend.h"

namespace hetpar::runtime {

struct MpiWorld {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes on this host
  int local_size = 1;
  int hosts = 1;
  std::string version;  // MPI_Get_library_version, first line
};

/// The world, initialising MPI on the first call. Errors when MPI cannot start.
Result<const MpiWorld*> mpi_world();

/// An MPI return code as a Status ("MPI_Allreduce: <MPI's message>").
Status mpi_check(int rc, std::string_view what);

/// The MPI datatype of one element of `t` and the sum over it (user-defined ops for bf16,
/// fp16 and fp8 that add in fp32 and round back, so the wire carries the real bytes).
/// REQUIRES: mpi_world() succeeded.
MPI_Datatype mpi_type(DType t);
MPI_Op mpi_sum(DType t);

}  // namespace hetpar::runtime
