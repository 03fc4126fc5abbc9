// Progress (train/observe/progress.h) on a fake clock, writing into a pipe (or a pseudo-terminal where the
// terminal's width matters): one plain line per interval and never a carriage return; in-place
// redraws throttled to 10 a second and no newline; marker lines for cohortrun; the figures (rate,
// running loss, ETAs) on exact numbers; no allocation per step; which mode a process gets.
// The clock steps in binary fractions (1/4, 1/64 s) so every time and quotient is exact.
#include "train/observe/progress.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/alloc_counter.h"

namespace cohort::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', start)) {
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  EXPECT_EQ(start, text.size()) << "an unterminated last line: " << text.substr(start);
  return lines;
}

// A pipe whose read end never blocks (what was written so far), and a clock the test moves.
class ProgressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
    readFd_ = fds[0];
    writeFd_ = fds[1];
  }
  void TearDown() override {
    ::close(readFd_);
    ::close(writeFd_);
  }
  ProgressOptions options(ProgressMode mode) {
    ProgressOptions o;
    o.mode = mode;
    o.fd = writeFd_;
    o.clock = [this] { return now_; };
    return o;
  }
  // Everything written since the last call.
  std::string written() {
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(readFd_, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    return out;
  }

  int readFd_ = -1, writeFd_ = -1;
  double now_ = 0;
};

TEST_F(ProgressTest, PlainWritesOneLinePerIntervalAndNeverACarriageReturn) {
  ProgressOptions o = options(ProgressMode::kPlain);
  o.everySeconds = 10;
  o.epochs = 3;
  o.stepsPerEpoch = 140;
  o.samplesScale = 2;
  Progress progress(o);
  progress.startEpoch(0, 0);
  // 140 steps of 0.25 s: 35 s, so lines at 10, 20 and 30 s (steps 40, 80 and 120).
  for (int step = 1; step <= 140; ++step) {
    now_ = 0.25 * step;
    progress.step(step, 32, step % 2 == 0 ? 1.0 : 0.0);
  }
  progress.endEpoch();  // nothing to erase in plain mode
  const std::string out = written();
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_EQ(out.find('\x1b'), std::string::npos);
  const std::vector<std::string> lines = splitLines(out);
  ASSERT_EQ(lines.size(), 3u) << out;
  // 40 steps x 32 samples x 2 ranks in 10 s; 0.25 s a step: 100 steps left in this epoch (25 s)
  // and 140 in each of the two later ones (70 s).
  EXPECT_EQ(lines[0], "progress: epoch 1/3 step 40/140 (28%) 256 samples/s loss 0.5 ETA epoch 0:25 run 1:35");
  EXPECT_EQ(lines[1], "progress: epoch 1/3 step 80/140 (57%) 256 samples/s loss 0.5 ETA epoch 0:15 run 1:25");
  EXPECT_EQ(lines[2], "progress: epoch 1/3 step 120/140 (85%) 256 samples/s loss 0.5 ETA epoch 0:05 run 1:15");
}

TEST_F(ProgressTest, PlainScheduleRunsAcrossEpochsShorterThanTheInterval) {
  ProgressOptions o = options(ProgressMode::kPlain);
  o.everySeconds = 10;
  o.epochs = 4;
  o.stepsPerEpoch = 16;
  o.prefix = "[rank 0] ";
  Progress progress(o);
  // Four epochs of 16 steps x 0.25 s = 4 s each (and 2 s between them for evaluation): 22 s in
  // all, so lines at 10 and 20 s although no epoch lasts 10 s.
  for (int epoch = 0; epoch < 4; ++epoch) {
    progress.startEpoch(epoch, 0);
    for (int step = 1; step <= 16; ++step) {
      now_ += 0.25;
      progress.step(step, 8, 2.0);
    }
    progress.endEpoch();
    now_ += 2;
  }
  const std::vector<std::string> lines = splitLines(written());
  ASSERT_EQ(lines.size(), 2u);
  // Epoch k starts at 6k s: 10 s is epoch 2's last step, 20 s epoch 4's 8th.
  EXPECT_EQ(lines[0], "[rank 0] progress: epoch 2/4 step 16/16 (100%) 32 samples/s loss 2 ETA epoch 0:00 run 0:08");
  EXPECT_EQ(lines[1], "[rank 0] progress: epoch 4/4 step 8/16 (50%) 32 samples/s loss 2 ETA epoch 0:02 run 0:02");
}

