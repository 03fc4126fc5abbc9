// --tensorboard end to end (issue 18): a 2-worker allreduce run's event file, decoded by the
// independent reader (tests/train/tensorboard_reader.py: its own CRC32C and protobuf wire decoding),
// holds exactly the metrics file's figures — every numeric value of every epoch and step line, at its
// step, under its documented tag, rounded to float32 — and every record's CRCs check. A directory
// rank 0 cannot write fails before training.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_test_support.h"
#include "tests/support/process.h"

namespace cohort::testing {
namespace {

using nlohmann::json;

// docs/observing.md's tags, written out here independently of the trainer's code.
std::string expectedTag(const std::string& key, bool stepLine) {
  static const std::map<std::string, std::string> kRenamed = {
      {"train_loss", "train/loss"}, {"train_acc", "train/accuracy"}, {"test_loss", "test/loss"}, {"test_acc", "test/accuracy"}};
  static const std::set<std::string> kTime = {"step_ms",    "compute_ms", "forward_ms",   "backward_ms",
                                              "optimizer_ms", "comm_ms",  "barrier_ms",   "data_ms",
                                              "busbw_gbps", "slowest_rank", "slowest_margin", "others_barrier_ms"};
  if (stepLine) return "steps/" + key;
  if (kRenamed.count(key)) return kRenamed.at(key);
  if (kTime.count(key)) return "time/" + key;
  return key;
}

class TensorBoardCliTest : public ShmDirTest {};

TEST_F(TensorBoardCliTest, TheEventFileHoldsExactlyTheMetrics) {
  const std::string tb = dir_ + "/tb", metrics = dir_ + "/m.jsonl";
  CommandResult r = runCommand({runfile("launcher/cohortrun"), "--nproc-per-node", "2", "--", cohortBinary(), "train",
                                "--mode", "allreduce", "--model", "mlp:784,32,10", "--epochs", "2", "--threads", "1",
                                "--log-every-steps", "100", "--step-report", "--metrics", metrics, "--tensorboard", tb},
                               {.timeout = std::chrono::seconds(240)});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::vector<std::string> files = listDir(tb);
  ASSERT_EQ(files.size(), 1u) << "rank 0 alone writes one event file";
  EXPECT_EQ(files[0].rfind("events.out.tfevents.", 0), 0u) << files[0];

  CommandResult read = runCommand({"/usr/bin/python3", runfile("tests/train/tensorboard_reader.py"), tb + "/" + files[0]});
  ASSERT_EQ(read.exitCode, 0) << read.describe();
  // (tag, step) -> value, and the records' count.
  std::map<std::pair<std::string, int64_t>, double> scalars;
  int versions = 0, records = 0;
  std::istringstream lines(read.stdoutText);
  for (std::string line; std::getline(lines, line);) {
    json e = json::parse(line);
    ++records;
    if (e.contains("file_version")) {
      EXPECT_EQ(e["file_version"], "brain.Event:2");
      ++versions;
      continue;
    }
    const auto key = std::make_pair(e.at("tag").get<std::string>(), e.at("step").get<int64_t>());
    EXPECT_EQ(scalars.count(key), 0u) << "twice: " << line;
    scalars[key] = e.at("value").get<double>();
  }
  EXPECT_EQ(versions, 1);

  size_t expected = 0, epochLines = 0, stepLines = 0;
  std::istringstream m(readFile(metrics));
  for (std::string line; std::getline(m, line);) {
    json j = json::parse(line);
    const bool stepLine = !j.contains("run_samples_per_s");
    (stepLine ? stepLines : epochLines)++;
    const int64_t step = j.at("step");
    for (const auto& [key, value] : j.items()) {
      if (key == "epoch" || key == "step" || !value.is_number()) continue;
      ++expected;
      auto it = scalars.find({expectedTag(key, stepLine), step});
      ASSERT_NE(it, scalars.end()) << "no scalar " << expectedTag(key, stepLine) << " at step " << step << " for " << line;
      EXPECT_EQ(it->second, static_cast<double>(static_cast<float>(value.get<double>()))) << key << " at step " << step;
    }
  }
  EXPECT_EQ(epochLines, 2u);
  EXPECT_EQ(stepLines, 9u);  // 938 steps in all, a line every 100
  EXPECT_EQ(scalars.size(), expected) << "the event file holds nothing the metrics do not";
  EXPECT_EQ(records, static_cast<int>(expected) + 1);
  EXPECT_TRUE(scalars.count({"train/accuracy", 938})) << "the last epoch's accuracy at its step";
  EXPECT_TRUE(scalars.count({"time/slowest_rank", 469}));
}

TEST_F(TensorBoardCliTest, ADirectoryThatCannotBeWrittenFailsBeforeTraining) {
  writeFile(dir_ + "/file", "not a directory");
  CommandResult r = runCohort({"train", "--model", "mlp:784,8,10", "--tensorboard", dir_ + "/file/tb"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find(dir_ + "/file/tb"), std::string::npos) << r.stderrText;
  EXPECT_EQ(r.stdoutText.find("epoch 1/"), std::string::npos) << "nothing was trained";
}

}  // namespace
}  // namespace cohort::testing
