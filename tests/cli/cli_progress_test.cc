// Live progress on rank 0 (issue 18, train/observe/progress.h, docs/launcher.md) end to end: `cohort train`
// in a pseudo-terminal rewrites one line in place (carriage returns, never a newline between two
// updates of an epoch, erased before the epoch's summary line); through a pipe it writes a plain
// "progress:" line per --progress-every interval and never a carriage return; --progress-every 0
// writes none; cohortrun on a terminal shows rank 0's progress as its status line and every other
// line arrives whole. The pseudo-terminal runs with output post-processing off, so every "\r" seen
// was written by cohort or cohortrun. Each job takes one to two seconds on one core.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"
#include "tests/launcher/launcher_test_support.h"

namespace cohort::testing {
namespace {

using launcher::testing::Output;
using launcher::testing::runInTerminal;
using launcher::testing::TerminalOptions;

const std::string kErase = "\r\x1b[K";

// An epoch of mlp:784,256,10 on the synthetic set takes about half a second on one core: several
// redraws at 10 a second, a few plain lines at 0.2 s.
std::vector<std::string> trainArgs(int epochs, const std::string& progressEvery,
                                   const std::string& model = "mlp:784,256,10") {
  std::vector<std::string> args = {
      "train", "--model", model, "--data", "synthetic", "--epochs", std::to_string(epochs), "--threads", "1"};
  if (!progressEvery.empty()) {
    args.push_back("--progress-every");
    args.push_back(progressEvery);
  }
  return args;
}

// A redraw of the live line: "\r[rank 0] epoch E/N step ...\x1b[K" (the text never holds a "\r",
// a newline or an escape).
const std::regex& liveDraw() {
  static const std::regex draw("\r\\[rank 0\\] (epoch [0-9]+/[0-9]+ step [^\r\n\x1b]*)\x1b\\[K");
  return draw;
}

// One line of the plain form.
const std::regex& plainLine() {
  static const std::regex line(
      "\\[rank 0\\] progress: epoch [0-9]+/[0-9]+ step [0-9]+/[0-9]+ \\([0-9]+%\\) [0-9]+ samples/s loss [-+.e0-9]+ "
      "ETA epoch [0-9]+:[0-9][0-9] run [0-9]+:[0-9][0-9]");
  return line;
}

struct Draw {
  size_t at = 0;     // of its "\r"
  size_t end = 0;    // one past its "\x1b[K"
  std::string text;  // "epoch 1/3 step ..."
};

std::vector<Draw> draws(const std::string& out) {
  std::vector<Draw> found;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), liveDraw()); it != std::sregex_iterator(); ++it) {
    const size_t at = static_cast<size_t>(it->position(0));
    found.push_back({at, at + static_cast<size_t>(it->length(0)), (*it)[1].str()});
  }
  return found;
}

// `out` without the live line's redraws and erases: what scrolled.
std::string scrolled(const std::string& out) {
  std::string text = std::regex_replace(out, liveDraw(), "");
  for (size_t at; (at = text.find(kErase)) != std::string::npos;) text.erase(at, kErase.size());
  return text;
}

// Every line of `text` whole: ended by a newline, no "\r" or escape in it, starting with one of
// `starts`.
void expectWholeLines(const std::string& text, const std::vector<std::string>& starts) {
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "a line left unfinished";
  size_t lineStart = 0;
  for (size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', lineStart)) {
    const std::string line = text.substr(lineStart, nl - lineStart);
    lineStart = nl + 1;
    EXPECT_EQ(line.find_first_of("\r\x1b"), std::string::npos) << ::testing::PrintToString(line);
    EXPECT_TRUE(std::any_of(starts.begin(), starts.end(), [&](const std::string& s) { return line.rfind(s, 0) == 0; }))
        << ::testing::PrintToString(line);
  }
}

class CliProgressTest : public ShmDirTest {
 protected:
  TerminalOptions terminal(std::vector<std::string> extraEnv = {}) const {
    extraEnv.push_back("COHORT_SHM_DIR=" + shm_);  // runInTerminal passes no COHORT_ variable
    return {.extraEnv = std::move(extraEnv), .timeout = std::chrono::seconds(120), .columns = 200};
  }
};

TEST_F(CliProgressTest, InATerminalTheLineIsRewrittenInPlaceAndNeverScrolls) {
  std::vector<std::string> argv = {cohortBinary()};
  for (const std::string& a : trainArgs(3, "")) argv.push_back(a);  // the default, 10 s: no matter on a terminal
  const Output r = runInTerminal(argv, terminal());
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string& out = r.out;
  const std::vector<Draw> found = draws(out);
  // At least one redraw per epoch, and a rewrite within one.
  ASSERT_GE(found.size(), 4u) << ::testing::PrintToString(out);
  for (const Draw& d : found) {
    // Followed by the next redraw or the erase: the cursor never left the row.
    ASSERT_LT(d.end, out.size());
    EXPECT_EQ(out[d.end], '\r') << ::testing::PrintToString(out.substr(d.at, 200));
  }
  for (int epoch = 1; epoch <= 3; ++epoch) {
    const std::string tag = "epoch " + std::to_string(epoch) + "/3 step ";
    const auto first =
        std::find_if(found.begin(), found.end(), [&](const Draw& d) { return d.text.rfind(tag, 0) == 0; });
    ASSERT_NE(first, found.end()) << "no live line in epoch " << epoch;
    // The epoch's summary line (the logger's, "epoch E/3 step N train_loss ...") comes right after
    // the erase; no newline between the epoch's first update and it.
    size_t summary = out.find("[rank 0] " + tag, first->end);
    while (summary != std::string::npos && out[summary - 1] == '\r') summary = out.find("[rank 0] " + tag, summary + 1);
    ASSERT_NE(summary, std::string::npos) << "no summary line for epoch " << epoch;
    EXPECT_EQ(out.compare(summary - kErase.size(), kErase.size(), kErase), 0)
        << ::testing::PrintToString(out.substr(summary - 40, 80));
    EXPECT_EQ(out.substr(first->at, summary - first->at).find('\n'), std::string::npos)
        << "the progress line scrolled in epoch " << epoch;
  }
  EXPECT_EQ(out.find("progress:"), std::string::npos);
  expectWholeLines(scrolled(out), {"[rank 0] ", "RESULT "});
}

