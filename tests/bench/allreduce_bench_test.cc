// `cohort bench allreduce` end to end: two shm ranks under cohortrun (out of place and in place),
// one rank without a launcher, and bad flags. Each run gets a fresh directory for its output files
// and its shared-memory segments (COHORT_SHM_DIR), and an environment without any rank variables.
#include <fcntl.h>
#include <gtest/gtest.h>

#include "tests/support/process.h"
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>


using cohort::testing::runfile;

namespace {


std::string freshDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name() + "." + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);
  return dir;
}

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct ChildRun {
  int exitCode = -1;
  std::string out, err;
  std::string describeText;
  std::string describe() const { return describeText; }
};

// Runs argv (job variables removed) with COHORT_SHM_DIR=dir/shm; killed after 120 s.
ChildRun runIn(const std::string& dir, const std::vector<std::string>& argv) {
  std::string shm = dir + "/shm";
  ::mkdir(shm.c_str(), 0700);
  cohort::testing::CommandResult r = cohort::testing::runCommand(
      argv, {.timeout = std::chrono::seconds(120), .extraEnvironment = {"COHORT_SHM_DIR=" + shm}});
  EXPECT_FALSE(r.timedOut) << r.describe();
  return {r.exitCode, r.stdoutText, r.stderrText, r.describe()};
}

using Fields = std::map<std::string, std::string>;

// The key=value fields of every RESULT line (cohortrun prefixes "[rank k] ").
std::vector<Fields> resultLines(const std::string& text, std::vector<std::string>* prefixes = nullptr) {
  std::vector<Fields> rows;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    size_t at = line.find("RESULT ");
    if (at == std::string::npos) continue;
    if (prefixes) prefixes->push_back(line.substr(0, at));
    std::istringstream words(line.substr(at + 7));
    Fields f;
    std::string w;
    while (words >> w) {
      size_t eq = w.find('=');
      if (eq != std::string::npos) f[w.substr(0, eq)] = w.substr(eq + 1);
    }
    rows.push_back(f);
  }
  return rows;
}

// Checks the RESULT lines of a sweep: sizes, the fixed fields, wrong=0, busbw = algbw·2(n−1)/n.
void expectRows(const std::vector<Fields>& rows, const std::string& backend, int ranks,
                const std::vector<size_t>& sizes) {
  ASSERT_EQ(rows.size(), sizes.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Fields& f = rows[i];
    SCOPED_TRACE("row " + std::to_string(i));
    for (const char* key : {"bench", "backend", "ranks", "bytes", "time_us", "algbw_gbps", "busbw_gbps", "wrong",
                            "time_b2b_us", "op", "inplace", "iters", "warmup"}) {
      EXPECT_EQ(f.count(key), 1u) << key;
    }
    if (!f.count("busbw_gbps") || !f.count("time_us")) continue;
    EXPECT_EQ(f.at("bench"), "allreduce");
    EXPECT_EQ(f.at("backend"), backend);
    EXPECT_EQ(f.at("ranks"), std::to_string(ranks));
    EXPECT_EQ(f.at("bytes"), std::to_string(sizes[i]));
    EXPECT_EQ(f.at("wrong"), "0");
    double time = std::stod(f.at("time_us")), algbw = std::stod(f.at("algbw_gbps")),
           busbw = std::stod(f.at("busbw_gbps"));
    EXPECT_GT(time, 0);
    EXPECT_NEAR(algbw, sizes[i] / (time * 1e-6) / 1e9, 0.02 * algbw + 1e-3);
    EXPECT_NEAR(busbw, algbw * 2.0 * (ranks - 1) / ranks, 1e-3 + 1e-3 * algbw);
  }
}

TEST(AllReduceBench, TwoShmRanksUnderCohortrun) {
  std::string dir = freshDir();
  ChildRun r = runIn(
      dir, {runfile("launcher/cohortrun"), "--nproc-per-node", "2", "--", runfile("cli/cohort"), "bench", "allreduce",
            "--backend", "shm", "--max-bytes", "64K", "--iters", "5", "--warmup", "1", "--json", dir + "/rows.json"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  std::vector<std::string> prefixes;
  auto rows = resultLines(r.out, &prefixes);
  expectRows(rows, "shm", 2, {4096, 16384, 65536});
  for (const auto& p : prefixes) EXPECT_EQ(p, "[rank 0] ") << "only rank 0 prints results";
  for (const auto& f : rows) {
    EXPECT_EQ(f.at("op"), "sum");
    EXPECT_EQ(f.at("inplace"), "0");
    EXPECT_EQ(f.at("iters"), "5");
    EXPECT_EQ(f.at("warmup"), "1");
  }
  auto json = nlohmann::json::parse(readFile(dir + "/rows.json"));
  EXPECT_EQ(json["ranks"], 2);
  ASSERT_EQ(json["rows"].size(), 3u);
  EXPECT_EQ(json["rows"][2]["bytes"], 65536);
  EXPECT_EQ(json["rows"][2]["wrong"], 0);
}

TEST(AllReduceBench, TwoShmRanksInPlaceAverage) {
  std::string dir = freshDir();
  ChildRun r = runIn(dir, {runfile("launcher/cohortrun"),
                           "--nproc-per-node",
                           "2",
                           "--",
                           runfile("cli/cohort"),
                           "bench",
                           "allreduce",
                           "--backend",
                           "shm",
                           "--min-bytes",
                           "4",
                           "--max-bytes",
                           "64K",
                           "--step-factor",
                           "16",
                           "--iters",
                           "3",
                           "--warmup",
                           "1",
                           "--in-place",
                           "--op",
                           "avg"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  auto rows = resultLines(r.out);
  expectRows(rows, "shm", 2, {4, 64, 1024, 16384});
  for (const auto& f : rows) {
    EXPECT_EQ(f.at("op"), "avg");
    EXPECT_EQ(f.at("inplace"), "1");
  }
}

TEST(AllReduceBench, OneRankWithoutLauncher) {
  std::string dir = freshDir();
  ChildRun r = runIn(dir, {runfile("cli/cohort"), "bench", "allreduce", "--max-bytes", "16K", "--iters", "3",
                           "--warmup", "1", "--op", "max"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  auto rows = resultLines(r.out);
  ASSERT_FALSE(rows.empty()) << r.describe();
  expectRows(rows, rows[0]["backend"], 1, {4096, 16384});
  EXPECT_EQ(rows[0]["busbw_gbps"], "0.0000");
  EXPECT_NE(r.out.find("# cohort bench allreduce"), std::string::npos) << r.out;
}

TEST(AllReduceBench, BadFlagsAreUsageErrors) {
  std::string dir = freshDir();
  for (std::vector<std::string> flags : {std::vector<std::string>{"--min-bytes", "6"},
                                         {"--max-bytes", "12Q"},
                                         {"--op", "prod"},
                                         {"--step-factor", "1"},
                                         {"--min-bytes", "1M", "--max-bytes", "4K"}}) {
    std::vector<std::string> argv = {runfile("cli/cohort"), "bench", "allreduce"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ChildRun r = runIn(dir, argv);
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE(r.err.find("cohort: error:"), std::string::npos) << r.describe();
  }
}

}  // namespace
