// The cpu backend: host memory, Eigen GEMMs (fp32 arithmetic whatever the dtype), the
// reference attention and elementwise kernels of cpu_kernels.h, MPI for collectives and
// P2P (one MPI communicator per group). Every stream runs synchronously on the calling
// thread, in issue order; an event is the wall-clock time at which it was recorded, i.e.
// when the work issued before it finished. Internal to runtime/.
#pragma once

#include <memory>

#include "hetpar/runtime/backend.h"

namespace hetpar::runtime {

Result<std::unique_ptr<Backend>> make_cpu_backend();

}  // namespace hetpar::runtime
