// `cohort train --device cuda` end to end (tags = ["gpu"]; skips with the reason when the cohort
// binary sees no CUDA device): the MLP workload reaches the accuracy it reaches on the CPU, the
// memory report and the input wait are printed, a GPU checkpoint resumes, the batch-norm LeNet
// learns cli_cnn_test's MNIST-shaped task on the GPU, and cnn:rosetta trains there with --augment.
// GPU Hogwild (issue 7): 4 workers sharing one GPU's parameters through CUDA IPC reach the single-GPU
// accuracy; killing the owner (local rank 0) makes the other worker exit with a clear error.
// --gemm-tuning reaches the GPU (off: a line says so) and the flag wins over COHORT_GEMM_TUNING.
// All-reduce over NCCL with one rank runs the bucket path and matches a local GPU run; two workers on
// two GPUs train like one GPU with their combined batch, and at --zero 2 write a sharded checkpoint
// that `cohort eval` reads on the CPU.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/sharded_checkpoint.h"
#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

class CliGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandResult devices = runCohort({"devices"});
    ASSERT_EQ(devices.exitCode, 0) << devices.describe();
    size_t none = devices.stdoutText.find("CUDA devices: 0 (");
    if (none != std::string::npos) {
      GTEST_SKIP() << "no CUDA device: " << devices.stdoutText.substr(none, devices.stdoutText.find('\n', none) - none);
    }
    dir_ = freshTempDir();
    // On the emulated device (cudasim, where CI runs these tests) the MLP tests train a smaller MLP:
    // the same code paths, a tenth of the arithmetic on a CPU that plays the GPU. So do they under
    // compute-sanitizer (COHORT_GPU_TEST_UNDER_SANITIZER=1, scripts/gpu_run.sh), which slows every kernel.
    const char* quick = std::getenv("COHORT_GPU_TEST_UNDER_SANITIZER");
    if (devices.stdoutText.find("cudasim emulated GPU") != std::string::npos || (quick && *quick == '1')) {
      mlp_ = {"--model", "mlp:784,64,10"};
    }
  }
  // `args` with the MLP of this device's runs.
  std::vector<std::string> withMlp(std::vector<std::string> args) const {
    args.insert(args.end(), mlp_.begin(), mlp_.end());
    return args;
  }
  std::string dir_;
  std::vector<std::string> mlp_;
};

TEST_F(CliGpuTest, SyntheticMlpReachesTheCpuAccuracy) {
  const std::vector<std::string> common = {"train",      "--epochs", "1",      "--lr", "0.05",
                                           "--momentum", "0.9",      "--seed", "0"};
  std::vector<std::string> gpuArgs = withMlp(common), cpuArgs = withMlp(common);
  for (const char* a : {"--device", "cuda", "--memory-report"}) gpuArgs.push_back(a);
  CommandResult gpu = runCohort(gpuArgs);
  ASSERT_EQ(gpu.exitCode, 0) << gpu.describe();
  CommandResult cpu = runCohort(cpuArgs);
  ASSERT_EQ(cpu.exitCode, 0) << cpu.describe();
  ResultLine g = parseResultLine(gpu.stdoutText), c = parseResultLine(cpu.stdoutText);
  EXPECT_GE(g.number("test_acc"), 0.72) << gpu.describe();
  EXPECT_NEAR(g.number("test_acc"), c.number("test_acc"), 0.02) << "GPU and CPU runs from the same seed\n"
                                                                << gpu.describe();
  EXPECT_NE(gpu.stdoutText.find("memory report (cuda:0 caching allocator): allocated"), std::string::npos)
      << gpu.describe();
  EXPECT_NE(gpu.stdoutText.find("input wait on cuda:0"), std::string::npos) << gpu.describe();
}

TEST_F(CliGpuTest, CheckpointOnGpuResumes) {
  const std::string ckpt = dir_ + "/gpu.st";
  std::vector<std::string> args = withMlp({"train", "--device", "cuda", "--epochs", "2", "--momentum", "0.9",
                                            "--checkpoint", ckpt});
  std::vector<std::string> first = args;
  for (const char* a : {"--max-steps", "300"}) first.push_back(a);
  CommandResult a = runCohort(first);
  ASSERT_EQ(a.exitCode, 0) << a.describe();
  ASSERT_TRUE(fileExists(ckpt));
  std::vector<std::string> second = args;
  second.push_back("--resume");
  CommandResult b = runCohort(second);
  ASSERT_EQ(b.exitCode, 0) << b.describe();
  EXPECT_NE(b.stdoutText.find("resumed from"), std::string::npos) << b.describe();
  EXPECT_GE(parseResultLine(b.stdoutText).number("test_acc"), 0.72) << b.describe();
}

