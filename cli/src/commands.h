// The hetpar subcommands. Each takes its parsed options and returns the process exit
// code (see exit_code_for); all real work happens in the libraries.
#pragma once

#include <string>

#include "hetpar/core/status.h"

namespace hetpar::cli {

struct InspectOptions {
  std::string scenario_path;
  bool json = false;
};
int run_inspect(const InspectOptions& opts);

struct SimulateOptions {
  std::string path;  // scenario with a "plan" section
  bool json = false;
  std::string trace_path;  // Perfetto / Chrome trace output, "" = none
  /// A profile (built-in name or file, e.g. from `hetpar calibrate`) that replaces the
  /// cluster's; "" = the scenario's own. The cluster must have a single node group.
  std::string profile;
  /// Also print the per-op cost of one LLM layer on one rank (text output only).
  bool ops = false;
  /// Simulate every rank instead of one representative per class of alike ranks (lower.h's
  /// symmetry reduction): slower, for checking the reduction on a plan.
  bool every_rank = false;
};
/// Exit 3 when the plan is infeasible (the reason goes to stderr).
int run_simulate(const SimulateOptions& opts);

struct CompareOptions {
  std::string path;  // scenario with a "plans" section
  bool json = false;
};
/// Exit 3 when no plan is feasible.
int run_compare(const CompareOptions& opts);

struct PlanOptions {
  std::string path;  // scenario, optionally with a "search" section
  bool json = false;
  std::string out;  // the winner's plan file; "" = <scenario stem>.plan.json here
  int threads = 0;  // 0 = every core
  int top = 0;      // 0 = the scenario's search.top_k
};
/// Exit 3 when no plan is feasible (the most common reasons go to stderr).
int run_plan(const PlanOptions& opts);

struct ExportOptions {
  std::string path;       // scenario with a "plan" section (or "plans" with plan_name)
  std::string target;     // exporter::parse_target spelling
  std::string plan_name;  // "" = the "plan" section
  std::string out_dir;    // "" = print to stdout
};
/// Exit 2 for an unknown target or a plan the target cannot express, 3 for an infeasible
/// plan; nothing is written then.
int run_export(const ExportOptions& opts);

struct ValidationOptions {
  std::string dir = "validation/runs";
  bool json = false;
  double max_mean_error = 0;  // fractions; 0 = no bound
  double max_error = 0;
  int threads = 0;  // runs predicted at once; 0 = every core
};
/// Exit 4 when a bound is given and missed.
int run_validation(const ValidationOptions& opts);

struct ValidateOptions {
  std::string path;     // scenario with a "plan" section
  std::string profile;  // hardware profile for every node ("" = the scenario's)
  int iterations = 5;   // timed
  int warmup = 2;
  std::string backend = "cpu";
  std::string json_path;  // record output, "" = none
  int census_reps = 3;    // kernel census passes (executor.h), 0 = none
};
/// Under mpirun -np WORLD. Exit 2 for a world size other than the plan's, 3 when the plan is
/// infeasible or does not fit the device memory.
int run_validate(const ValidateOptions& opts);

struct CalibrateOptions {
  std::string backend = "cpu";  // "cpu" | "cuda"
  bool quick = false;
  std::string out;   // "" = calibrated-<backend>.json
  std::string base;  // profile supplying datasheet peaks and unmeasured figures
  std::string name;  // profile name, "" = calibrated-<backend>
  /// Scenario whose plan's GEMM shapes (and workload dtype) the sweep adds, "" = none.
  std::string shapes_from;
  int max_shapes = 48;   // of those, the ones with the most FLOPs
  double sustain_s = 0;  // > 0: GEMMs timed at the steady state (SweepPlan::gemm_sustain_s)
};
/// Run under mpirun; every rank sweeps, rank 0 fits, prints and writes.
int run_calibrate(const CalibrateOptions& opts);

struct CatalogOptions {
  bool json = false;
};
int run_models(const CatalogOptions& opts);
int run_hardware(const CatalogOptions& opts);

/// 2 for bad input (invalid argument, not found, unreadable file), 1 otherwise.
int exit_code_for(const Status& s);
/// Prints `hetpar: <message>` to stderr and returns exit_code_for(s).
int report_error(const Status& s);

}  // namespace hetpar::cli
