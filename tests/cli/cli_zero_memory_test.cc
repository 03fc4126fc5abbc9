// What `cohort train` says of a rank's memory at each ZeRO stage (issue 46, item 4): --memory-report's
// estimate per rank (train/zero_memory.h, cli/memory_estimate.h) against hand-computed figures, the
// state the rank then held (Job::stateBytes()), and the memory floor's refusal (exit 5 before
// anything is allocated) naming the smallest --zero / --recompute change that fits, under a limit
// set by COHORT_TEST_MEMORY_AVAILABLE (cli/test_hooks.h) so that it falls between two stages'
// figures on any machine. Two workers under cohortrun, mode allreduce, AdamW.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

// gpt:layers=L,heads=2,dim=32,ctx=16,vocab=256 has units of 8704 (wte 256·32 + wpe 16·32), 12704 per
// block (ln_1 64, c_attn 3168, c_proj 1056, ln_2 64, c_fc 4224, the MLP's projection 4128) and 64
// (ln_f): 59584 parameters at 4 layers, 161216 at 12. At batch 2 its pass keeps (nn/gpt_memory.h,
// N·D = 2·16·32 floats = 4 KiB, S = 2·2·16² floats = 4 KiB) L·(22·4 + 4) KiB of blocks, 23·4 + 4 KiB
// of backward buffers and 6·4 KiB around the blocks, and the logits and their gradient 2·2·16·256
// floats = 64 KiB: at 4 layers 552.0 KiB.
std::string gpt(int layers) { return "gpt:layers=" + std::to_string(layers) + ",heads=2,dim=32,ctx=16,vocab=256"; }

class ZeroMemoryCliTest : public ShmDirTest {
 protected:
  void SetUp() override {
    ShmDirTest::SetUp();
    std::string text;
    for (int i = 0; i < 20000; ++i) text += static_cast<char>('a' + (i * 7 + i / 13) % 9);
    writeFile(dir_ + "/text.txt", text);
  }

