// `cohort bench allreduce` end to end: two shm ranks under cohortrun (out of place and in place),
// one rank without a launcher, and bad flags; in each run the table for people and the RESULT lines
// for scripts. Each run gets a fresh directory for its output files and its shared-memory segments
// (COHORT_SHM_DIR), and an environment without any rank variables.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/process.h"

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
    // time_us is printed rounded (to its last printed digit): a time of a few tens of nanoseconds
    // (one rank, small sizes) is off by up to half that digit, a few percent of itself.
    const std::string& printed = f.at("time_us");
    const size_t point = printed.find('.');
    const int decimals = point == std::string::npos ? 0 : static_cast<int>(printed.size() - point - 1);
    const double rounding = 0.5 * std::pow(10.0, -decimals) / time;
    EXPECT_NEAR(algbw, sizes[i] / (time * 1e-6) / 1e9, (0.02 + rounding) * algbw + 1e-3);
    EXPECT_NEAR(busbw, algbw * 2.0 * (ranks - 1) / ranks, 1e-3 + 1e-3 * algbw);
  }
}

// The RESULT lines are read by scripts (bench/compare_allreduce_peers.sh's sed) and tests: every
// field in this order and with these decimals, as bench/README.md and the header describe them.
void expectResultLineFormat(const std::string& text) {
  const std::regex format(
      R"(RESULT bench=allreduce backend=\w+ ranks=\d+ bytes=\d+ time_us=\d+\.\d\d algbw_gbps=\d+\.\d{4} )"
      R"(busbw_gbps=\d+\.\d{4} wrong=\d+ time_b2b_us=\d+\.\d\d time_min_us=\d+\.\d\d time_max_us=\d+\.\d\d )"
      R"(op=\w+ inplace=[01] buffers=(shared|user) iters=\d+ warmup=\d+ collective=\w+ dtype=(fp32|bf16))");
  // What compare_allreduce_peers.sh extracts: bytes, time_us, busbw_gbps, wrong.
  const std::regex script(R"(.*RESULT bench=allreduce .* bytes=([0-9]+) time_us=([0-9.]+) .* busbw_gbps=([0-9.]+) )"
                          R"(wrong=([0-9]+).*)");
  std::istringstream lines(text);
  int count = 0;
  for (std::string line; std::getline(lines, line);) {
    size_t at = line.find("RESULT ");
    if (at == std::string::npos) continue;
    ++count;
    EXPECT_TRUE(std::regex_match(line.substr(at), format)) << line;
    EXPECT_TRUE(std::regex_match(line, script)) << line;
  }
  EXPECT_GT(count, 0) << text;
}

