// OutputPump: prefixes, partial and long lines, the tail ring buffer and log files; rank 0's
// progress as a status line, byte for byte. The "terminal" is a pair of temporary files (a real
// pseudo-terminal where its width matters); worker output arrives through a real pipe.
#include "launcher/output_pump.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "runtime/error.h"
#include "runtime/unique_fd.h"
#include "tests/launcher/launcher_test_support.h"
#include "train/observe/progress.h"

namespace cohort::launcher {
namespace {

std::string readWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class OutputPumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::freshTempDir();
    out_ = runtime::UniqueFd(::open((dir_ + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    err_ = runtime::UniqueFd(::open((dir_ + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
    pipeRead_ = runtime::UniqueFd(fds[0]);
    pipeWrite_ = runtime::UniqueFd(fds[1]);
  }
  OutputPumpOptions options(int worldSize) {
    OutputPumpOptions o;
    o.worldSize = worldSize;
    o.jobId = "cr-1-1";
    o.stdoutFd = out_.get();
    o.stderrFd = err_.get();
    return o;
  }
  // Writes `bytes` into the pipe and lets the pump read them as `stream` of `rank`.
  void feed(OutputPump& pump, int rank, StreamKind stream, const std::string& bytes) {
    ASSERT_EQ(::write(pipeWrite_.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    EXPECT_TRUE(pump.drain(pipeRead_.get(), rank, stream));
  }
  std::string out() { return readWhole(dir_ + "/out"); }
  std::string err() { return readWhole(dir_ + "/err"); }

  std::string dir_;
  runtime::UniqueFd out_, err_, pipeRead_, pipeWrite_;
};

TEST_F(OutputPumpTest, PrefixesWholeLinesOnTheRightStream) {
  OutputPump pump(options(3));
  feed(pump, 2, StreamKind::kStdout, "a\nb\n");
  feed(pump, 0, StreamKind::kStderr, "e1\n");
  feed(pump, 1, StreamKind::kStdout, "\n");
  EXPECT_EQ(out(), "[rank 2] a\n[rank 2] b\n[rank 1] \n");
  EXPECT_EQ(err(), "[rank 0] e1\n");
}

TEST_F(OutputPumpTest, HoldsPartialLinesPerStreamUntilNewlineOrEndOfFile) {
  OutputPump pump(options(2));
  feed(pump, 0, StreamKind::kStdout, "hel");
  feed(pump, 1, StreamKind::kStdout, "other\n");
  feed(pump, 0, StreamKind::kStderr, "err-part");
  feed(pump, 0, StreamKind::kStdout, "lo\nwor");
  EXPECT_EQ(out(), "[rank 1] other\n[rank 0] hello\n");
  pump.flushPartial(0, StreamKind::kStdout);
  pump.flushPartial(0, StreamKind::kStdout);  // nothing left: no empty line
  EXPECT_EQ(out(), "[rank 1] other\n[rank 0] hello\n[rank 0] wor\n");
  EXPECT_EQ(err(), "");
  pump.flushPartial(0, StreamKind::kStderr);
  EXPECT_EQ(err(), "[rank 0] err-part\n");
}

TEST_F(OutputPumpTest, SplitsVeryLongLinesIntoPieces) {
  OutputPumpOptions o = options(1);
  o.maxLineBytes = 10;
  OutputPump pump(o);
  feed(pump, 0, StreamKind::kStdout, std::string(25, 'x') + "\n" + std::string(10, 'y') + "\n");
  EXPECT_EQ(out(), "[rank 0] xxxxxxxxxx\n[rank 0] xxxxxxxxxx\n[rank 0] xxxxx\n[rank 0] yyyyyyyyyy\n");
}

TEST_F(OutputPumpTest, KeepsTheLastLinesOfEachRank) {
  OutputPumpOptions o = options(2);
  o.tailLines = 3;
  OutputPump pump(o);
  for (int i = 0; i < 5; ++i) feed(pump, 1, StreamKind::kStdout, "line " + std::to_string(i) + "\n");
  feed(pump, 1, StreamKind::kStderr, "oops\n");
  feed(pump, 0, StreamKind::kStdout, "zero\n");
  EXPECT_EQ(std::vector<std::string>(pump.tail(1).begin(), pump.tail(1).end()),
            (std::vector<std::string>{"line 3", "line 4", "oops"}));
  EXPECT_EQ(std::vector<std::string>(pump.tail(0).begin(), pump.tail(0).end()), (std::vector<std::string>{"zero"}));
}

TEST_F(OutputPumpTest, LogFilesAreUnprefixedAndAppendedAcrossAttempts) {
  OutputPumpOptions o = options(2);
  o.logDir = dir_ + "/logs/nested";  // created
  {
    OutputPump pump(o);
    pump.beginAttempt(0);
    feed(pump, 1, StreamKind::kStdout, "first\n");
    feed(pump, 1, StreamKind::kStderr, "to stderr\n");
    pump.beginAttempt(1);
    feed(pump, 1, StreamKind::kStdout, "second\n");
  }
  std::string log = readWhole(o.logDir + "/rank1.log");
  EXPECT_NE(log.find("attempt 1 (COHORT_RESTART_COUNT=0)"), std::string::npos) << log;
  EXPECT_NE(log.find("attempt 2 (COHORT_RESTART_COUNT=1)"), std::string::npos) << log;
  EXPECT_NE(log.find("job cr-1-1"), std::string::npos) << log;
  EXPECT_NE(log.find("\nfirst\nto stderr\n"), std::string::npos) << log;
  EXPECT_LT(log.find("first"), log.find("attempt 2"));
  EXPECT_GT(log.find("\nsecond\n"), log.find("attempt 2"));
  EXPECT_EQ(log.find("[rank"), std::string::npos) << log;
  std::string log0 = readWhole(o.logDir + "/rank0.log");
  EXPECT_EQ(log0.find("first"), std::string::npos);
  EXPECT_NE(log0.find("attempt 2"), std::string::npos);
}

TEST_F(OutputPumpTest, UnusableLogDirectoryIsAnIoError) {
  OutputPumpOptions o = options(1);
  o.logDir = dir_ + "/out/sub";  // "out" is a file
  EXPECT_THROW(OutputPump pump(o), IoError);
}

// Issue 44: a log directory others can write (/tmp/logs) may hold what another user planted. A
// symbolic link at rank<k>.log used to receive the worker's output wherever it pointed, and a FIFO
// blocked cohortrun's start; each is refused now, naming it, and the file it points at is untouched.
TEST_F(OutputPumpTest, APlantedLinkOrFifoInTheLogDirectoryIsRefusedNeverWrittenThrough) {
  OutputPumpOptions o = options(1);
  o.logDir = dir_ + "/planted";
  ASSERT_EQ(::mkdir(o.logDir.c_str(), 0755), 0);
  const std::string victim = dir_ + "/victim";
  { std::ofstream(victim) << "precious\n"; }
  ASSERT_EQ(::symlink(victim.c_str(), (o.logDir + "/rank0.log").c_str()), 0);
  try {
    OutputPump pump(o);
    ADD_FAILURE() << "a symbolic link at rank0.log was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(o.logDir + "/rank0.log is a symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_EQ(readWhole(victim), "precious\n");

  ASSERT_EQ(::unlink((o.logDir + "/rank0.log").c_str()), 0);
  ASSERT_EQ(::mkfifo((o.logDir + "/rank0.log").c_str(), 0600), 0);
  try {
    OutputPump pump(o);  // would block in open() without a reader, before the fix
    ADD_FAILURE() << "a FIFO at rank0.log was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a regular file"), std::string::npos) << e.what();
  }
}

TEST_F(OutputPumpTest, DrainReportsEndOfFile) {
  OutputPump pump(options(1));
  feed(pump, 0, StreamKind::kStdout, "last words");
  pipeWrite_.reset();
  EXPECT_FALSE(pump.drain(pipeRead_.get(), 0, StreamKind::kStdout));
  pump.flushPartial(0, StreamKind::kStdout);
  EXPECT_EQ(out(), "[rank 0] last words\n");
}

// ---- The status line (options.liveStatus: cohortrun's stdout is a terminal) ----

const std::string kMarker(kProgressMarker);
const std::string kErase = "\r\x1b[K";

TEST(ProgressMarker, IsTheSameBytesAsTheWorkersMarker) { EXPECT_EQ(kProgressMarker, train::kProgressMarker); }

TEST_F(OutputPumpTest, RankZerosProgressIsOneStatusLineRedrawnBelowEveryOtherLine) {
  OutputPumpOptions o = options(2);
  o.liveStatus = true;
  OutputPump pump(o);
  feed(pump, 0, StreamKind::kStdout, kMarker + "epoch 1/1 step 3/9\n");
  std::string expectedOut = "\r[rank 0] epoch 1/1 step 3/9\x1b[K";
  EXPECT_EQ(out(), expectedOut);
  feed(pump, 0, StreamKind::kStdout, kMarker + "epoch 1/1 step 6/9\n");
  expectedOut += "\r[rank 0] epoch 1/1 step 6/9\x1b[K";
  EXPECT_EQ(out(), expectedOut);
  // Another line on stdout: erase, the line, the status line again (one write).
  feed(pump, 1, StreamKind::kStdout, "hello\n");
  expectedOut += kErase + "[rank 1] hello\n" + "\r[rank 0] epoch 1/1 step 6/9\x1b[K";
  EXPECT_EQ(out(), expectedOut);
  // A line on stderr: erased and redrawn on stdout around it.
  feed(pump, 1, StreamKind::kStderr, "oops\n");
  expectedOut += kErase + "\r[rank 0] epoch 1/1 step 6/9\x1b[K";
  EXPECT_EQ(out(), expectedOut);
  EXPECT_EQ(err(), "[rank 1] oops\n");
  // Rank 0's own ordinary lines too; then the marker alone clears the status line.
  feed(pump, 0, StreamKind::kStdout, "epoch 1/1 done\n" + kMarker + "\n");
  expectedOut += kErase + "[rank 0] epoch 1/1 done\n" + "\r[rank 0] epoch 1/1 step 6/9\x1b[K" + kErase;
  EXPECT_EQ(out(), expectedOut);
  // Nothing to keep below the lines now.
  feed(pump, 1, StreamKind::kStdout, "plain\n");
  feed(pump, 0, StreamKind::kStdout, kMarker + "\n");
  expectedOut += "[rank 1] plain\n";
  EXPECT_EQ(out(), expectedOut);
  EXPECT_EQ(err(), "[rank 1] oops\n");
}

TEST_F(OutputPumpTest, AnotherRanksLineArrivingInPiecesIsWrittenWholeBelowTheStatusLine) {
  OutputPumpOptions o = options(2);
  o.liveStatus = true;
  OutputPump pump(o);
  feed(pump, 0, StreamKind::kStdout, kMarker + "s");
  feed(pump, 1, StreamKind::kStdout, "[begin");
  EXPECT_EQ(out(), "");  // neither line is complete
  feed(pump, 0, StreamKind::kStdout, "tep 1\n");
  feed(pump, 1, StreamKind::kStdout, " end]\n");
  EXPECT_EQ(out(), "\r[rank 0] step 1\x1b[K" + kErase + "[rank 1] [begin end]\n\r[rank 0] step 1\x1b[K");
}

TEST_F(OutputPumpTest, MarkerLinesNeverReachLogFilesTheTailOrAStdoutThatIsNoTerminal) {
  for (bool live : {false, true}) {
    SCOPED_TRACE(live ? "status line" : "no status line");
    SetUp();
    OutputPumpOptions o = options(2);
    o.liveStatus = live;
    o.logDir = dir_ + "/logs";
    {
      OutputPump pump(o);
      pump.beginAttempt(0);
      feed(pump, 0, StreamKind::kStdout, kMarker + "epoch 1/1 step 1/2\n");
      feed(pump, 0, StreamKind::kStdout, "line\n");
      feed(pump, 0, StreamKind::kStdout, kMarker + "\n");
      EXPECT_EQ(std::vector<std::string>(pump.tail(0).begin(), pump.tail(0).end()), std::vector<std::string>{"line"});
    }
    const std::string log = readWhole(o.logDir + "/rank0.log");
    EXPECT_EQ(log.find("cohort-progress"), std::string::npos) << log;
    EXPECT_EQ(log.substr(log.size() - 5), "line\n");
    if (!live) EXPECT_EQ(out(), "[rank 0] line\n");
    EXPECT_EQ(out().find("cohort-progress"), std::string::npos);
  }
}

TEST_F(OutputPumpTest, MarkersOfOtherRanksAndOnStderrAreDropped) {
  OutputPumpOptions o = options(3);
  o.liveStatus = true;
  OutputPump pump(o);
  feed(pump, 1, StreamKind::kStdout, kMarker + "rank 1's progress\n");
  feed(pump, 2, StreamKind::kStdout, kMarker + "\n");
  feed(pump, 0, StreamKind::kStderr, kMarker + "on stderr\n");
  EXPECT_EQ(out(), "");
  EXPECT_EQ(err(), "");
  feed(pump, 1, StreamKind::kStdout, "x\n");
  EXPECT_EQ(out(), "[rank 1] x\n");
}

TEST_F(OutputPumpTest, OwnMessagesEndOfRankZerosStdoutAndTheAttemptsEndClearTheStatusLine) {
  OutputPumpOptions o = options(2);
  o.liveStatus = true;
  std::string expectedOut;
  {
    OutputPump pump(o);
    feed(pump, 0, StreamKind::kStdout, kMarker + "a\n");
    expectedOut += "\r[rank 0] a\x1b[K";
    pump.writeOwn("cohortrun: got SIGINT\n");
    expectedOut += kErase + "\r[rank 0] a\x1b[K";
    EXPECT_EQ(err(), "cohortrun: got SIGINT\n");
    pump.endOfStream(1, StreamKind::kStdout);  // another rank's end: the status line stays
    pump.endOfStream(0, StreamKind::kStderr);
    EXPECT_EQ(out(), expectedOut);
    pump.endOfStream(0, StreamKind::kStdout);  // rank 0 is gone: no more progress
    expectedOut += kErase;
    EXPECT_EQ(out(), expectedOut);
    feed(pump, 0, StreamKind::kStdout, kMarker + "b\n");
    pump.clearStatus();  // the attempt's end
    pump.clearStatus();
    expectedOut += "\r[rank 0] b\x1b[K" + kErase;
    EXPECT_EQ(out(), expectedOut);
    feed(pump, 0, StreamKind::kStdout, kMarker + "c\n");
    pump.beginAttempt(1);  // a restart starts clean
    expectedOut += "\r[rank 0] c\x1b[K" + kErase;
    EXPECT_EQ(out(), expectedOut);
    feed(pump, 0, StreamKind::kStdout, kMarker + "d\n");
    expectedOut += "\r[rank 0] d\x1b[K";
  }  // destroyed while the status line shows (an error unwinding)
  expectedOut += kErase;
  EXPECT_EQ(out(), expectedOut);
}

TEST_F(OutputPumpTest, StatusLineIsCutToTheTerminalsWidth) {
  int master = -1, slave = -1;
  winsize size{};
  size.ws_col = 20;
  size.ws_row = 5;
  ASSERT_EQ(::openpty(&master, &slave, nullptr, nullptr, &size), 0);
  runtime::UniqueFd masterFd(master), slaveFd(slave);
  OutputPumpOptions o = options(1);
  o.stdoutFd = slave;
  o.liveStatus = true;
  OutputPump pump(o);
  feed(pump, 0, StreamKind::kStdout, kMarker + "epoch 1/1 step 300/938 (31%)\n");
  std::string bytes(256, '\0');
  const ssize_t n = ::read(master, bytes.data(), bytes.size());
  ASSERT_GT(n, 0);
  bytes.resize(static_cast<size_t>(n));
  // 19 characters: the cursor stays on the row, so "\r" can go back to its start.
  EXPECT_EQ(bytes, "\r[rank 0] epoch 1/1 \x1b[K");
}

}  // namespace
}  // namespace cohort::launcher
