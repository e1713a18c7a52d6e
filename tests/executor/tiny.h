// The tiny vision-language scenarios of tests/data/executor (1, 2 and 4 ranks) that the
// executor tests run.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "hetpar/planner/scenario.h"

namespace hetpar::executor::testing {

inline planner::Scenario tiny(int world) {
  auto s = planner::load_scenario(
      fmt::format("{}/tests/data/executor/tiny-vlm-{}.json", HETPAR_SOURCE_DIR, world));
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return *s;
}

}  // namespace hetpar::executor::testing
