// Watching a run as nanoGPT and llm.c users do (issue 47, items 4 and 5): `cohort train
// --eval-every N` evaluates at step 0 and every N steps into the log, the metrics (an "eval" line)
// and TensorBoard (eval/loss) in every mode; --eval-batches K evaluates the same first K batches,
// equal to `cohort eval` on them; --sample-every prints what `cohort generate` prints from the
// checkpoint of that step, and training ends on the same parameters with and without samples;
// --steps-per-epoch cuts epochs and resumes bit for bit; --max-steps stops Hogwild workers; the step
// line of --log-every-steps carries ms/step, tokens/s and an MFU in (0, 100%]; a tokens: run without
// --test-data says that it has no validation.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/random.h"
#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

using nlohmann::json;

constexpr char kModel[] = "gpt:layers=1,heads=2,dim=32,ctx=16";

// About 80 KB of sentences: the test split (the last 10%) holds 500 windows of 16, so one
// evaluation batch of 200 windows is part of it (evaluated in one pass: 3200 positions).
std::string sentences() {
  const char* subjects[] = {"the cat", "a dog", "my friend", "the old man", "our teacher", "a small bird"};
  const char* verbs[] = {"sees", "likes", "follows", "finds", "helps", "remembers"};
  const char* objects[] = {"the river", "a red ball", "the garden", "an open door", "the morning", "a quiet song"};
  runtime::Rng rng(11);
  std::string text;
  while (text.size() < 80000) {
    text += std::string(subjects[rng.below(6)]) + " " + verbs[rng.below(6)] + " " + objects[rng.below(6)] + ".\n";
  }
  return text;
}

// The metrics file's lines of one kind: "eval", "steps" (no run_samples_per_s) or "epoch".
std::vector<json> metricsLines(const std::string& path, const std::string& kind) {
  std::vector<json> lines;
  std::istringstream in(readFile(path));
  for (std::string text; std::getline(in, text);) {
    json j = json::parse(text);
    const std::string is = j.value("type", "") == "eval" ? "eval" : j.contains("run_samples_per_s") ? "epoch" : "steps";
    if (is == kind) lines.push_back(j);
  }
  return lines;
}

// The text of rank 0's log line that starts with `start`, up to the next log line (a sample may
// hold newlines).
std::string logLine(const std::string& out, const std::string& start) {
  const size_t at = out.find("[rank 0] " + start);
  if (at == std::string::npos) return "";
  const size_t from = at + 9 + start.size(), end = out.find("\n[rank ", from);
  return out.substr(from, end == std::string::npos ? std::string::npos : end - from);
}