// A small GPT on byte-level text (issue 20) steps on the GPU as on the CPU: from the same seed, 10
// AdamW steps end with parameters within 1e-3 of the CPU run's and the same test loss to 1e-3
// (the GPU's sums run in another order), reported per token with its perplexity.
TEST_F(CliGpuTest, GptOnTextStepsAsOnTheCpu) {
  std::string text;
  for (int i = 0; text.size() < 6000; ++i) text += (i % 3 ? "the cat sees a dog. " : "a bird finds the door. ");
  writeFile(dir_ + "/text.txt", text);
  auto run = [&](const std::string& device) {
    return runCohort({"train", "--device", device, "--model", "gpt:layers=1,heads=2,dim=16,ctx=8", "--data",
                      "text:" + dir_ + "/text.txt", "--optimizer", "adamw", "--lr", "0.01", "--batch-size", "8",
                      "--max-steps", "10", "--epochs", "1", "--progress-every", "0", "--checkpoint",
                      dir_ + "/" + device + ".st"});
  };
  CommandResult gpu = run("cuda");
  ASSERT_EQ(gpu.exitCode, 0) << gpu.describe();
  CommandResult cpu = run("cpu");
  ASSERT_EQ(cpu.exitCode, 0) << cpu.describe();
  ResultLine g = parseResultLine(gpu.stdoutText), c = parseResultLine(cpu.stdoutText);
  EXPECT_NEAR(g.number("test_loss"), c.number("test_loss"), 1e-3) << gpu.describe() << cpu.describe();
  EXPECT_NEAR(g.number("test_ppl"), std::exp(g.number("test_loss")), 1e-3 * g.number("test_ppl")) << gpu.describe();
  EXPECT_GT(expectSameParameters(dir_ + "/cpu.st", dir_ + "/cuda.st", 1e-3, "GPU against CPU"), 10);
}

// --cuda-graphs (on by default): the steps replayed from the captured graph end where uncaptured
// steps end, bit for bit (the checkpoints' parameters and optimizer state, the RESULT line's test
// loss); 10 steps of 8 windows.
TEST_F(CliGpuTest, CudaGraphsChangeNothingInTheResult) {
  std::string text;
  for (int i = 0; text.size() < 3000; ++i) text += (i % 3 ? "the cat sees a dog. " : "a bird finds the door. ");
  writeFile(dir_ + "/text.txt", text);
  auto run = [&](const std::string& graphs) {
    return runCohort({"train", "--device", "cuda", "--model", "gpt:layers=1,heads=2,dim=16,ctx=8", "--data",
                      "text:" + dir_ + "/text.txt", "--optimizer", "adamw", "--lr", "0.01", "--batch-size", "8",
                      "--max-steps", "10", "--epochs", "1", "--progress-every", "0", "--cuda-graphs", graphs,
                      "--checkpoint", dir_ + "/" + graphs + ".st"});
  };
  CommandResult on = run("on");
  ASSERT_EQ(on.exitCode, 0) << on.describe();
  EXPECT_EQ((on.stdoutText + on.stderrText).find("CUDA graphs off"), std::string::npos) << on.describe();
  CommandResult off = run("off");
  ASSERT_EQ(off.exitCode, 0) << off.describe();
  EXPECT_EQ(parseResultLine(on.stdoutText).number("test_loss"), parseResultLine(off.stdoutText).number("test_loss"));
  expectIdenticalCheckpoints(dir_ + "/off.st", dir_ + "/on.st", "graphs against none");
}