  // Two workers training `model` one step at --zero `zero`, with `environment`.
  CommandResult train(const std::string& model, int zero, const std::vector<std::string>& extra = {},
                      const std::vector<std::string>& environment = {}) {
    std::vector<std::string> argv = {runfile("launcher/cohortrun"),
                                     "--nproc-per-node",
                                     "2",
                                     "--",
                                     cohortBinary(),
                                     "train",
                                     "--data",
                                     "text:" + dir_ + "/text.txt",
                                     "--model",
                                     model,
                                     "--optimizer",
                                     "adamw",
                                     "--batch-size",
                                     "2",
                                     "--max-steps",
                                     "1",
                                     "--threads",
                                     "1",
                                     "--mode",
                                     "allreduce",
                                     "--zero",
                                     std::to_string(zero),
                                     "--progress-every",
                                     "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return runCommand(argv, {.timeout = std::chrono::seconds(120), .extraEnvironment = environment});
  }
};

// 59584 parameters on 2 ranks: 4N = 232.8 KiB; the packed shard is N/2 (every unit even): 116.4 KiB
// of gradients at stage 2, 232.8 KiB of AdamW state at stages 1 and 2 (465.5 KiB at stage 0); no
// unit is padded, so stage 1 has no temporary buffers, and stage 2's are 3 gradient windows of the
// largest units, 3 blocks of 12704 floats: 148.9 KiB.
TEST_F(ZeroMemoryCliTest, TheReportCountsEachStage) {
  const std::vector<std::string> estimates = {
      "memory estimate per rank (--zero 0 over 2 rank(s), --recompute none): parameters 232.8 KiB, gradients 232.8 "
      "KiB, optimizer state 465.5 KiB, temporary buffers 0 B, activations 552.0 KiB (logits and their gradient 64.0 "
      "KiB); 1.4 MiB in all",
      "memory estimate per rank (--zero 1 over 2 rank(s), --recompute none): parameters 232.8 KiB, gradients 232.8 "
      "KiB, optimizer state 232.8 KiB, temporary buffers 0 B, activations 552.0 KiB (logits and their gradient 64.0 "
      "KiB); 1.2 MiB in all",
      "memory estimate per rank (--zero 2 over 2 rank(s), --recompute none): parameters 232.8 KiB, gradients 116.4 "
      "KiB, optimizer state 232.8 KiB, temporary buffers 148.9 KiB, activations 552.0 KiB (logits and their gradient "
      "64.0 KiB); 1.3 MiB in all"};
  // What the ranks held (Job::stateBytes()): the estimate's model state at stages 0 and 1; at stage
  // 2 the parameters and the optimizer state (its gradients are the whole buffer until the sharded
  // placement keeps only their shard).
  const std::vector<std::string> held = {
      "memory report (model state, --zero 0): parameters 232.8 KiB, gradients 232.8 KiB, optimizer state 465.5 KiB, "
      "temporary buffers 0 B",
      "memory report (model state, --zero 1): parameters 232.8 KiB, gradients 232.8 KiB, optimizer state 232.8 KiB, "
      "temporary buffers 0 B",
      "memory report (model state, --zero 2): parameters 232.8 KiB, "};
  for (int zero = 0; zero <= 2; ++zero) {
    const CommandResult r = train(gpt(4), zero, {"--memory-report"});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_EQ(linesWith(r.stdoutText, estimates[zero]).size(), 1u) << "expected " << estimates[zero] << "\n"
                                                                   << r.stdoutText;
    EXPECT_EQ(linesWith(r.stdoutText, held[zero]).size(), 2u) << "expected on both ranks " << held[zero] << "\n"
                                                              << r.stdoutText;
    if (zero != 2) continue;
    for (const std::string& line : linesWith(r.stdoutText, held[zero])) {
      EXPECT_NE(line.find("optimizer state 232.8 KiB, temporary"), std::string::npos) << line;
    }
  }
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

// 12 layers, 161216 parameters, per worker (2 of them share the limit), the state (ZeRO's Figure 1
// plus stage 2's 3 windows of 12704 floats and stage 3's 2 more) and the activations at each mode:
//   stage 0: 2579456 B  1: 1934592  2: 1764608  3: 1543808
//   activations and logits: none 1318912 B, selective 733184, full 327680
// so the floors are, at none: 3898368 (stage 0), 3253504 (1), 3083520 (2), 2862720 (3); stage 1
// with selective 2667776; stage 2 with full 2092288; stage 3 with full 1871488.
TEST_F(ZeroMemoryCliTest, ARefusalNamesTheSmallestChangeThatFits) {
  struct Case {
    size_t perWorker;  // the limit is twice this
    std::string hint;
  };
  const std::vector<Case> cases = {
      {3300000, "(COHORT_TEST_MEMORY_AVAILABLE; --zero 1 would fit (3.1 MiB per worker); or lower"},
      {3100000, "(COHORT_TEST_MEMORY_AVAILABLE; --zero 2 would fit (2.9 MiB per worker); or lower"},
      {2900000, "(COHORT_TEST_MEMORY_AVAILABLE; --zero 3 would fit (2.7 MiB per worker); or lower"},
      {2800000,
       "(COHORT_TEST_MEMORY_AVAILABLE; --zero 1 --recompute selective would fit (2.5 MiB per worker); or lower"},
      {1880000, "(COHORT_TEST_MEMORY_AVAILABLE; --zero 3 --recompute full would fit (1.8 MiB per worker); or lower"},
      {1800000, "(COHORT_TEST_MEMORY_AVAILABLE; lower"}};
  for (const Case& c : cases) {
    const CommandResult r = train(gpt(12), 0, {}, {"COHORT_TEST_MEMORY_AVAILABLE=" + std::to_string(2 * c.perWorker)});
    EXPECT_EQ(r.exitCode, 5) << r.describe();
    EXPECT_NE(r.stderrText.find("needs at least 3.7 MiB per worker"), std::string::npos) << r.describe();
    EXPECT_NE(r.stderrText.find(c.hint), std::string::npos) << "expected " << c.hint << "\n" << r.describe();
  }
  // What it names fits: stage 2 under the second limit trains.
  const CommandResult r = train(gpt(12), 2, {}, {"COHORT_TEST_MEMORY_AVAILABLE=6200000"});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

}  // namespace
}  // namespace cohort::testing