class WatchingCliTest : public ShmDirTest {
 protected:
  void SetUp() override {
    ShmDirTest::SetUp();
    writeFile(dir_ + "/corpus.txt", sentences());
  }
  std::vector<std::string> train(const std::vector<std::string>& extra, const std::string& model = kModel) const {
    std::vector<std::string> a = {
        cohortBinary(), "train", "--model",   model,  "--data",           "text:" + dir_ + "/corpus.txt",
        "--seed",       "4",     "--threads", "1",    "--progress-every", "0",
        "--optimizer",  "adamw", "--lr",      "0.01", "--batch-size",     "8"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  CommandResult run(int workers, const std::vector<std::string>& argv) const {
    if (workers == 1) return runCommand(argv, {.timeout = std::chrono::seconds(180)});
    std::vector<std::string> a = {runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(workers), "--"};
    a.insert(a.end(), argv.begin(), argv.end());
    return runCommand(a, {.timeout = std::chrono::seconds(180)});
  }
  // A run of 12 steps evaluating every 4 on one batch of 200, with step lines every 4: the figures in the
  // log, the metrics, TensorBoard, and the step lines' fields.
  void expectEvaluationsAndStepLines(int workers, const std::vector<std::string>& mode) {
    const std::string metrics = dir_ + "/m.jsonl", tb = dir_ + "/tb";
    std::vector<std::string> flags = {"--max-steps",       "12", "--eval-every", "4",     "--eval-batches", "1",
                                      "--eval-batch-size", "200", "--log-every-steps", "4", "--metrics", metrics,
                                      "--tensorboard",     tb};
    flags.insert(flags.end(), mode.begin(), mode.end());
    CommandResult r = run(workers, train(flags));
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    const std::vector<json> evals = metricsLines(metrics, "eval");
    ASSERT_EQ(evals.size(), 4u) << readFile(metrics);
    std::map<int64_t, double> loss;
    for (size_t i = 0; i < evals.size(); ++i) {
      const int64_t step = evals[i].at("step");
      EXPECT_EQ(step, static_cast<int64_t>(4 * i));
      EXPECT_EQ(evals[i].at("test_samples"), 200) << "one batch of 200 windows of the 500";
      loss[step] = evals[i].at("test_loss");
      EXPECT_NE(logLine(r.stdoutText, "eval step " + std::to_string(step) + " (epoch 1): test_loss "), "")
          << r.stdoutText;
    }
    EXPECT_LT(loss[12], loss[0]) << "it learned";
    // The epoch's evaluation at step 12 is the same one (the same 200 windows).
    const std::vector<json> epochs = metricsLines(metrics, "epoch");
    ASSERT_EQ(epochs.size(), 1u);
    EXPECT_EQ(epochs[0].at("test_loss").get<double>(), loss[12]);
    expectTensorBoardEvals(tb, loss);
    expectStepLines(r.stdoutText, metrics);
  }
  void expectTensorBoardEvals(const std::string& tb, const std::map<int64_t, double>& loss) const {
    const std::vector<std::string> files = listDir(tb);
    ASSERT_EQ(files.size(), 1u);
    CommandResult read =
        runCommand({"/usr/bin/python3", runfile("tests/train/tensorboard_reader.py"), tb + "/" + files[0]});
    ASSERT_EQ(read.exitCode, 0) << read.describe();
    std::map<int64_t, double> seen;
    std::istringstream lines(read.stdoutText);
    for (std::string line; std::getline(lines, line);) {
      json e = json::parse(line);
      if (e.value("tag", "") == "eval/loss") seen[e.at("step").get<int64_t>()] = e.at("value").get<double>();
    }
    ASSERT_EQ(seen.size(), loss.size());
    for (const auto& [step, value] : loss)
      EXPECT_EQ(seen[step], static_cast<double>(static_cast<float>(value))) << step;
  }
  // "step 4/12 | loss 3.4 | lr 0.01 | norm 1.1 | 7.2 ms/step | 35552 tokens/s | MFU 3.31%" at 4, 8, 12.
  void expectStepLines(const std::string& out, const std::string& metrics) const {
    const std::regex line(R"(\[rank 0\] step (\d+)/12 \| loss [0-9.]+ \| lr [0-9.e-]+ \| norm [0-9.e+-]+ \| )"
                          R"(([0-9.]+) ms/step \| ([0-9]+) tokens/s \| MFU ([0-9.]+)%)");
    std::set<int> steps;
    for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it) {
      steps.insert(std::stoi((*it)[1]));
      EXPECT_GT(std::stod((*it)[2]), 0) << it->str();
      EXPECT_GT(std::stod((*it)[3]), 0) << it->str();
      const double mfu = std::stod((*it)[4]);
      EXPECT_GT(mfu, 0) << it->str();
      EXPECT_LE(mfu, 100) << it->str();
    }
    EXPECT_EQ(steps, (std::set<int>{4, 8, 12})) << out;
    const std::vector<json> stepLines = metricsLines(metrics, "steps");
    ASSERT_EQ(stepLines.size(), 3u);
    for (const json& j : stepLines) {
      EXPECT_GT(j.at("ms_per_step").get<double>(), 0) << j;
      EXPECT_GT(j.at("tokens_per_s").get<double>(), 0) << j;
      EXPECT_GT(j.at("mfu").get<double>(), 0) << j;
      EXPECT_LE(j.at("mfu").get<double>(), 1) << j;
    }
  }
};

TEST_F(WatchingCliTest, EvaluationsAtStepZeroAndEveryNOnOneWorker) { expectEvaluationsAndStepLines(1, {}); }

TEST_F(WatchingCliTest, EvaluationsAtStepZeroAndEveryNInAllreduce) {
  expectEvaluationsAndStepLines(2, {"--mode", "allreduce"});
}

TEST_F(WatchingCliTest, EvaluationsAtStepZeroAndEveryNWithZeroStage3) {
  expectEvaluationsAndStepLines(2, {"--mode", "allreduce", "--zero", "3"});
}

TEST_F(WatchingCliTest, EvaluationsAtStepZeroAndEveryNInHogwild) {
  expectEvaluationsAndStepLines(2, {"--mode", "hogwild"});
}

// --eval-batches 2 of 1000 samples: the test set's first 2000 rows, as `cohort eval` finds them on
// a file of those rows alone, in every printed digit.
TEST_F(WatchingCliTest, EvalBatchesEqualCohortEvalOnTheSameBatches) {
  auto csv = [](int rows, int seed) {
    std::ostringstream out;
    out << "a,b,c,target\n";
    runtime::Rng rng(static_cast<uint64_t>(seed));
    for (int i = 0; i < rows; ++i) {
      const int a = static_cast<int>(rng.below(10)), b = static_cast<int>(rng.below(10)),
                c = static_cast<int>(rng.below(10));
      out << a << "," << b << "," << c << "," << (a >= b && a >= c ? 0 : b >= c ? 1 : 2) << "\n";
    }
    return out.str();
  };
  writeFile(dir_ + "/train.csv", csv(512, 1));
  const std::string test = csv(2500, 2);
  writeFile(dir_ + "/test.csv", test);
  size_t cut = 0;
  for (int line = 0; line <= 2000; ++line) cut = test.find('\n', cut) + 1;  // the header and 2000 rows
  writeFile(dir_ + "/first2000.csv", test.substr(0, cut));
  const std::string metrics = dir_ + "/m.jsonl", checkpoint = dir_ + "/c.st";
  CommandResult r = runCommand({cohortBinary(),     "train",
                                "--model",          "mlp:3,16,3",
                                "--data",           "csv:" + dir_ + "/train.csv",
                                "--test-data",      "csv:" + dir_ + "/test.csv",
                                "--batch-size",     "16",
                                "--threads",        "1",
                                "--progress-every", "0",
                                "--max-steps",      "8",
                                "--eval-every",     "4",
                                "--eval-batches",   "2",
                                "--metrics",        metrics,
                                "--checkpoint",     checkpoint},
                               {.timeout = std::chrono::seconds(120)});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::vector<json> evals = metricsLines(metrics, "eval");
  ASSERT_EQ(evals.size(), 3u);
  ASSERT_EQ(evals[2].at("step"), 8);
  EXPECT_EQ(evals[2].at("test_samples"), 2000);
  r = runCohort(
      {"eval", "--checkpoint", checkpoint, "--data", "csv:" + dir_ + "/first2000.csv", "--batch-size", "1000"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  std::ostringstream loss, acc;
  loss << evals[2].at("test_loss").get<double>();
  acc << evals[2].at("test_acc").get<double>();
  const ResultLine result = parseResultLine(r.stdoutText);
  EXPECT_EQ(result.fields.at("test_loss"), loss.str()) << r.stdoutText;
  EXPECT_EQ(result.fields.at("test_acc"), acc.str()) << r.stdoutText;
}

// A tokenizer made here, in tiktoken's format: the 256 bytes (rank = byte), 8 merges, then
// <|endoftext|> (id 264); the model's vocabulary 384 covers it with padding.
void writeTokenizer(const std::string& path) {
  auto base64 = [](const std::string& bytes) {
    static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (size_t i = 0; i < bytes.size(); i += 3) {
      uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
      if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
      if (i + 2 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 2]);
      for (size_t k = 0; k < 4; ++k) out += k <= bytes.size() - i ? kAlphabet[(v >> (18 - 6 * k)) & 63] : '=';
    }
    return out;
  };
  std::ostringstream file;
  int rank = 0;
  for (int b = 0; b < 256; ++b) file << base64(std::string(1, static_cast<char>(b))) << " " << rank++ << "\n";
  for (const char* merge : {"th", "he", " t", "the", " the", "in", "er", "an"})
    file << base64(merge) << " " << rank++ << "\n";
  writeFile(path, file.str());
}

// What rank 0 prints of a sample: control bytes as \xNN (train/trainer_eval.cc).
std::string shown(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if ((byte < 0x20 && c != '\n' && c != '\t') || byte == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", byte);
      out += hex;
    } else {
      out += c;
    }
  }
  return out;
}

TEST_F(WatchingCliTest, SamplesAreWhatGenerateSaysAndLeaveTrainingAlone) {
  const std::string tokenizer = dir_ + "/test.tiktoken", model = "gpt:layers=1,heads=2,dim=32,ctx=16,vocab=384";
  writeTokenizer(tokenizer);
  auto job = [&](const std::string& checkpoint, bool samples) {
    std::vector<std::string> a = {"--max-steps",           "10",          "--checkpoint",
                                  dir_ + "/" + checkpoint, "--tokenizer", tokenizer};
    if (samples) a.insert(a.end(), {"--sample-every", "5"});
    return run(1, train(a, model));
  };
  CommandResult sampled = job("sampled.st", true);
  ASSERT_EQ(sampled.exitCode, 0) << sampled.describe();
  CommandResult again = job("again.st", true), plain = job("plain.st", false);
  ASSERT_EQ(again.exitCode, 0) << again.describe();
  ASSERT_EQ(plain.exitCode, 0) << plain.describe();
  const std::string at5 = logLine(sampled.stdoutText, "sample at step 5 (32 tokens): ");
  const std::string at10 = logLine(sampled.stdoutText, "sample at step 10 (32 tokens): ");
  ASSERT_NE(at10, "") << sampled.stdoutText;
  EXPECT_NE(at5, "") << sampled.stdoutText;
  EXPECT_EQ(logLine(again.stdoutText, "sample at step 10 (32 tokens): "), at10) << "a fixed seed";
  EXPECT_EQ(logLine(plain.stdoutText, "sample at step"), "");
  expectIdenticalCheckpoints(dir_ + "/plain.st", dir_ + "/sampled.st", "samples change no bit of the training");
  // The checkpoint of step 10, sampled by cohort generate with the trainer's sampler settings.
  CommandResult generated =
      runCohort({"generate", "--checkpoint", dir_ + "/sampled.st", "--tokenizer", tokenizer, "--prompt",
                 "<|endoftext|>", "--tokens", "32", "--seed", "1337", "--temperature", "1", "--top-k", "0"});
  ASSERT_EQ(generated.exitCode, 0) << generated.describe();
  const std::string prefix = "<|endoftext|>";
  ASSERT_EQ(generated.stdoutText.rfind(prefix, 0), 0u) << generated.stdoutText;
  std::string continuation = generated.stdoutText.substr(prefix.size());
  ASSERT_FALSE(continuation.empty());
  continuation.pop_back();  // generate's final newline
  EXPECT_EQ(at10, shown(continuation));
}

// Epochs of 5 steps: their lines at steps 5, 10 and 15; stopped at 7 and resumed, the same bits.
TEST_F(WatchingCliTest, StepsPerEpochCutEpochsAndResumeBitForBit) {
  auto job = [&](const std::string& checkpoint, const std::vector<std::string>& extra) {
    std::vector<std::string> a = {"--steps-per-epoch", "5", "--epochs", "3", "--checkpoint", dir_ + "/" + checkpoint};
    a.insert(a.end(), extra.begin(), extra.end());
    return run(1, train(a));
  };
  CommandResult whole = job("whole.st", {});
  ASSERT_EQ(whole.exitCode, 0) << whole.describe();
  for (const std::string& epoch : {"epoch 1/3 step 5 ", "epoch 2/3 step 10 ", "epoch 3/3 step 15 "}) {
    EXPECT_NE(whole.stdoutText.find(epoch), std::string::npos) << epoch << "\n" << whole.stdoutText;
  }
  CommandResult r = job("split.st", {"--max-steps", "7"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  ASSERT_EQ((r = job("split.st", {"--resume"})).exitCode, 0) << r.describe();
  EXPECT_NE(r.stdoutText.find("resumed from"), std::string::npos) << r.stdoutText;
  expectIdenticalCheckpoints(dir_ + "/whole.st", dir_ + "/split.st");
}

// Hogwild workers each count their own steps: both stop at 6, after an epoch of 4.
TEST_F(WatchingCliTest, MaxStepsStopsHogwildWorkers) {
  CommandResult r = run(2, train({"--mode", "hogwild", "--max-steps", "6", "--steps-per-epoch", "4", "--epochs", "3"}));
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  for (const std::string& rank : {"[rank 0] ", "[rank 1] "}) {
    EXPECT_NE(r.stdoutText.find(rank + "epoch 1/3 step 4 "), std::string::npos) << r.stdoutText;
    EXPECT_NE(r.stdoutText.find(rank + "stopped after 6 steps (--max-steps)"), std::string::npos) << r.stdoutText;
  }
  EXPECT_EQ(parseResultLine(r.stdoutText).fields.at("stopped"), "max_steps");
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

TEST_F(WatchingCliTest, ATokensRunWithoutTestDataSaysItHasNoValidation) {
  std::vector<uint16_t> tokens(20 * 16 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 200);
  std::string bytes(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  writeFile(dir_ + "/train.bin", bytes);
  CommandResult r = runCohort({"train", "--model", std::string(kModel) + ",vocab=256", "--data",
                               "tokens:raw:" + dir_ + "/train.bin", "--max-steps",
                               "2", "--batch-size", "4", "--progress-every", "0", "--eval-every", "1"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.stdoutText.find("no validation: tokens:raw:" + dir_ +
                              "/train.bin has no test split of its own; add "
                              "--test-data tokens:VAL_SHARDS (llm.c's val shards) to evaluate (--eval-every has "
                              "nothing to evaluate)"),
            std::string::npos)
      << r.stdoutText;
}

}  // namespace
}  // namespace cohort::testing
