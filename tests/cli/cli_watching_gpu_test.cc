// Watching a run on a GPU (issue 47; tags = ["gpu"], skips with the reason without a device): the
// evaluations at steps, the step lines (no loss: it stays on the device; MFU against --peak-flops),
// and a sample drawn from the device's parameters copied to the CPU: what `cohort generate` prints
// from the checkpoint of that step. Run on the emulated device (cudasim) only, not on real hardware.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

TEST(WatchingGpuTest, EvaluationsStepLinesAndSamplesFromTheDevice) {
  CommandResult devices = runCohort({"devices"});
  ASSERT_EQ(devices.exitCode, 0) << devices.describe();
  if (devices.stdoutText.find("CUDA devices: 0 (") != std::string::npos) GTEST_SKIP() << "no CUDA device";
  const std::string dir = freshTempDir(), checkpoint = dir + "/c.st";
  std::string text;
  for (int i = 0; i < 400; ++i) text += i % 3 ? "the cat sees a dog. " : "a bird finds the river. ";
  writeFile(dir + "/corpus.txt", text);
  CommandResult r = runCohort({"train",
                               "--device",
                               "cuda",
                               "--model",
                               "gpt:layers=1,heads=2,dim=32,ctx=16",
                               "--data",
                               "text:" + dir + "/corpus.txt",
                               "--optimizer",
                               "adamw",
                               "--lr",
                               "0.01",
                               "--batch-size",
                               "8",
                               "--progress-every",
                               "0",
                               "--max-steps",
                               "4",
                               "--eval-every",
                               "2",
                               "--log-every-steps",
                               "2",
                               "--sample-every",
                               "4",
                               "--sample-tokens",
                               "12",
                               "--sample-prompt",
                               "the",
                               "--peak-flops",
                               "1e12",
                               "--checkpoint",
                               checkpoint},
                              {.timeout = std::chrono::seconds(300)});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  for (const char* step : {"eval step 0 (epoch 1): test_loss ", "eval step 2 (epoch 1): test_loss ",
                           "eval step 4 (epoch 1): test_loss "}) {
    const size_t at = r.stdoutText.find(step);
    ASSERT_NE(at, std::string::npos) << step << "\n" << r.stdoutText;
    // The evaluation's own figures: before the loss's device sums were collected first, an evaluation
    // between steps counted the training steps' sums too (test_acc above 1, the loss far above ln 256).
    double loss = 0, accuracy = 0;
    ASSERT_EQ(std::sscanf(r.stdoutText.c_str() + at + std::string(step).size(), "%lf test_ppl %*f test_acc %lf", &loss,
                          &accuracy),
              2)
        << r.stdoutText.substr(at, 120);
    EXPECT_LT(loss, 5.9) << step << "\n" << r.stdoutText;
    EXPECT_LE(accuracy, 1.0) << step << "\n" << r.stdoutText;
  }
  EXPECT_NE(r.stdoutText.find("step 2/4 | lr 0.01 | norm "), std::string::npos) << r.stdoutText;
  EXPECT_NE(r.stdoutText.find("tokens/s | MFU "), std::string::npos) << r.stdoutText;
  const std::string marker = "sample at step 4 (12 tokens): ";
  const size_t at = r.stdoutText.find(marker);
  ASSERT_NE(at, std::string::npos) << r.stdoutText;
  const size_t from = at + marker.size(), end = r.stdoutText.find("\n[rank ", from);
  const std::string sample = r.stdoutText.substr(from, end - from);
  CommandResult generated = runCohort({"generate", "--checkpoint", checkpoint, "--prompt", "the", "--tokens", "12",
                                       "--seed", "1337", "--temperature", "1", "--top-k", "0"});
  ASSERT_EQ(generated.exitCode, 0) << generated.describe();
  // generate prints the prompt, the sample and a newline; the trainer shows control bytes as \xNN.
  std::string shown;
  for (char c : generated.stdoutText.substr(3, generated.stdoutText.size() - 4)) {
    const auto byte = static_cast<unsigned char>(c);
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", byte);
    shown += (byte < 0x20 && c != '\n' && c != '\t') || byte == 0x7f ? std::string(hex) : std::string(1, c);
  }
  EXPECT_EQ(generated.stdoutText.substr(0, 3), "the");
  EXPECT_EQ(sample, shown);
}

}  // namespace
}  // namespace cohort::testing