// --gemm-tuning reaches the job's GpuContext: off, rank 0 says so and names the flag; without the flag
// COHORT_GEMM_TUNING=off turns it off and is named; the flag wins over the environment (on: no line);
// bench train takes the flag too and refuses a value other than on or off (exit 2, one line).
TEST_F(CliGpuTest, GemmTuningFlagReachesTheGpu) {
  std::string text;
  for (int i = 0; text.size() < 2000; ++i) text += (i % 3 ? "the cat sees a dog. " : "a bird finds the door. ");
  writeFile(dir_ + "/text.txt", text);
  auto run = [&](std::vector<std::string> extra, const std::vector<std::string>& environment) {
    std::vector<std::string> argv = {"train", "--device", "cuda", "--model", "gpt:layers=1,heads=2,dim=16,ctx=8",
                                     "--data", "text:" + dir_ + "/text.txt", "--batch-size", "8", "--max-steps", "2",
                                     "--epochs", "1", "--progress-every", "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    CommandResult r = runCohort(argv, {.extraEnvironment = environment});
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    return r;
  };
  const std::string off = "GEMM tuning off (";
  CommandResult byFlag = run({"--gemm-tuning", "off"}, {});
  EXPECT_NE(byFlag.stdoutText.find(off + "--gemm-tuning off)"), std::string::npos) << byFlag.describe();
  CommandResult byDefault = run({}, {});
  EXPECT_EQ(byDefault.stdoutText.find(off), std::string::npos) << byDefault.describe();
  CommandResult byEnvironment = run({}, {"COHORT_GEMM_TUNING=off"});
  EXPECT_NE(byEnvironment.stdoutText.find(off + "COHORT_GEMM_TUNING)"), std::string::npos) << byEnvironment.describe();
  CommandResult flagWins = run({"--gemm-tuning", "on"}, {"COHORT_GEMM_TUNING=off"});
  EXPECT_EQ(flagWins.stdoutText.find(off), std::string::npos) << flagWins.describe();

  const std::vector<std::string> bench = {"bench", "train", "--device", "cuda", "--model",
                                          "gpt:layers=1,heads=2,dim=32,ctx=16", "--batch-size", "8", "--samples",
                                          "80", "--repeats", "1", "--gemm-tuning"};
  std::vector<std::string> benchOff = bench;
  benchOff.push_back("off");
  CommandResult r = runCohort(benchOff);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.stdoutText.find(off + "--gemm-tuning off)"), std::string::npos) << r.describe();
  std::vector<std::string> benchBad = bench;
  benchBad.push_back("fast");
  r = runCohort(benchBad);
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find("--gemm-tuning"), std::string::npos) << r.describe();
  EXPECT_EQ(std::count(r.stderrText.begin(), r.stderrText.end(), '\n'), 1) << r.describe();
}

// Mixed precision learns what fp32 learns (issue 31): a 4×128 GPT trained 200 steps with
// --precision bf16 reaches a test loss within 2% of the fp32 run's from the same seed (bf16's
// rounding changes the path, not where it leads). The text is six words drawn at random (a fixed
// LCG) and the rate warms up and decays to 0 at step 200 (cosine), so both runs settle at the same
// floor: measured on the emulated device 0.5744 (fp32) against 0.5739 (bf16) for seed 0 and 0.5757
// against 0.5758 for seed 1 (before the attention's backward moved to tensor cores). Mid-descent
// the comparison is noise, not precision: with the rate still high at step 200 (no --decay-steps)
// the two runs ended 1-4% apart either way, as far as two fp32 runs of different seeds, or as one
// fp32 run is from itself after a change in rounding.
TEST_F(CliGpuTest, GptInBf16LearnsWhatFp32Learns) {
  const char* const words[] = {"the", "cat", "sees", "a", "dog", "bird"};
  std::string text;
  for (uint64_t x = 12345; text.size() < 20000;) {
    x = (x * 1103515245 + 12345) % (uint64_t{1} << 31);
    text += words[(x >> 16) % 6];
    text += (x >> 8) % 7 ? " " : ". ";
  }
  writeFile(dir_ + "/words.txt", text);
  auto run = [&](const std::string& precision) {
    return runCohort({"train", "--device", "cuda", "--model", "gpt:layers=4,heads=2,dim=128,ctx=16", "--data",
                      "text:" + dir_ + "/words.txt", "--optimizer", "adamw", "--lr", "0.002", "--warmup-steps", "20",
                      "--lr-schedule", "cosine", "--decay-steps", "200", "--clip-grad-norm", "1", "--batch-size", "8",
                      "--max-steps", "200", "--epochs", "100", "--progress-every", "0", "--precision", precision},
                     // The emulated device runs the bf16 run's tensor-core attention slowly (every
                     // warp matrix operation is a warp barrier among fibers): about 190 s.
                     {.timeout = std::chrono::seconds(400)});
  };
  CommandResult fp32 = run("fp32");
  ASSERT_EQ(fp32.exitCode, 0) << fp32.describe();
  CommandResult bf16 = run("bf16");
  ASSERT_EQ(bf16.exitCode, 0) << bf16.describe();
  const double want = parseResultLine(fp32.stdoutText).number("test_loss");
  const double got = parseResultLine(bf16.stdoutText).number("test_loss");
  EXPECT_LT(want, 1.0) << "the fp32 run did not learn: " << fp32.describe();  // log(vocab 256) = 5.5 untrained
  EXPECT_NEAR(got, want, 0.02 * want) << bf16.describe();
  std::printf("test loss: fp32 %.4f, bf16 %.4f\n", want, got);
}

