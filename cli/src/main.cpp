// hetpar command-line entry point: parses arguments with CLI11 and dispatches to one
// subcommand. Exit codes: 0 success, 2 bad input or usage, 1 internal failure.
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
  if (*cmd_models) return run_models(models);
  if (*cmd_hardware) return run_hardware(hardware);
  return 2;
}