TEST_F(ProgressTest, PlainAfterAStallWritesOneLineNotABurst) {
  ProgressOptions o = options(ProgressMode::kPlain);
  o.everySeconds = 1;
  Progress progress(o);
  progress.startEpoch(0, 0);
  now_ = 0.5;
  progress.step(1, 1, kNaN);
  now_ = 5.5;  // a 5 s step
  progress.step(2, 1, kNaN);
  progress.step(3, 1, kNaN);
  now_ = 6.25;
  progress.step(4, 1, kNaN);
  now_ = 6.5;
  progress.step(5, 1, kNaN);
  EXPECT_EQ(splitLines(written()).size(), 2u);  // at 5.5 s and 6.5 s
}

TEST_F(ProgressTest, TerminalRewritesOneLineInPlaceThrottledAndWithoutNewlines) {
  ProgressOptions o = options(ProgressMode::kTerminal);
  o.epochs = 1;
  o.stepsPerEpoch = 128;
  Progress progress(o);
  progress.startEpoch(0, 0);
  // 128 steps of 1/64 s (2 s): the first step draws, then every 7th (7/64 s is the first multiple
  // of 1/64 s that reaches 0.1 s): steps 1, 8, ..., 127: 19 draws.
  for (int step = 1; step <= 128; ++step) {
    now_ = step / 64.0;
    progress.step(step, 4, 1.5);
  }
  std::string out = written();
  EXPECT_EQ(out.find('\n'), std::string::npos) << "the live line scrolled";
  EXPECT_EQ(count(out, "\r"), 19u);
  EXPECT_EQ(count(out, "\x1b[K"), 19u);
  EXPECT_EQ(out.rfind("\r", 0), 0u) << "every draw starts at column 0";
  // Step 127 at 127/64 s: 127 x 4 samples / (127/64) s = 256/s; 1 step of 1/64 s left.
  const std::string last = "\repoch 1/1 step 127/128 (99%) 256 samples/s loss 1.5 ETA epoch 0:00 run 0:00\x1b[K";
  ASSERT_GE(out.size(), last.size());
  EXPECT_EQ(out.substr(out.size() - last.size()), last);
  progress.endEpoch();
  EXPECT_EQ(written(), "\r\x1b[K");  // erased: the summary line starts on a clean row
  progress.endEpoch();
  EXPECT_EQ(written(), "");  // nothing showing, nothing to erase
  // The next epoch's first step draws at once.
  progress.startEpoch(1, 0);
  now_ += 0.01;
  progress.step(1, 4, 1.5);
  EXPECT_EQ(count(written(), "\r"), 1u);
}

TEST_F(ProgressTest, TerminalClearLineErasesAndTheNextStepRedraws) {
  ProgressOptions o = options(ProgressMode::kTerminal);
  o.stepsPerEpoch = 10;
  o.prefix = "[rank 0] ";
  Progress progress(o);
  progress.startEpoch(0, 0);
  now_ = 1;
  progress.step(1, 1, kNaN);
  EXPECT_EQ(written(), "\r[rank 0] epoch 1/1 step 1/10 (10%) 1 samples/s ETA epoch 0:09 run 0:09\x1b[K");
  progress.clearLine();  // a log line is about to be written
  EXPECT_EQ(written(), "\r\x1b[K");
  now_ = 1.015625;  // well within 0.1 s of the last draw: drawn again all the same
  progress.step(2, 1, kNaN);
  EXPECT_EQ(count(written(), "step 2/10"), 1u);
  progress.clearLine();
  progress.clearLine();
  EXPECT_EQ(written(), "\r\x1b[K");
}

TEST_F(ProgressTest, TerminalDestructorErasesALineStillShowing) {
  {
    Progress progress(options(ProgressMode::kTerminal));
    progress.startEpoch(0, 0);
    now_ = 1;
    progress.step(1, 1, 0.5);
    written();
  }  // an exception left the loop
  EXPECT_EQ(written(), "\r\x1b[K");
}

TEST_F(ProgressTest, LauncherWritesMarkerLinesThrottledAndClearsAtTheEpochsEnd) {
  ProgressOptions o = options(ProgressMode::kLauncher);
  o.stepsPerEpoch = 64;
  Progress progress(o);
  progress.startEpoch(0, 0);
  // 64 steps of 1/64 s: the first draws, then every 16th (0.25 s): steps 1, 17, 33, 49.
  for (int step = 1; step <= 64; ++step) {
    now_ = step / 64.0;
    progress.step(step, 2, 0.25);
  }
  progress.endEpoch();
  const std::string out = written();
  EXPECT_EQ(out.find('\r'), std::string::npos);
  const std::vector<std::string> lines = splitLines(out);
  ASSERT_EQ(lines.size(), 5u) << out;
  const std::string marker(kProgressMarker);
  for (const std::string& line : lines) EXPECT_EQ(line.rfind(marker, 0), 0u) << line;
  EXPECT_EQ(lines[0], marker + "epoch 1/1 step 1/64 (1%) 128 samples/s loss 0.25 ETA epoch 0:01 run 0:01");
  EXPECT_EQ(lines[3], marker + "epoch 1/1 step 49/64 (76%) 128 samples/s loss 0.25 ETA epoch 0:00 run 0:00");
  EXPECT_EQ(lines[4], marker) << "the marker alone clears cohortrun's status line";
}

