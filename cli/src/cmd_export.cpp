// `hetpar export FILE --to TARGET [--plan NAME] [--out DIR]`: writes what a trainer needs
// to run the scenario's plan (docs/export.md). Without --out the files go to stdout, each
// after a "==> PATH <==" line; with --out they are written into DIR, each atomically, and
// none is left behind when one fails.
#include <fmt/format.h>

#include <filesystem>
#include <system_error>

#include "commands.h"
#include "hetpar/core/file_io.h"
#include "hetpar/export/export.h"
#include "hetpar/planner/lower.h"

namespace hetpar::cli {

namespace {

namespace fs = std::filesystem;

Result<planner::Plan> chosen_plan(const planner::Scenario& s, const ExportOptions& opts) {
  if (opts.plan_name.empty()) {
    if (!s.plan)
      return Status::invalid_argument(fmt::format(
          "{}: plan: missing required object (export needs a \"plan\" section, or --plan NAME "
          "of the \"plans\" section; see docs/scenario.md)",
          opts.path));
    return *s.plan;
  }
  std::string names;
  for (const auto& [name, plan] : s.plans) {
    if (name == opts.plan_name) return plan;
    names += (names.empty() ? "" : ", ") + name;
  }
  return Status::invalid_argument(
      fmt::format("{}: plans: no plan named \"{}\" (the section has: {})", opts.path,
                  opts.plan_name, names.empty() ? "none" : names));
}

// Writes every file under `dir`; on a failure removes the ones already written.
Status write_all(const std::string& dir, const std::vector<exporter::ExportFile>& files) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return Status::io_error(fmt::format("{}: cannot create directory: {}", dir, ec.message()));
  std::vector<fs::path> written;
  for (const exporter::ExportFile& f : files) {
    const fs::path path = fs::path(dir) / f.path;
    Status st = write_file_atomically(path.string(), f.contents);
    if (st.is_ok() && path.extension() == ".sh") {
      fs::permissions(path, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec,
                      fs::perm_options::add, ec);
      if (ec) st = Status::io_error(fmt::format("{}: chmod: {}", path.string(), ec.message()));
    }
    if (!st.is_ok()) {
      for (const fs::path& p : written) fs::remove(p, ec);
      fs::remove(path, ec);
      return st;
    }
    written.push_back(path);
  }
  return Status::ok();
}

}  // namespace

int run_export(const ExportOptions& opts) {
  const std::optional<exporter::Target> target = exporter::parse_target(opts.target);
  if (!target)
    return report_error(Status::invalid_argument(fmt::format(
        "--to: unknown target \"{}\" (valid: {})", opts.target, exporter::target_list())));
  auto scenario = planner::load_scenario(opts.path);
  if (!scenario.is_ok()) return report_error(scenario.status());
  auto plan = chosen_plan(*scenario, opts);
  if (!plan.is_ok()) return report_error(plan.status());
  if (std::string why = planner::infeasibility(*scenario, *plan); !why.empty()) {
    fmt::print(stderr, "hetpar: plan is infeasible: {}\n", why);
    return 3;
  }
  auto files = exporter::export_plan(*scenario, *plan, *target);
  if (!files.is_ok()) return report_error(files.status());
  if (opts.out_dir.empty()) {
    for (const exporter::ExportFile& f : *files) fmt::print("==> {} <==\n{}", f.path, f.contents);
    return 0;
  }
  if (Status st = write_all(opts.out_dir, *files); !st.is_ok()) return report_error(st);
  for (const exporter::ExportFile& f : *files)
    fmt::print("wrote {}\n", (fs::path(opts.out_dir) / f.path).string());
  return 0;
}

}  // namespace hetpar::cli
