// `cohort bench recompute` end to end (issue 46, item 2), on a small GPT: one RESULT line per mode
// and one ratio line per mode after none; the blocks' activation bytes it measures on the heap agree
// with nn/gpt_memory.h's count within 2% (so neither the formula nor the measurement drifts), and
// full keeps fewer bytes than selective, selective fewer than none.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <string>

#include "tests/support/process.h"

namespace {

using cohort::testing::runCommand;
using cohort::testing::runfile;

// The value of `key=` in `line`.
double field(const std::string& line, const std::string& key) {
  std::smatch m;
  const std::regex pattern(" " + key + "=([-0-9.e+]+)");
  if (!std::regex_search(line, m, pattern)) {
    ADD_FAILURE() << "no " << key << " in " << line;
    return 0;
  }
  return std::stod(m[1].str());
}

TEST(RecomputeBench, MeasuresWhatTheFormulaCounts) {
  const auto r = runCommand({runfile("cli/cohort"), "bench", "recompute", "--layers", "3", "--dim", "64", "--heads",
                             "4", "--vocab", "96", "--ctx", "32", "--batch-size", "2", "--steps", "2"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  std::map<std::string, std::string> lines;
  const std::regex mode("RESULT bench=(recompute|recompute_ratio) mode=([a-z]+) [^\n]*");
  for (auto it = std::sregex_iterator(r.stdoutText.begin(), r.stdoutText.end(), mode); it != std::sregex_iterator();
       ++it) {
    lines[(*it)[1].str() + " " + (*it)[2].str()] = (*it)[0].str();
  }
  ASSERT_EQ(lines.size(), 5u) << r.stdoutText;
  for (const std::string m : {"none", "selective", "full"}) {
    const std::string& line = lines["recompute " + m];
    const double measured = field(line, "blocks_bytes"), formula = field(line, "blocks_formula");
    EXPECT_NEAR(measured, formula, 0.02 * formula) << line;
    EXPECT_GT(field(line, "step_ms"), 0.0) << line;
  }
  EXPECT_LT(field(lines["recompute full"], "blocks_bytes"), field(lines["recompute selective"], "blocks_bytes"));
  EXPECT_LT(field(lines["recompute selective"], "blocks_bytes"), field(lines["recompute none"], "blocks_bytes"));
  EXPECT_GT(field(lines["recompute_ratio full"], "blocks_fewer"), 1.0);
}

TEST(RecomputeBench, RefusesAnUnknownMode) {
  const auto r = runCommand({runfile("cli/cohort"), "bench", "recompute", "--modes", "none,some", "--layers", "1",
                             "--dim", "16", "--heads", "2", "--vocab", "8", "--ctx", "4", "--steps", "1"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find("recompute must be none, selective or full, got 'some'"), std::string::npos)
      << r.describe();
}

}  // namespace