// The table for people (nccl-tests' layout): '#' header lines naming the columns and the mode, one
// row per size that agrees with that size's RESULT line, and '#' closing lines, all before the
// first RESULT line.
void expectTable(const std::string& text, const std::vector<Fields>& results, const std::string& mode) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("[rank 0] ", 0) == 0) line.erase(0, 9);  // cohortrun's prefix
    if (line.rfind("RESULT ", 0) == 0) break;
    lines.push_back(line);
  }
  const std::regex columns(R"(#\s+size\s+count\s+type\s+redop\s+time\s+algbw\s+busbw\s+#wrong)");
  size_t header = 0;
  while (header < lines.size() && !std::regex_match(lines[header], columns)) ++header;
  ASSERT_LT(header, lines.size()) << "no column header before the RESULT lines:\n" << text;
  ASSERT_GE(header, 1u);
  ASSERT_LT(header + 1, lines.size());
  EXPECT_TRUE(std::regex_match(lines[header - 1], std::regex("#\\s+" + mode))) << lines[header - 1];
  EXPECT_TRUE(
      std::regex_match(lines[header + 1], std::regex(R"(#\s+\(B\)\s+\(elements\)\s+\(us\)\s+\(GB/s\)\s+\(GB/s\))")))
      << lines[header + 1];
  size_t row = header + 2;
  for (const Fields& f : results) {
    ASSERT_LT(row, lines.size()) << "a table row is missing:\n" << text;
    std::istringstream words(lines[row++]);
    std::string size, count, type, op, time, algbw, busbw, wrong, extra;
    words >> size >> count >> type >> op >> time >> algbw >> busbw >> wrong;
    EXPECT_FALSE(words >> extra) << lines[row - 1];
    EXPECT_EQ(size, f.at("bytes"));
    EXPECT_EQ(count, std::to_string(std::stoull(f.at("bytes")) / 4));
    EXPECT_EQ(type, "float");
    EXPECT_EQ(op, f.at("op"));
    EXPECT_NEAR(std::stod(time), std::stod(f.at("time_us")), 0.5 + 1e-3 * std::stod(f.at("time_us")));
    EXPECT_NEAR(std::stod(algbw), std::stod(f.at("algbw_gbps")), 0.0051);
    EXPECT_NEAR(std::stod(busbw), std::stod(f.at("busbw_gbps")), 0.0051);
    EXPECT_EQ(wrong, f.at("wrong"));
  }
  ASSERT_LT(row + 1, lines.size()) << text;
  EXPECT_EQ(lines[row], "# Wrong elements    : 0 OK");
  EXPECT_EQ(lines[row + 1].rfind("# Avg bus bandwidth : ", 0), 0u) << lines[row + 1];
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
  expectResultLineFormat(r.out);
  expectTable(r.out, rows, "out-of-place");
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
  expectResultLineFormat(r.out);
  expectTable(r.out, rows, "in-place");
  for (const auto& f : rows) {
    EXPECT_EQ(f.at("op"), "avg");
    EXPECT_EQ(f.at("inplace"), "1");
  }
}

// `cohort bench allreduce` under cohortrun on two shm ranks, with `flags`.
std::vector<std::string> twoShmRanks(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {runfile("launcher/cohortrun")};
  for (const char* word : {"--nproc-per-node", "2", "--"}) argv.emplace_back(word);
  argv.push_back(runfile("cli/cohort"));
  for (const char* word : {"bench", "allreduce", "--backend", "shm"}) argv.emplace_back(word);
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

// Reduce-scatter and all-gather beside all-reduce, in fp32 and bf16, in NCCL's in-place layout:
// a row per collective, element type and size, each checked exactly (wrong=0), with the bus factor
// of its collective ((n-1)/n for reduce-scatter and all-gather).
TEST(AllReduceBench, ReduceScatterAndAllGatherInBothTypes) {
  std::string dir = freshDir();
  ChildRun r = runIn(dir, twoShmRanks({"--min-bytes", "4K", "--max-bytes", "1M", "--step-factor", "16", "--iters", "3",
                                       "--warmup", "1", "--in-place", "--collectives",
                                       "allreduce,reducescatter,allgather", "--dtypes", "fp32,bf16"}));
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  expectResultLineFormat(r.out);
  const auto rows = resultLines(r.out);
  ASSERT_EQ(rows.size(), 3u * 2u * 3u) << r.out;
  std::map<std::string, int> perCase;
  for (const auto& f : rows) {
    ++perCase[f.at("collective") + " " + f.at("dtype")];
    EXPECT_EQ(f.at("wrong"), "0") << f.at("collective") << " " << f.at("dtype") << " " << f.at("bytes");
    const double factor = f.at("collective") == "allreduce" ? 1.0 : 0.5;
    EXPECT_NEAR(std::stod(f.at("busbw_gbps")), std::stod(f.at("algbw_gbps")) * factor,
                1e-3 + 1e-3 * std::stod(f.at("algbw_gbps")));
  }
  for (const char* c : {"allreduce", "reducescatter", "allgather"}) {
    for (const char* t : {"fp32", "bf16"}) EXPECT_EQ((perCase[std::string(c) + " " + t]), 3) << c << " " << t;
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
  expectResultLineFormat(r.out);
  expectTable(r.out, rows, "out-of-place");
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
