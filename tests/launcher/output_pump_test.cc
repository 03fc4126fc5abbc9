// OutputPump: prefixes, partial and long lines, the tail ring buffer and log files. The "terminal" is
// a pair of temporary files; worker output arrives through a real pipe.
#include "launcher/output_pump.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "runtime/error.h"
#include "runtime/unique_fd.h"
#include "tests/launcher/launcher_test_support.h"

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

TEST_F(OutputPumpTest, DrainReportsEndOfFile) {
  OutputPump pump(options(1));
  feed(pump, 0, StreamKind::kStdout, "last words");
  pipeWrite_.reset();
  EXPECT_FALSE(pump.drain(pipeRead_.get(), 0, StreamKind::kStdout));
  pump.flushPartial(0, StreamKind::kStdout);
  EXPECT_EQ(out(), "[rank 0] last words\n");
}

}  // namespace
}  // namespace cohort::launcher