// The memory floor on a GPU counts a GPT's logits once, in their type: the loss writes their gradient
// over them (Loss::setGradInPlace). 8 × 16 × 256 bf16 logits: 64.0 KiB. It counts the GPU's
// workspaces too (runtime/gpu_scratch.h): the bf16 attention backward's dS once, for batch 8, 2 heads
// and one 64 × 32 tile pair per head, 8·2·64·32·2 B = 64.0 KiB, and cuBLASLt's workspace, 32 MiB on
// the emulated device (compute 9.0): 33619968 B = 32.1 MiB; fp32 has no dS scratch. In bf16 the
// parameters' bf16 copy (nn/param_buffer.h) is counted beside them: half their fp32 bytes.
TEST_F(CliGpuTest, MemoryReportCountsTheLogitsOnceInTheirType) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += i % 2 ? "the cat sees a dog. " : "a bird finds the river. ";
  writeFile(dir_ + "/corpus.txt", text);
  CommandResult r = runCohort({"train", "--device", "cuda", "--model", "gpt:layers=1,heads=2,dim=32,ctx=16", "--data",
                               "text:" + dir_ + "/corpus.txt", "--precision", "bf16", "--batch-size", "8",
                               "--max-steps", "1", "--progress-every", "0", "--memory-report"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.stdoutText.find("(logits, their gradient written over them, 64.0 KiB)"), std::string::npos)
      << r.stdoutText;
  EXPECT_NE(r.stdoutText.find(", GPU workspaces 32.1 MiB (the attention backward's dS scratch 64.0 KiB, cuBLASLt's "
                              "workspace 32.0 MiB); "),
            std::string::npos)
      << r.stdoutText;
  // "parameters 84.0 KiB (and their bf16 copy 42.0 KiB)": both figures in KiB at this size.
  const size_t at = r.stdoutText.find("): parameters ");
  ASSERT_NE(at, std::string::npos) << r.stdoutText;
  double params = 0, copy = 0;
  ASSERT_EQ(std::sscanf(r.stdoutText.c_str() + at, "): parameters %lf KiB (and their bf16 copy %lf KiB)", &params, &copy), 2)
      << r.stdoutText.substr(at, 120);
  EXPECT_GT(copy, 10.0);
  EXPECT_NEAR(copy, params / 2, 0.1) << r.stdoutText.substr(at, 120);
  CommandResult fp32 = runCohort({"train", "--device", "cuda", "--model", "gpt:layers=1,heads=2,dim=32,ctx=16", "--data",
                                  "text:" + dir_ + "/corpus.txt", "--batch-size", "8", "--max-steps", "1",
                                  "--progress-every", "0", "--memory-report"});
  ASSERT_EQ(fp32.exitCode, 0) << fp32.describe();
  EXPECT_NE(fp32.stdoutText.find(", GPU workspaces 32.0 MiB (cuBLASLt's workspace 32.0 MiB); "), std::string::npos)
      << fp32.stdoutText;
  EXPECT_EQ(fp32.stdoutText.find("bf16 copy"), std::string::npos) << fp32.stdoutText;
}