TEST_F(CliProgressTest, ThroughAPipeOnePlainLinePerIntervalAndNeverACarriageReturn) {
  const CommandResult r = runCohort(trainArgs(3, "0.2"));
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.stdoutText.find_first_of("\r\x1b"), std::string::npos) << r.describe();
  EXPECT_EQ(r.stderrText.find_first_of("\r\x1b"), std::string::npos) << r.describe();
  const std::vector<std::string> lines = linesWith(r.stdoutText, "progress:");
  for (const std::string& line : lines) EXPECT_TRUE(std::regex_match(line, plainLine())) << line;
  // About 1.5 s of training: several lines, and never more than one per 0.2 s of the run.
  const double wallSeconds = parseResultLine(r.stdoutText).number("wall_s");
  EXPECT_GE(lines.size(), 3u) << r.describe();
  EXPECT_LE(static_cast<double>(lines.size()), wallSeconds / 0.2 + 1) << r.describe();

  // The user's COHORT_PROGRESS=plain on a terminal: the same plain lines.
  std::vector<std::string> argv = {cohortBinary()};
  for (const std::string& a : trainArgs(2, "0.2")) argv.push_back(a);
  const Output plain = runInTerminal(argv, terminal({"COHORT_PROGRESS=plain"}));
  ASSERT_EQ(plain.exitCode, 0) << plain.describe();
  EXPECT_EQ(plain.out.find_first_of("\r\x1b"), std::string::npos) << plain.describe();
  EXPECT_GE(linesWith(plain.out, "] progress: epoch ").size(), 2u) << plain.describe();
}

TEST_F(CliProgressTest, ProgressEveryZeroWritesNone) {
  const CommandResult piped = runCohort(trainArgs(1, "0"));
  ASSERT_EQ(piped.exitCode, 0) << piped.describe();
  EXPECT_EQ(piped.stdoutText.find("progress"), std::string::npos) << piped.describe();

  std::vector<std::string> argv = {cohortBinary()};
  for (const std::string& a : trainArgs(1, "0")) argv.push_back(a);
  const Output r = runInTerminal(argv, terminal());
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.out.find_first_of("\r\x1b"), std::string::npos) << r.describe();
  EXPECT_EQ(r.out.find("progress"), std::string::npos) << r.describe();
}

// cohortrun in a terminal: rank 0's progress is the launcher's status line; lines of every rank,
// rank 0's summary lines included, scroll above it whole.
TEST_F(CliProgressTest, CohortrunOnATerminalShowsRankZerosStatusLineAndKeepsOtherLinesWhole) {
  std::vector<std::string> argv = {launcher::testing::cohortrun(), "--nproc-per-node", "2", "--", cohortBinary()};
  for (const std::string& a : trainArgs(3, "", "mlp:784,512,10")) argv.push_back(a);
  argv.insert(argv.end(), {"--mode", "allreduce"});
  const Output r = runInTerminal(argv, terminal());
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string& out = r.out;
  // Updates at most 4 a second, at least one per epoch, about 0.6 s each.
  const std::vector<Draw> found = draws(out);
  ASSERT_GE(found.size(), 4u) << ::testing::PrintToString(out);
  EXPECT_EQ(out.find("cohort-progress"), std::string::npos) << "a marker reached the terminal";
  EXPECT_EQ(out.find("progress:"), std::string::npos);
  // The status line is erased at the end: nothing drawn after the last erase.
  EXPECT_GT(out.rfind(kErase), found.back().at);
  const std::string text = scrolled(out);
  expectWholeLines(text, {"[rank 0] ", "[rank 1] "});
  EXPECT_GE(linesWith(text, "[rank 1] epoch ").size(), 3u) << text;
  EXPECT_GE(linesWith(text, "[rank 0] epoch ").size(), 3u) << text;
}

TEST_F(CliProgressTest, CohortrunThroughAPipePassesRankZerosPlainLines) {
  const CommandResult r =
      runCommand({launcher::testing::cohortrun(), "--nproc-per-node", "2", "--", cohortBinary(), "train", "--mode",
                  "allreduce", "--model", "mlp:784,256,10", "--epochs", "2", "--progress-every", "0.2"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.stdoutText.find_first_of("\r\x1b"), std::string::npos) << r.describe();
  const std::vector<std::string> lines = linesWith(r.stdoutText, "progress:");
  EXPECT_GE(lines.size(), 2u) << r.describe();
  for (const std::string& line : lines) EXPECT_TRUE(std::regex_match(line, plainLine())) << line;
  EXPECT_TRUE(linesWith(r.stdoutText, "[rank 1] progress").empty()) << "only rank 0 reports progress";
}

}  // namespace
}  // namespace cohort::testing
