// hetpar command-line entry point: parses arguments with CLI11 and dispatches to one
// subcommand. Exit codes: 0 success, 1 internal failure, 2 bad input or usage, 3 an
// infeasible plan, 4 validation bounds missed.
#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
  using namespace hetpar::cli;
  CLI::App app{"hetpar: plan and predict heterogeneous-parallel training of multimodal LLMs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hetpar 0.1.0");

  InspectOptions inspect;
  auto* cmd_inspect =
      app.add_subcommand("inspect",
                         "Parameters, FLOPs and activation bytes per module of a scenario's model, "
                         "and the cluster's peak numbers");
  cmd_inspect->add_option("scenario", inspect.scenario_path, "Scenario JSON file")->required();
  cmd_inspect->add_flag("--json", inspect.json, "Print JSON instead of tables");

  SimulateOptions simulate;
  auto* cmd_simulate =
      app.add_subcommand("simulate",
                         "Predict one training iteration of a scenario's plan: time, throughput, "
                         "TFLOPS/GPU, memory, bubbles, exposed communication");
  cmd_simulate->add_option("file", simulate.path, "Scenario JSON with a \"plan\" section")
      ->required();
  cmd_simulate->add_flag("--json", simulate.json, "Print JSON instead of text");
  cmd_simulate->add_option("--trace", simulate.trace_path,
                           "Write the iteration timeline as a Perfetto/Chrome trace JSON");
  cmd_simulate->add_flag("--ops", simulate.ops,
                         "Also print each op of one LLM layer: time per pass and achieved rate");
  cmd_simulate->add_flag("--every-rank", simulate.every_rank,
                         "Simulate every rank, not one representative per class of alike ranks "
                         "(slower; checks the symmetry reduction)");
  cmd_simulate->add_option("--profile", simulate.profile,
                           "Hardware profile (built-in name or file, e.g. from `hetpar "
                           "calibrate`) replacing the cluster's");

  CompareOptions compare;
  auto* cmd_compare = app.add_subcommand(
      "compare",
      "Predict each named plan of a scenario's \"plans\" section (e.g. homogeneous, "
      "colocated, non-colocated) and compare them side by side");
  cmd_compare->add_option("file", compare.path, "Scenario JSON with a \"plans\" section")
      ->required();
  cmd_compare->add_flag("--json", compare.json, "Print JSON");

  PlanOptions plan;
  auto* cmd_plan = app.add_subcommand(
      "plan",
      "Search the layouts and placements (homogeneous, colocated, non-colocated) of a "
      "scenario for the fastest plan, and write it as a plan file");
  cmd_plan
      ->add_option("scenario", plan.path,
                   "Scenario JSON (an optional \"search\" section "
                   "constrains the search)")
      ->required();
  cmd_plan->add_flag("--json", plan.json, "Print JSON");
  cmd_plan->add_option("--out", plan.out,
                       "Where to write the winner (default: <scenario stem>.plan.json here)");
  cmd_plan->add_option("--threads", plan.threads, "Threads (default: every core)")
      ->check(CLI::Range(1, 1024));
  cmd_plan->add_option("--top", plan.top, "Plans in the ranked table (default: search.top_k, 5)")
      ->check(CLI::Range(1, 1000));

  ExportOptions export_opts;
  auto* cmd_export = app.add_subcommand(
      "export",
      "Write what a trainer needs to run a scenario's plan: launch flags, config files and a "
      "launch script (megatron, megatron-mimo, megatron-bridge, torchtitan, deepspeed, "
      "nanotron); refuses what the trainer cannot express");
  cmd_export->add_option("file", export_opts.path, "Scenario JSON with a \"plan\" section")
      ->required();
  cmd_export
      ->add_option("--to", export_opts.target,
                   "Target trainer: megatron, megatron-mimo, megatron-bridge, torchtitan, "
                   "deepspeed or nanotron")
      ->required();
  cmd_export->add_option("--plan", export_opts.plan_name,
                         "Export this plan of the \"plans\" section instead of \"plan\"");
  cmd_export->add_option("--out", export_opts.out_dir,
                         "Write the files into this directory (default: print them)");

  ValidationOptions validation;
  auto* cmd_validation =
      app.add_subcommand("validation",
                         "Predict the published, measured training runs of validation/runs and "
                         "print predicted vs measured");
  cmd_validation->add_option("dir", validation.dir, "Directory of run files")
      ->capture_default_str();
  cmd_validation->add_flag("--json", validation.json, "Print JSON");
  cmd_validation->add_option("--max-mean-error", validation.max_mean_error,
                             "Fail (exit 4) when the mean |error| exceeds this fraction");
  cmd_validation->add_option("--max-error", validation.max_error,
                             "Fail (exit 4) when any |error| exceeds this fraction");
  cmd_validation
      ->add_option("--threads", validation.threads, "Runs predicted at once (default: every core)")
      ->check(CLI::Range(1, 1024));

  ValidateOptions validate;
  auto* cmd_validate = app.add_subcommand(
      "validate",
      "Run a scenario's plan for real (under mpirun -np WORLD) and print measured vs predicted: "
      "iteration time, TFLOPS/GPU, each phase");
  cmd_validate->add_option("file", validate.path, "Scenario JSON with a \"plan\" section")
      ->required();
  cmd_validate->add_option("--profile", validate.profile,
                           "Hardware profile for every node (e.g. from `hetpar calibrate`)");
  cmd_validate->add_option("--iterations", validate.iterations, "Timed iterations")
      ->capture_default_str();
  cmd_validate->add_option("--warmup", validate.warmup, "Warm-up iterations")
      ->capture_default_str();
  cmd_validate->add_option("--backend", validate.backend, "cpu or cuda")->capture_default_str();
  cmd_validate->add_option("--json", validate.json_path, "Write the record as JSON to this file");
  cmd_validate
      ->add_option("--kernel-census", validate.census_reps,
                   "Passes of the kernel census: each kernel timed alone, by kind, against the "
                   "profile (0 = none)")
      ->capture_default_str();

  CalibrateOptions calibrate;
  auto* cmd_calibrate = app.add_subcommand(
      "calibrate",
      "Measure this machine (GEMMs, attention, memory, P2P, collectives) and write a hardware "
      "profile; run under `mpirun -np N`, one process per device");
  cmd_calibrate->add_option("--backend", calibrate.backend, "Device backend")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd_calibrate->add_flag("--quick", calibrate.quick,
                          "Small grid: well under a minute on the cpu backend");
  cmd_calibrate->add_option("--out", calibrate.out,
                            "Profile JSON to write (default calibrated-<backend>.json)");
  cmd_calibrate->add_option("--base", calibrate.base,
                            "Profile (built-in name or file) supplying datasheet peaks and what "
                            "the run cannot measure (e.g. inter-node figures on one host); "
                            "cuda default: the built-in profile of the GPU's name");
  cmd_calibrate->add_option("--name", calibrate.name, "Name of the written profile");
  cmd_calibrate->add_option("--shapes-from", calibrate.shapes_from,
                            "Scenario with a plan: also measure the GEMM shapes its ranks run, "
                            "in its workload's dtype, so the profile is exact at them");
  cmd_calibrate
      ->add_option("--max-shapes", calibrate.max_shapes,
                   "With --shapes-from: at most this many shapes, most FLOPs first")
      ->capture_default_str();
  cmd_calibrate
      ->add_option("--sustain", calibrate.sustain_s,
                   "Seconds each GEMM runs back to back before it is timed (back to back, no "
                   "cache flush): the rate at the power limit a training step sees, not a "
                   "burst; 0 = burst")
      ->check(CLI::Range(0.0, 60.0))
      ->capture_default_str();

  CatalogOptions models;
  auto* cmd_models = app.add_subcommand("models", "List the model zoo");
  cmd_models->add_flag("--json", models.json, "Print JSON");

  CatalogOptions hardware;
  auto* cmd_hardware = app.add_subcommand("hardware", "List the built-in hardware profiles");
  cmd_hardware->add_flag("--json", hardware.json, "Print JSON");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (*cmd_inspect) return run_inspect(inspect);
  if (*cmd_simulate) return run_simulate(simulate);
  if (*cmd_compare) return run_compare(compare);
  if (*cmd_plan) return run_plan(plan);
  if (*cmd_export) return run_export(export_opts);
  if (*cmd_validation) return run_validation(validation);
  if (*cmd_validate) return run_validate(validate);
  if (*cmd_calibrate) return run_calibrate(calibrate);
  if (*cmd_models) return run_models(models);
  if (*cmd_hardware) return run_hardware(hardware);
  return 2;
}