TEST_F(CliGpuTest, LenetWithBatchNormLearnsOnTheGpu) {
  const std::string mnist = dir_ + "/mnist";
  ASSERT_EQ(::mkdir(mnist.c_str(), 0700), 0);
  writeTinyMnistDir(mnist, 1280, 200, Compression::kPlain);
  CommandResult r = runCohort({"train", "--device", "cuda", "--model", "cnn:lenet-bn", "--data", "mnist:" + mnist,
                               "--epochs", "6", "--batch-size", "32", "--lr", "0.02", "--momentum", "0.9"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_GE(parseResultLine(r.stdoutText).number("test_acc"), 0.9) << r.describe();
}

TEST_F(CliGpuTest, RosettaTrainsOnTheGpuWithAugmentation) {
  CommandResult r =
      runCohort({"train", "--device", "cuda", "--model", "cnn:rosetta", "--data", "synthetic-cifar:512", "--epochs",
                 "2", "--batch-size", "64", "--lr", "0.01", "--momentum", "0.9", "--augment"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  ResultLine result = parseResultLine(r.stdoutText);
  EXPECT_GT(result.number("samples_per_s"), 0) << r.describe();
  EXPECT_TRUE(std::isfinite(result.number("train_loss"))) << r.describe();
}

// The first GPU run found `cohort bench train --device cuda` aborting at the end of its first run:
// the model outlived the GpuContext whose allocator it came from.
TEST_F(CliGpuTest, BenchTrainPrintsItsResult) {
  for (const std::string model : {mlp_.empty() ? std::string("mlp:784,512,256,10") : mlp_[1], std::string("cnn:lenet")}) {
    CommandResult r = runCohort({"bench", "train", "--device", "cuda", "--model", model, "--batch-size", "64",
                                 "--samples", "640", "--repeats", "2"});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_NE(r.stdoutText.find("RESULT bench=train model=" + model + " device=cuda:0 batch=64 conv_algorithms=fastest "
                                "precision=fp32 tf32=no samples_per_s="),
              std::string::npos)
        << r.describe();
    // The caching allocator's peak: at least the parameters, their gradients and momentum.
    EXPECT_GT(parseResultLine(r.stdoutText).number("peak_mem_gib"), 0.0) << r.describe();
  }
}

// A GPT's bench runs the step cohort train runs (train::Trainer: the guarded optimizer, bf16 logits
// in a bf16 pass) and prints its speed only beside losses that fell.
TEST_F(CliGpuTest, BenchTrainOfAGptReportsLossesThatFell) {
  for (const std::string precision : {"fp32", "bf16"}) {
    CommandResult r = runCohort({"bench", "train", "--device", "cuda", "--model", "gpt:layers=1,heads=2,dim=32,ctx=16",
                                 "--batch-size", "8", "--samples", "80", "--repeats", "1", "--precision", precision});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    const ResultLine result = parseResultLine(r.stdoutText);
    EXPECT_GT(result.number("tokens_per_s"), 0) << r.describe();
    EXPECT_GT(result.number("peak_mem_gib"), 0) << r.describe();
    EXPECT_LT(result.number("loss"), result.number("warmup_loss")) << r.describe();
    EXPECT_NE(r.stdoutText.find(" precision=" + precision + " "), std::string::npos) << r.describe();
  }
}

TEST_F(CliGpuTest, HogwildWithFourWorkersOnOneGpuReachesTheSingleGpuAccuracy) {
  const std::vector<std::string> job =
      withMlp({"train", "--device", "cuda:0", "--epochs", "2", "--lr", "0.05", "--momentum", "0.9"});
  std::vector<std::string> single = job;
  CommandResult one = runCohort(single);
  ASSERT_EQ(one.exitCode, 0) << one.describe();
  std::vector<std::string> argv = {runfile("launcher/cohortrun"), "--nproc-per-node", "4", "--", cohortBinary()};
  argv.insert(argv.end(), job.begin(), job.end());
  for (const char* a : {"--mode", "hogwild"}) argv.push_back(a);
  CommandResult four = runCommand(argv, {.timeout = std::chrono::seconds(300)});
  ASSERT_EQ(four.exitCode, 0) << four.describe();
  ResultLine a = parseResultLine(one.stdoutText), b = parseResultLine(four.stdoutText);
  EXPECT_EQ(b.fields["mode"], "hogwild");
  // Hogwild's stale updates cost some accuracy, more when the GPU is shared with other work (0.024
  // on an H200 running three other test binaries; the emulated device's smaller MLP: 0.027).
  const double margin = 0.035;
  EXPECT_GE(b.number("test_acc"), a.number("test_acc") - margin) << four.describe();
  EXPECT_NE(four.stdoutText.find("shared by 4 workers"), std::string::npos) << four.describe();
}

TEST_F(CliGpuTest, HogwildWorkersReportTheLossOfTheOwner) {
  // Two workers started by hand (cohortrun would stop the job itself when a worker dies): rank 0 is
  // killed once both are training; rank 1 must exit with the peer-failure code, naming the owner.
  const std::string job = "job" + std::to_string(::getpid());
  std::string common;
  for (const std::string& a : withMlp({"train", "--device", "cuda:0", "--mode", "hogwild", "--epochs", "50", "--lr", "0.05"})) {
    common += " '" + a + "'";
  }
  std::ostringstream script;
  for (int rank : {0, 1}) {
    script << "COHORT_SHM_DIR='" << dir_ << "' COHORT_JOB_ID=" << job << " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 RANK=" << rank
           << " LOCAL_RANK=" << rank << " '" << cohortBinary() << "'" << common << " > '" << dir_ << "/r" << rank
           << ".log' 2>&1 & pid" << rank << "=$!; ";
  }
  script << "n=0; until grep -q 'cohort train:' '" << dir_ << "/r1.log' || [ $n -ge 1200 ]; do sleep 0.05; n=$((n+1)); "
         << "done; sleep 2; kill -9 $pid0; wait $pid1; echo \"rank1 exit $?\"; cat '" << dir_ << "/r1.log'";
  const auto start = std::chrono::steady_clock::now();
  CommandResult r = runCommand({"/bin/sh", "-c", script.str()}, {.timeout = std::chrono::seconds(240)});
  EXPECT_NE(r.stdoutText.find("rank1 exit 4"), std::string::npos) << r.describe();
  EXPECT_NE(r.stdoutText.find("owns the shared GPU parameters"), std::string::npos) << r.describe();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(120));
}

TEST_F(CliGpuTest, AllreduceOverNcclWithOneRankMatchesALocalRun) {
  const std::vector<std::string> job =
      withMlp({"train", "--device", "cuda", "--epochs", "1", "--lr", "0.05", "--momentum", "0.9"});
  std::vector<std::string> local = job;
  local.push_back("--mode");
  local.push_back("local");
  CommandResult a = runCohort(local);
  ASSERT_EQ(a.exitCode, 0) << a.describe();
  std::vector<std::string> argv = {runfile("launcher/cohortrun"), "--nproc-per-node", "1", "--", cohortBinary()};
  argv.insert(argv.end(), job.begin(), job.end());
  for (const char* x : {"--mode", "allreduce"}) argv.push_back(x);
  CommandResult b = runCommand(argv, {.timeout = std::chrono::seconds(240)});
  ASSERT_EQ(b.exitCode, 0) << b.describe();
  ResultLine ra = parseResultLine(a.stdoutText), rb = parseResultLine(b.stdoutText);
  EXPECT_EQ(rb.fields["backend"], "nccl") << b.describe();
  // The average over one rank is the gradient itself: the same numbers as the local run.
  EXPECT_EQ(rb.fields["test_acc"], ra.fields["test_acc"]) << a.describe() << b.describe();
  EXPECT_NEAR(rb.number("train_loss"), ra.number("train_loss"), 1e-5 * std::abs(ra.number("train_loss")));
}

// Two workers, one GPU each, all-reducing over NCCL: 20 steps of batch 16 each equal 20 steps of one
// GPU with batch 32, every parameter within 1e-5.
TEST_F(CliGpuTest, TwoNcclWorkersOnTwoGpusEqualOneGpuWithTheCombinedBatch) {
  CommandResult devices = runCohort({"devices"});
  const size_t at = devices.stdoutText.find("CUDA devices: ");
  if (at == std::string::npos || std::atoi(devices.stdoutText.c_str() + at + 14) < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices: " << devices.stdoutText.substr(0, devices.stdoutText.find('\n', at));
  }
  auto job = [&](int batch, const std::string& checkpoint) {
    return std::vector<std::string>{"train", "--device", "cuda", "--model", "mlp:784,64,10", "--lr", "0.05", "--momentum",
                                    "0.9", "--seed", "5", "--batch-size", std::to_string(batch), "--max-steps", "20",
                                    "--checkpoint", checkpoint};
  };
  const std::string one = dir_ + "/one.st", two = dir_ + "/two.st";
  CommandResult a = runCohort(job(32, one));
  ASSERT_EQ(a.exitCode, 0) << a.describe();
  std::vector<std::string> argv = {runfile("launcher/cohortrun"), "--nproc-per-node", "2", "--", cohortBinary()};
  for (const std::string& x : job(16, two)) argv.push_back(x);
  const std::string trace = dir_ + "/trace.json";
  for (const std::string& x : {std::string("--mode"), std::string("allreduce"), std::string("--trace"), trace}) argv.push_back(x);
  CommandResult b = runCommand(argv, {.timeout = std::chrono::seconds(240)});
  ASSERT_EQ(b.exitCode, 0) << b.describe();
  EXPECT_EQ(parseResultLine(b.stdoutText).fields["backend"], "nccl") << b.describe();
  // The trace (issue 18) over NCCL: both ranks, the bucket all-reduces, the time report with a busbw.
  const std::string traced = readFile(trace);
  EXPECT_NE(traced.find("\"name\":\"rank 1\""), std::string::npos);
  EXPECT_NE(traced.find("\"name\":\"allreduce bucket 0\""), std::string::npos);
  EXPECT_NE(b.stdoutText.find("all-reduce busbw"), std::string::npos) << b.stdoutText;
  EXPECT_EQ(expectSameParameters(one, two, 1e-5, "(2 NCCL workers against one GPU)"), 4);
}

// A ZeRO job's sharded checkpoint written on GPUs (issue 46, item 3): 2 workers on 2 GPUs at --zero 2
// with --async-checkpoints (each shard copied on the compute stream into pinned staging, written in
// the background, committed at a later step), and `cohort eval` on the CPU reads it as one model:
// the test figures of the run's RESULT line, within the CPU's and GPU's rounding.
TEST_F(CliGpuTest, AZeroCheckpointWrittenOnGpusEvaluatesOnTheCpu) {
  CommandResult devices = runCohort({"devices"});
  const size_t at = devices.stdoutText.find("CUDA devices: ");
  if (at == std::string::npos || std::atoi(devices.stdoutText.c_str() + at + 14) < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices: " << devices.stdoutText.substr(0, devices.stdoutText.find('\n', at));
  }
  const std::string data = writeLargestOfThreeCsv(dir_ + "/cls.csv"), sharded = dir_ + "/sharded.st";
  CommandResult r = runCommand({runfile("launcher/cohortrun"), "--nproc-per-node", "2", "--", cohortBinary(), "train",
                                "--device", "cuda", "--mode", "allreduce", "--zero", "2", "--async-checkpoints",
                                "--checkpoint", sharded, "--checkpoint-every", "2", "--data", data, "--test-data", data,
                                "--model", "mlp:3,16,3", "--optimizer", "adamw", "--lr", "0.01", "--epochs", "2",
                                "--batch-size", "16", "--seed", "4"},
                               {.timeout = std::chrono::seconds(240)});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_FALSE(linesWith(r.stdoutText, "committed to " + sharded).empty()) << r.stdoutText;
  ASSERT_TRUE(nn::isShardedManifest(nn::readCheckpoint(sharded)));
  const ResultLine trained = parseResultLine(r.stdoutText);
  CommandResult e = runCohort({"eval", "--data", data, "--checkpoint", sharded});
  ASSERT_EQ(e.exitCode, 0) << e.describe();
  const ResultLine figures = parseResultLine(e.stdoutText);
  EXPECT_NEAR(figures.number("test_loss"), trained.number("test_loss"), 1e-4 * trained.number("test_loss"))
      << e.stdoutText << r.stdoutText;
  EXPECT_EQ(figures.fields.at("test_acc"), trained.fields.at("test_acc")) << e.stdoutText << r.stdoutText;
}

}  // namespace
}  // namespace cohort::testing