// With --max-steps the ETAs count to the step the run stops at: step 260 of 300, stopping at 280.
TEST_F(ProgressTest, EtasStopAtMaxSteps) {
  ProgressOptions o = options(ProgressMode::kPlain);
  o.everySeconds = 10;
  o.epochs = 3;
  o.stepsPerEpoch = 100;
  o.maxSteps = 280;
  Progress progress(o);
  progress.startEpoch(2, 50);
  for (int step = 51; step <= 60; ++step) {
    now_ += 1;
    progress.step(step, 10, 3.0);
  }
  EXPECT_EQ(written(), "progress: epoch 3/3 step 60/100 (60%) 10 samples/s loss 3 ETA epoch 0:20 run 0:20\n");
  o.maxSteps = 1000;  // beyond the epochs: no change
  Progress later(o);
  later.startEpoch(0, 0);
  for (int step = 1; step <= 10; ++step) {
    now_ += 1;
    later.step(step, 10, 3.0);
  }
  EXPECT_EQ(written(), "progress: epoch 1/3 step 10/100 (10%) 10 samples/s loss 3 ETA epoch 1:30 run 4:50\n");
}

TEST_F(ProgressTest, EtaOfAResumedEpochUsesTheStepsDoneSinceItsStart) {
  ProgressOptions o = options(ProgressMode::kPlain);
  o.everySeconds = 10;
  o.epochs = 100;
  o.stepsPerEpoch = 100;
  Progress progress(o);
  now_ = 100;
  progress.startEpoch(1, 50);  // resumed halfway through epoch 2
  for (int step = 51; step <= 60; ++step) {
    now_ += 1;
    progress.step(step, 10, 3.0);
  }
  // 1 s a step: 40 s left in this epoch; 98 later epochs of 100 s: 9840 s = 2:44:00.
  EXPECT_EQ(written(), "progress: epoch 2/100 step 60/100 (60%) 10 samples/s loss 3 ETA epoch 0:40 run 2:44:00\n");
}

TEST_F(ProgressTest, LossIsTheSampleWeightedMeanOfTheKnownLossesAndLeftOutWhenNoneIsKnown) {
  ProgressOptions o = options(ProgressMode::kPlain);
  o.everySeconds = 1;
  o.stepsPerEpoch = 4;
  Progress progress(o);
  progress.startEpoch(0, 0);
  now_ = 0.5;
  progress.step(1, 8, kNaN);  // on a GPU: unknown
  now_ = 1;
  progress.step(2, 8, kNaN);
  EXPECT_EQ(written(), "progress: epoch 1/1 step 2/4 (50%) 16 samples/s ETA epoch 0:01 run 0:01\n");
  progress.step(3, 10, 1.0);
  now_ = 2;
  progress.step(4, 30, 0.0);
  EXPECT_EQ(written(), "progress: epoch 1/1 step 4/4 (100%) 28 samples/s loss 0.25 ETA epoch 0:00 run 0:00\n");
  // A new epoch starts its own mean.
  progress.startEpoch(1, 0);
  now_ = 3;
  progress.step(1, 2, 4.0);
  EXPECT_NE(written().find(" loss 4 "), std::string::npos);
}

TEST_F(ProgressTest, RateAndEtaWaitForTimeToPassAndTotalsForAKnownEpochLength) {
  ProgressOptions o = options(ProgressMode::kTerminal);
  Progress progress(o);  // stepsPerEpoch 0: unknown
  now_ = 7;
  progress.startEpoch(0, 0);
  progress.step(1, 5, 0.5);  // no time has passed
  EXPECT_EQ(written(), "\repoch 1/1 step 1 loss 0.5\x1b[K");
}

TEST_F(ProgressTest, OffWritesNothing) {
  ProgressOptions o = options(ProgressMode::kOff);
  bool clockRead = false;
  o.clock = [&] {
    clockRead = true;
    return now_;
  };
  {
    Progress progress(o);
    progress.startEpoch(0, 0);
    for (int step = 1; step <= 100; ++step) progress.step(step, 1, 1.0);
    progress.clearLine();
    progress.endEpoch();
  }
  EXPECT_EQ(written(), "");
  EXPECT_FALSE(clockRead);
  o.mode = ProgressMode::kPlain;
  o.everySeconds = 0;  // a plain line at every step is not what anybody means
  Progress plain(o);
  plain.startEpoch(0, 0);
  plain.step(1, 1, 1.0);
  EXPECT_EQ(plain.mode(), ProgressMode::kOff);
  EXPECT_EQ(written(), "");
}

