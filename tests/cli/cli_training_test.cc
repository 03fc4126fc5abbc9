// `cohort train` on the synthetic task (docs/data.md) reaches the accuracy the peer frameworks
// reach, improves with more epochs, and writes one metrics line per epoch; `cohort devices` reports
// the host and the CUDA devices (or why there are none).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

// The reference configuration of the peer benchmarks: mlp:784,512,256,10, batch 64, SGD lr 0.05
// with momentum 0.9, one epoch. About 3-4 s per run on one core.
std::vector<std::string> referenceRun(int seed, int epochs) {
  return {"train",
          "--mode",
          "local",
          "--data",
          "synthetic",
          "--model",
          "mlp:784,512,256,10",
          "--epochs",
          std::to_string(epochs),
          "--batch-size",
          "64",
          "--lr",
          "0.05",
          "--momentum",
          "0.9",
          "--seed",
          std::to_string(seed),
          "--threads",
          "1"};
}

double testAccuracy(const std::vector<std::string>& args) {
  CommandResult r = runCohort(args);
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  ResultLine result = parseResultLine(r.stdoutText);
  EXPECT_EQ(result.count, 1) << r.describe();
  return result.number("test_acc");
}

// One epoch at lr 0.05 with momentum 0.9 is noisy: over seeds 0..9 the test accuracy was
// 0.741 0.759 0.731 0.756 0.750 0.746 0.754 0.753 0.751 0.738, a spread of about +-0.015 around
// 0.75 (PyTorch reaches 0.758 with its one seed). So the median of five seeds must reach 0.74, and
// no single run may fall below 0.70 (which would mean a real regression, not seed noise).
TEST(CliTrainingTest, SyntheticOneEpochAccuracyMatchesPeers) {
  std::vector<double> accuracies;
  for (int seed = 0; seed < 5; ++seed) {
    double acc = testAccuracy(referenceRun(seed, 1));
    EXPECT_GE(acc, 0.70) << "seed " << seed;
    accuracies.push_back(acc);
  }
  std::vector<double> sorted = accuracies;
  std::sort(sorted.begin(), sorted.end());
  std::ostringstream all;
  for (double a : accuracies) all << a << " ";
  EXPECT_GE(sorted[2], 0.74) << "median of seeds 0..4; all: " << all.str();
}

// The value of "KEY": in one JSON line, or NaN.
// Three epochs (seed 0: 0.792) beat one (0.741). There is no learning-rate schedule, so epoch 1 of
// the three-epoch run is exactly the one-epoch run; the metrics file shows it.
TEST(CliTrainingTest, MoreEpochsReachHigherAccuracyAndMetricsHaveOneLinePerEpoch) {
  const std::string dir = freshTempDir();
  const double oneEpoch = testAccuracy(referenceRun(0, 1));
  std::vector<std::string> args = referenceRun(0, 3);
  args.push_back("--metrics");
  args.push_back(dir + "/metrics.jsonl");
  const double threeEpochs = testAccuracy(args);
  EXPECT_GT(threeEpochs, oneEpoch);

  std::istringstream metrics(readFile(dir + "/metrics.jsonl"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(metrics, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].front(), '{') << lines[i];
    EXPECT_EQ(lines[i].back(), '}') << lines[i];
    EXPECT_EQ(jsonNumber(lines[i], "epoch"), static_cast<double>(i + 1)) << lines[i];
    EXPECT_NE(lines[i].find("\"train_loss\":"), std::string::npos) << lines[i];
    EXPECT_NE(lines[i].find("\"test_acc\":"), std::string::npos) << lines[i];
  }
  EXPECT_NEAR(jsonNumber(lines[0], "test_acc"), oneEpoch, 1e-4);  // RESULT prints 6 digits
  EXPECT_NEAR(jsonNumber(lines[2], "test_acc"), threeEpochs, 1e-4);
  // 938 steps per epoch (60000 / 64, the last batch partial).
  EXPECT_EQ(jsonNumber(lines[2], "step"), 3 * 938.0);
}

