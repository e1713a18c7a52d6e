#include "hetpar/planner/layout.h"

namespace hetpar::planner {

std::string_view to_string(Schedule s) {
  switch (s) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
    case Schedule::kZeroBubble:
      return "zb-h1";
  }
  return "?";
}

std::string_view to_string(models::Recompute r) {
  switch (r) {
    case models::Recompute::kNone:
      return "none";
    case models::Recompute::kSelective:
      return "selective";
    case models::Recompute::kFull:
      return "full";
  }
  return "?";
}

std::string_view to_string(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::kDelayed:
      return "delayed";
    case Fp8Recipe::kTensorwise:
      return "tensorwise";
  }
  return "?";
}

std::string_view to_string(CrossEntropy c) {
  switch (c) {
    case CrossEntropy::kUnfused:
      return "none";
    case CrossEntropy::kNative:
      return "native";
    case CrossEntropy::kTe:
      return "te";
  }
  return "?";
}

std::string_view to_string(GradReduceDtype d) {
  switch (d) {
    case GradReduceDtype::kDefault:
      return "default";
    case GradReduceDtype::kFp32:
      return "fp32";
    case GradReduceDtype::kBf16:
      return "bf16";
    case GradReduceDtype::kFp16:
      return "fp16";
  }
  return "?";
}

std::string_view to_string(CpComm c) {
  switch (c) {
    case CpComm::kP2P:
      return "p2p";
    case CpComm::kAllGather:
      return "all_gather";
  }
  return "?";
}

std::string_view to_string(Placement p) {
  switch (p) {
    case Placement::kHomogeneous:
      return "homogeneous";
    case Placement::kColocated:
      return "colocated";
    case Placement::kNonColocated:
      return "non_colocated";
  }
  return "?";
}

int64_t num_micro_batches(const Layout& l, int64_t global_batch) {
  return global_batch / (static_cast<int64_t>(l.dp) * l.micro_batch);
}

}  // namespace hetpar::planner