TEST_F(ProgressTest, StepsAllocateNothingWhetherOrNotALineIsDue) {
  for (ProgressMode mode : {ProgressMode::kPlain, ProgressMode::kTerminal, ProgressMode::kLauncher}) {
    ProgressOptions o = options(mode);
    o.everySeconds = 0.5;
    o.stepsPerEpoch = 1000;
    o.prefix = "[rank 0] ";
    Progress progress(o);
    progress.startEpoch(0, 0);
    const long before = testing::allocationCount();
    for (int step = 1; step <= 1000; ++step) {
      now_ += 1.0 / 64;
      progress.step(step, 64, 0.125);
    }
    progress.endEpoch();
    EXPECT_EQ(testing::allocationCount() - before, 0) << toString(mode);
    EXPECT_GT(count(written(), "step "), 10u) << toString(mode);
  }
}

TEST_F(ProgressTest, TerminalLineIsCutToTheTerminalsWidth) {
  int master = -1, slave = -1;
  winsize size{};
  size.ws_col = 40;
  size.ws_row = 10;
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, &size), 0);
  ProgressOptions o = options(ProgressMode::kTerminal);
  o.fd = slave;
  o.stepsPerEpoch = 938;
  Progress progress(o);
  progress.startEpoch(0, 0);
  now_ = 1;
  progress.step(300, 64, 0.3125);
  const std::string full = "epoch 1/1 step 300/938 (31%) 64 samples/s loss 0.3125 ETA epoch 0:02 run 0:02";
  std::string out(256, '\0');
  const ssize_t n = ::read(master, out.data(), out.size());
  ASSERT_GT(n, 0);
  out.resize(static_cast<size_t>(n));
  // 39 characters: the cursor stays on the row, so "\r" can rewrite it.
  EXPECT_EQ(out, "\r" + full.substr(0, 39) + "\x1b[K");
  ::close(master);
  ::close(slave);
}

// Sets an environment variable for the life of the object and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DetectProgressModeTest, TerminalPipeAndTheEnvironment) {
  int master = -1, slave = -1;
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int pipeFd = fds[1];
  ScopedEnv noProgress("COHORT_PROGRESS", nullptr);
  ScopedEnv noMpi("OMPI_COMM_WORLD_SIZE", nullptr);
  {
    ScopedEnv term("TERM", "xterm-256color");
    EXPECT_EQ(detectProgressMode(10, slave), ProgressMode::kTerminal);
    EXPECT_EQ(detectProgressMode(0.2, slave), ProgressMode::kTerminal);
    EXPECT_EQ(detectProgressMode(10, pipeFd), ProgressMode::kPlain);
    EXPECT_EQ(detectProgressMode(0, slave), ProgressMode::kOff);
    EXPECT_EQ(detectProgressMode(0, pipeFd), ProgressMode::kOff);
  }
  {
    ScopedEnv term("TERM", nullptr);
    EXPECT_EQ(detectProgressMode(10, slave), ProgressMode::kTerminal);
  }
  {
    ScopedEnv term("TERM", "dumb");  // no "erase to end of line"
    EXPECT_EQ(detectProgressMode(10, slave), ProgressMode::kPlain);
  }
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_SIZE", "2");  // under mpirun every rank's stdout is Open MPI's pty
    EXPECT_EQ(detectProgressMode(10, slave), ProgressMode::kPlain);
  }
  {
    ScopedEnv live("COHORT_PROGRESS", "live");  // set by cohortrun on a terminal
    EXPECT_EQ(detectProgressMode(10, pipeFd), ProgressMode::kLauncher);
    EXPECT_EQ(detectProgressMode(10, slave), ProgressMode::kLauncher);
    EXPECT_EQ(detectProgressMode(0, pipeFd), ProgressMode::kOff);  // --progress-every 0 wins
  }
  {
    ScopedEnv plain("COHORT_PROGRESS", "plain");
    EXPECT_EQ(detectProgressMode(10, slave), ProgressMode::kPlain);
  }
  {
    ScopedEnv off("COHORT_PROGRESS", "off");
    EXPECT_EQ(detectProgressMode(10, slave), ProgressMode::kOff);
    EXPECT_EQ(detectProgressMode(10, pipeFd), ProgressMode::kOff);
  }
  {
    ScopedEnv other("COHORT_PROGRESS", "sparkly");  // ignored: the terminal test decides
    EXPECT_EQ(detectProgressMode(10, pipeFd), ProgressMode::kPlain);
  }
  ::close(fds[0]);
  ::close(fds[1]);
  ::close(master);
  ::close(slave);
}

}  // namespace
}  // namespace cohort::train