// --decay-steps ends the cosine at that step, not at the last of --epochs (nanoGPT's lr_decay_iters):
// from 10 to 0 over 300 steps, then 0 for the rest of the epoch's 938.
TEST(CliTrainingTest, DecayStepsEndTheCosineWhereTheyAreGiven) {
  const std::string dir = freshTempDir();
  CommandResult r = runCohort({"train", "--model", "mlp:784,16,10", "--batch-size", "64", "--threads", "1",
                               "--lr", "0.1", "--lr-schedule", "cosine", "--decay-steps", "300", "--log-every-steps",
                               "150", "--max-steps", "450", "--metrics", dir + "/m.jsonl"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  std::istringstream metrics(readFile(dir + "/m.jsonl"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(metrics, line);) lines.push_back(line);
  ASSERT_GE(lines.size(), 3u) << readFile(dir + "/m.jsonl");
  // The rate of the step just taken (step s uses lrAt(s - 1)): halfway at 150, 0 from 300 on.
  EXPECT_NEAR(jsonNumber(lines[0], "lr"), 0.05 * (1 + std::cos(M_PI * 149 / 300)), 1e-7) << lines[0];
  EXPECT_NEAR(jsonNumber(lines[1], "lr"), 0.05 * (1 + std::cos(M_PI * 299 / 300)), 1e-9) << lines[1];
  EXPECT_EQ(jsonNumber(lines[2], "lr"), 0) << lines[2];
}

// Issue 16, item 6: the epoch line's samples_per_s is the epoch's figure, as on the console, with lr;
// --log-every-steps adds a line every N steps with the learning rate of the schedule.
TEST(CliTrainingTest, MetricsCarryTheEpochsThroughputTheLearningRateAndStepLines) {
  const std::string dir = freshTempDir();
  CommandResult r = runCohort({"train", "--model", "mlp:784,16,10", "--epochs", "2", "--batch-size", "64", "--threads", "1",
                               "--lr-schedule", "step", "--step-size", "900", "--gamma", "0.5", "--log-every-steps", "400",
                               "--metrics", dir + "/m.jsonl"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  std::istringstream metrics(readFile(dir + "/m.jsonl"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(metrics, line);) lines.push_back(line);
  // Steps 400, 800, (epoch 1 at 938), 1200, 1600, (epoch 2 at 1876).
  ASSERT_EQ(lines.size(), 6u) << readFile(dir + "/m.jsonl");
  const double steps[] = {400, 800, 938, 1200, 1600, 1876};
  const double lrs[] = {0.05, 0.05, 0.025, 0.025, 0.025, 0.0125};  // the step just taken: x0.5 from step 900, 1800
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(jsonNumber(lines[i], "step"), steps[i]) << lines[i];
    EXPECT_NEAR(jsonNumber(lines[i], "lr"), lrs[i], 1e-9) << lines[i];
    EXPECT_GT(jsonNumber(lines[i], "samples_per_s"), 0) << lines[i];
    EXPECT_GT(jsonNumber(lines[i], "grad_norm"), 0) << lines[i];  // the window's mean (epoch lines: the epoch's)
  }
  // Epoch lines: the gradient norm's mean and largest over the epoch, and the skipped steps (none).
  for (size_t i : {2, 5}) {
    EXPECT_GE(jsonNumber(lines[i], "grad_norm_max"), jsonNumber(lines[i], "grad_norm")) << lines[i];
    EXPECT_EQ(jsonNumber(lines[i], "skipped_steps"), 0) << lines[i];
  }
  // The epoch lines' throughput is the epoch's, the figure the console shows for it.
  for (int epoch : {1, 2}) {
    const std::string& line = lines[epoch == 1 ? 2 : 5];
    const auto printed = linesWith(r.stdoutText, "epoch " + std::to_string(epoch) + "/2");
    ASSERT_EQ(printed.size(), 1u) << r.stdoutText;
    const std::string& console = printed[0];
    const double shown = std::strtod(console.c_str() + console.find("samples/s ") + 10, nullptr);
    EXPECT_EQ(static_cast<int64_t>(jsonNumber(line, "samples_per_s")), static_cast<int64_t>(shown)) << line << "\n" << console;
    EXPECT_FALSE(std::isnan(jsonNumber(line, "run_samples_per_s"))) << line;
  }
}

TEST(CliTrainingTest, MetricsAppendAcrossRuns) {
  const std::string dir = freshTempDir();
  writeFile(dir + "/m.jsonl", "");
  for (int run = 0; run < 2; ++run) {
    CommandResult r = runCohort({"train", "--model", "mlp:784,8,10", "--epochs", "1", "--max-steps", "5",
                                 "--batch-size", "64", "--threads", "1", "--metrics", dir + "/m.jsonl"});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
  }
  const std::string text = readFile(dir + "/m.jsonl");
  EXPECT_EQ(countLines(text), 2) << text;
}

TEST(CliDevicesTest, PrintsHostAndCudaDevices) {
  CommandResult r = runCohort({"devices"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.stderrText, "");
  EXPECT_EQ(r.stdoutText.rfind("Host: ", 0), 0u) << r.describe();
  EXPECT_NE(r.stdoutText.find("logical cores"), std::string::npos) << r.describe();
  size_t cuda = r.stdoutText.find("\nCUDA devices: ");
  ASSERT_NE(cuda, std::string::npos) << r.describe();
  if (r.stdoutText.compare(cuda, 18, "\nCUDA devices: 0 (") == 0) {
    // No device: the reason is given (no driver, no device, or a CPU-only build).
    const bool reason = r.stdoutText.find("no CUDA device") != std::string::npos ||
                        r.stdoutText.find("CUDA support not compiled in") != std::string::npos;
    EXPECT_TRUE(reason) << r.describe();
  } else {
    EXPECT_NE(r.stdoutText.find("cuda:0"), std::string::npos) << r.describe();
  }
}

}  // namespace
}  // namespace cohort::testing
