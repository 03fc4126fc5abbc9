// `cohort eval` and `cohort predict` (issue 16): on a training run's final checkpoint they give
// exactly the test figures of its RESULT line, predict's rows agree with them (classification and
// regression), and bad checkpoints and data of another shape exit 2 naming the problem.
// Other tools' weight files that lie (issue 44, items 14 and 22): text from the file reaches the
// terminal printably and cut; a safetensors header length past the end, an llm.c header whose size
// wraps past 2^64, config.json that is a directory or whose n_head or n_inner is wrong, and NaN or
// infinite weights are each exit 2 naming the file and the field or tensor; eval, predict and
// generate take --model and say when they guess the heads.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

class EvalCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = freshTempDir(); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // A 3-class CSV: class = the largest of the three features (ties to the first), with noise rows.
  std::string classificationCsv() {
    std::string text = "a,b,c,label\n";
    for (int i = 0; i < 300; ++i) {
      const int a = (i * 7) % 10, b = (i * 3 + 1) % 10, c = (i * 11 + 5) % 10;
      const int label = a >= b && a >= c ? 0 : (b >= c ? 1 : 2);
      text += std::to_string(a) + "," + std::to_string(b) + "," + std::to_string(c) + "," + std::to_string(label) + "\n";
    }
    writeFile(path("cls.csv"), text);
    return path("cls.csv");
  }
  std::string regressionCsv() {
    std::string text = "x,y,target\n";
    for (int i = 0; i < 200; ++i) {
      const double x = (i % 20) / 10.0, y = (i / 20) / 10.0;
      text += std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(2 * x - y + 0.5) + "\n";
    }
    writeFile(path("reg.csv"), text);
    return path("reg.csv");
  }
  ResultLine train(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"train", "--threads", "1", "--epochs", "3", "--batch-size", "16", "--seed", "2",
                                     "--checkpoint", path("model.st")};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = runCohort(argv);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    return parseResultLine(r.stdoutText);
  }
  std::string dir_;
};

std::vector<std::vector<std::string>> readCsvRows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::istringstream f(line);
    for (std::string field; std::getline(f, field, ',');) fields.push_back(field);
    rows.push_back(fields);
  }
  return rows;
}

TEST_F(EvalCliTest, EvalGivesTheTrainingRunsTestFiguresAndPredictAgrees) {
  const std::string csv = classificationCsv();
  ResultLine trained = train({"--data", "csv:" + csv, "--test-data", "csv:" + csv, "--model", "mlp:3,16,3", "--lr", "0.1"});
  CommandResult e = runCohort({"eval", "--checkpoint", path("model.st"), "--data", "csv:" + csv});
  ASSERT_EQ(e.exitCode, 0) << e.describe();
  ResultLine eval = parseResultLine(e.stdoutText);
  EXPECT_EQ(eval.fields["test_loss"], trained.fields["test_loss"]) << e.stdoutText;
  EXPECT_EQ(eval.fields["test_acc"], trained.fields["test_acc"]) << e.stdoutText;
  EXPECT_EQ(eval.fields["samples"], "300");

  CommandResult p = runCohort({"predict", "--checkpoint", path("model.st"), "--data", "csv:" + csv, "--output", path("p.csv")});
  ASSERT_EQ(p.exitCode, 0) << p.describe();
  const auto rows = readCsvRows(readFile(path("p.csv")));
  const auto data = readCsvRows(readFile(csv));
  ASSERT_EQ(rows.size(), 301u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"p0", "p1", "p2", "predicted"}));
  int correct = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), 4u);
    double sum = 0;
    int best = 0;
    for (int c = 0; c < 3; ++c) {
      sum += std::stod(rows[i][c]);
      if (std::stod(rows[i][c]) > std::stod(rows[i][best])) best = c;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << i;
    EXPECT_EQ(std::to_string(best), rows[i][3]) << "row " << i << ": the predicted class is not the most probable";
    correct += rows[i][3] == data[i][3];
  }
  EXPECT_NEAR(correct / 300.0, std::stod(trained.fields["test_acc"]), 1e-9) << "predict disagrees with the accuracy";
  EXPECT_GE(correct, 200) << "the model learned little";
}

TEST_F(EvalCliTest, RegressionEvalAndPredict) {
  const std::string csv = regressionCsv();
  ResultLine trained = train({"--data", "csv:" + csv, "--test-data", "csv:" + csv, "--model", "mlp:2,8,1", "--loss", "mse",
                              "--lr", "0.05"});
  CommandResult e = runCohort({"eval", "--checkpoint", path("model.st"), "--data", "csv:" + csv});
  ASSERT_EQ(e.exitCode, 0) << e.describe();
  ResultLine eval = parseResultLine(e.stdoutText);
  EXPECT_EQ(eval.fields["test_loss"], trained.fields["test_loss"]);
  EXPECT_FALSE(eval.has("test_acc"));
  CommandResult p = runCohort({"predict", "--checkpoint", path("model.st"), "--data", "csv:" + csv, "--output", path("p.csv")});
  ASSERT_EQ(p.exitCode, 0) << p.describe();
  const auto rows = readCsvRows(readFile(path("p.csv")));
  ASSERT_EQ(rows.size(), 201u);
  EXPECT_EQ(rows[0], std::vector<std::string>{"y0"});
  double mse = 0;
  const auto data = readCsvRows(readFile(csv));
  for (size_t i = 1; i < rows.size(); ++i) mse += std::pow(std::stod(rows[i][0]) - std::stod(data[i][2]), 2) / 200.0;
  EXPECT_NEAR(mse, std::stod(trained.fields["test_loss"]), 1e-4 * (1 + mse));
}

TEST_F(EvalCliTest, BadCheckpointsAndDataOfAnotherShapeExit2) {
  const std::string csv = classificationCsv();
  train({"--data", "csv:" + csv, "--model", "mlp:3,16,3"});
  CommandResult shape = runCohort({"eval", "--checkpoint", path("model.st"), "--data", "synthetic"});
  EXPECT_EQ(shape.exitCode, 2) << shape.describe();
  EXPECT_NE(shape.stderrText.find("takes samples of [3], but synthetic/test has [784]"), std::string::npos) << shape.describe();
  CommandResult missing = runCohort({"eval", "--checkpoint", path("none.st"), "--data", "csv:" + csv});
  EXPECT_EQ(missing.exitCode, 2) << missing.describe();
  EXPECT_NE(missing.stderrText.find(path("none.st")), std::string::npos) << missing.describe();
  std::string bytes = readFile(path("model.st"));
  bytes[bytes.size() - 3] ^= 0x40;
  writeFile(path("corrupt.st"), bytes);
  CommandResult corrupt = runCohort({"predict", "--checkpoint", path("corrupt.st"), "--data", "csv:" + csv, "--output",
                                     path("out.csv")});
  EXPECT_EQ(corrupt.exitCode, 2) << corrupt.describe();
  EXPECT_NE(corrupt.stderrText.find(path("corrupt.st")), std::string::npos) << corrupt.describe();
  EXPECT_FALSE(fileExists(path("out.csv"))) << "a failed predict wrote its output";
}

// A HuggingFace GPT-2 as transformers saves it (names without "transformer.", Conv1D layouts [in,
// out]): 1 layer, width 64, context 16, vocabulary 32, weights from a fixed pattern (so that the
// number of heads changes the loss). Element 0 of tensor `poison` is `value`; `metadata` is the
// "cohort_model" metadata (none where empty); `extra` adds a tensor of that name.
struct HfGpt {
  std::string poison;
  float value = 0;
  std::string metadata;
  std::string extra;
};

std::string jsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char code[8];
      std::snprintf(code, sizeof code, "\\u%04x", c);
      out += code;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string hfGptBytes(const HfGpt& o) {
  constexpr int64_t c = 64, v = 32, t = 16;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"wte.weight", {v, c}}, {"wpe.weight", {t, c}}};
  const std::vector<std::pair<std::string, std::vector<int64_t>>> block = {
      {"ln_1.weight", {c}},         {"ln_1.bias", {c}},          {"attn.c_attn.weight", {c, 3 * c}},
      {"attn.c_attn.bias", {3 * c}}, {"attn.c_proj.weight", {c, c}}, {"attn.c_proj.bias", {c}},
      {"ln_2.weight", {c}},         {"ln_2.bias", {c}},          {"mlp.c_fc.weight", {c, 4 * c}},
      {"mlp.c_fc.bias", {4 * c}},   {"mlp.c_proj.weight", {4 * c, c}}, {"mlp.c_proj.bias", {c}}};
  for (const auto& [name, shape] : block) shapes.push_back({"h.0." + name, shape});
  shapes.push_back({"ln_f.weight", {c}});
  shapes.push_back({"ln_f.bias", {c}});
  if (!o.extra.empty()) shapes.push_back({o.extra, {1}});
  std::string header = "{", data;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const auto& [name, shape] = shapes[k];
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      values[static_cast<size_t>(i)] = static_cast<float>(static_cast<int64_t>((i * 37 + i / 61 * 5 + k * 11) % 61) - 30) / 32.0f;
    }
    if (name == o.poison) values[0] = o.value;
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    header += (k ? "," : "") + jsonString(name) + ":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(shape[0]) +
              (shape.size() > 1 ? "," + std::to_string(shape[1]) : "") + "],\"data_offsets\":[" +
              std::to_string(begin) + "," + std::to_string(data.size()) + "]}";
  }
  if (!o.metadata.empty()) header += ",\"__metadata__\":{\"format\":\"pt\",\"cohort_model\":" + jsonString(o.metadata) + "}";
  header += "}";
  const uint64_t length = header.size();
  return std::string(reinterpret_cast<const char*>(&length), 8) + header + data;
}

// llm.c's token shard of `count` tokens, each id (i * 7) % 32.
std::string tokenShard(int count) {
  int32_t h[256] = {20240520, 1, count};
  std::string bytes(reinterpret_cast<const char*>(h), sizeof h);
  for (int i = 0; i < count; ++i) {
    const auto id = static_cast<uint16_t>((i * 7) % 32);
    bytes.append(reinterpret_cast<const char*>(&id), 2);
  }
  return bytes;
}

class WeightFilesCliTest : public EvalCliTest {
 protected:
  void SetUp() override {
    EvalCliTest::SetUp();
    writeFile(path("shard.bin"), tokenShard(20 * 16 + 1));
  }
  // A directory `name` holding model.safetensors (and config.json where given); its path.
  std::string hf(const std::string& name, const HfGpt& o = {}, const std::string& config = "") {
    EXPECT_EQ(::mkdir(path(name).c_str(), 0700), 0);
    writeFile(path(name) + "/model.safetensors", hfGptBytes(o));
    if (!config.empty()) writeFile(path(name) + "/config.json", config);
    return path(name);
  }
  CommandResult eval(const std::string& weights, const std::vector<std::string>& more = {}) {
    std::vector<std::string> argv = {"eval", "--checkpoint", weights, "--data", "tokens:" + path("shard.bin")};
    argv.insert(argv.end(), more.begin(), more.end());
    return runCohort(argv);
  }
  // Exit 2 with one line on stderr holding each of `wanted`.
  static void expectRefused(const CommandResult& r, const std::vector<std::string>& wanted) {
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_EQ(countLines(r.stderrText), 1) << r.describe();
    for (const std::string& w : wanted) EXPECT_NE(r.stderrText.find(w), std::string::npos) << w << "\n" << r.describe();
  }
};

// 14(a): a spec of escape codes and 200 KB in the metadata once reached the terminal raw (the screen
// cleared, one line of 200 KB); a tensor name the same.
TEST_F(WeightFilesCliTest, TextFromAWeightFileIsQuotedPrintablyAndCut) {
  const std::string screen = "\x1b[2J\x1b[H" + std::string(200000, 'A');
  const CommandResult spec = eval(hf("spec", {.metadata = screen}));
  expectRefused(spec, {path("spec") + "/model.safetensors: its metadata \"cohort_model\" is '\\x1b[2J\\x1b[HAAA",
                       "... (200007 bytes)', not a model spec Cohort builds"});
  EXPECT_LT(spec.stderrText.size(), 1000u) << spec.describe();
  EXPECT_EQ(spec.stderrText.find('\x1b'), std::string::npos) << spec.describe();
  const CommandResult name = eval(hf("name", {.extra = "h.0.\x1b]0;owned\x07" + std::string(5000, 'x')}));
  expectRefused(name, {path("name") + "/model.safetensors: tensor 'h.0.\\x1b]0;owned\\x07xxx", "... (5014 bytes)' is not part of a GPT-2"});
  EXPECT_EQ(name.stderrText.find('\x1b'), std::string::npos) << name.describe();
  EXPECT_LT(name.stderrText.size(), 1000u) << name.describe();
}

// 14(b): the header length is checked against the file before the JSON is read (it already was
// when issue 44 was worked on: this guards it); a length past the limit of 100 MB is "absurd".
TEST_F(WeightFilesCliTest, ASafetensorsHeaderLengthPastTheEndIsSaidSo) {
  for (const uint64_t length : {uint64_t{16}, uint64_t{5000}, uint64_t{100'000'000}}) {
    writeFile(path("past.safetensors"), std::string(reinterpret_cast<const char*>(&length), 8) + "{\"a\":1}");
    expectRefused(eval(path("past.safetensors")),
                  {path("past.safetensors") + ": header length " + std::to_string(length) +
                   " at byte 0 runs past the end of the file (15 bytes)"});
  }
}

// 14(c): padded vocabulary 2^31 - 1, context 2^31 - 14, width 2^30, 1 layer: the bytes of the
// parameters are a multiple of 2^64, so the sum wrapped to the header's 1024 alone, the exact-length
// check passed and the reader asked for 2^63 bytes (exit 5, "out of memory").
TEST_F(WeightFilesCliTest, AnLlmcHeaderWhoseSizeWrapsPast2To64IsRefused) {
  const int32_t h[256] = {20240326, 3, (1 << 30) * 2 - 14 + 0, 1, 1, 1, 1 << 30, INT32_MAX};
  writeFile(path("wrap.bin"), std::string(reinterpret_cast<const char*>(h), sizeof h));
  expectRefused(eval(path("wrap.bin")),
                {path("wrap.bin") + ": its header's sizes (gpt:layers=1,heads=1,dim=1073741824,ctx=2147483634,vocab=1, "
                                    "padded vocabulary 2147483647) make a model of more than 2^64 bytes"});
}

// 14(d): each was exit 1, ignored, or refused without naming config.json.
TEST_F(WeightFilesCliTest, ConfigJsonIsRefusedNamingItAndTheField) {
  const std::string dir = hf("dir");
  ASSERT_EQ(::mkdir((dir + "/config.json").c_str(), 0700), 0);
  expectRefused(eval(dir), {dir + "/config.json: is a directory, not HuggingFace's config"});
  expectRefused(eval(hf("zero", {}, R"({"n_head": 0, "n_embd": 64})")),
                {path("zero") + "/config.json: \"n_head\" is 0, which does not divide the width 64 of the weights"});
  expectRefused(eval(hf("three", {}, R"({"n_head": 3})")),
                {path("three") + "/config.json: \"n_head\" is 3, which does not divide the width 64 of the weights"});
  expectRefused(eval(hf("inner", {}, R"({"n_head": 2, "n_inner": 100})")),
                {path("inner") + "/config.json: \"n_inner\" is 100, but the weights say 256"});
  const CommandResult fine = eval(hf("fine", {}, R"({"n_head": 2, "n_inner": null, "n_embd": 64})"));
  EXPECT_EQ(fine.exitCode, 0) << fine.describe();
  EXPECT_EQ(parseResultLine(fine.stdoutText).fields["model"], "gpt:layers=1,heads=2,dim=64,ctx=16,vocab=32");
}

// 14(e): eval exited 0 with loss nan, generate printed 0xff bytes, train blamed the learning rate.
TEST_F(WeightFilesCliTest, NonFiniteWeightsAreRefusedNamingTheTensor) {
  const std::string nan = hf("nan", {.poison = "h.0.ln_2.bias", .value = NAN});
  const std::string inf = hf("inf", {.poison = "wte.weight", .value = -INFINITY});
  expectRefused(eval(nan), {path("nan") + ": tensor 'transformer.h.0.ln_2.bias' holds nan at element 0"});
  expectRefused(runCohort({"generate", "--checkpoint", inf, "--prompt-tokens", "1,2", "--tokens", "3"}),
                {path("inf") + ": tensor 'transformer.wte.weight' holds -inf at element 0"});
  expectRefused(runCohort({"train", "--init-from", nan, "--data", "tokens:" + path("shard.bin"), "--max-steps", "1"}),
                {"tensor 'transformer.h.0.ln_2.bias' holds nan"});
}

// Item 22: without config.json the heads are a guess (width / 64), said on stderr; --model (as
// train's) says otherwise, for eval, predict and generate, and must fit the weights.
TEST_F(WeightFilesCliTest, EvalPredictAndGenerateTakeModelAndSayWhenTheyGuess) {
  const std::string lone = hf("lone");
  const std::string two = "gpt:layers=1,heads=2,dim=64,ctx=16,vocab=32";
  const CommandResult guessed = eval(lone);
  ASSERT_EQ(guessed.exitCode, 0) << guessed.describe();
  EXPECT_NE(guessed.stderrText.find("cohort eval: " + lone + " (HuggingFace safetensors, "
                                    "gpt:layers=1,heads=1,dim=64,ctx=16,vocab=32): heads taken as width / 64"),
            std::string::npos)
      << guessed.describe();
  EXPECT_NE(guessed.stderrText.find("give --model to say otherwise"), std::string::npos) << guessed.describe();
  const CommandResult given = eval(lone, {"--model", two});
  ASSERT_EQ(given.exitCode, 0) << given.describe();
  EXPECT_EQ(given.stderrText, "") << given.describe();
  ResultLine a = parseResultLine(guessed.stdoutText), b = parseResultLine(given.stdoutText);
  EXPECT_EQ(b.fields["model"], two);
  EXPECT_NE(a.fields["test_loss"], b.fields["test_loss"]) << "the heads change the model";
  const CommandResult config = eval(hf("configured", {}, R"({"n_head": 2})"));
  EXPECT_EQ(parseResultLine(config.stdoutText).fields["test_loss"], b.fields["test_loss"]) << config.describe();
  expectRefused(eval(lone, {"--model", "gpt:layers=1,heads=2,dim=32,ctx=16,vocab=32"}),
                {"does not fit " + lone, "'transformer.wte.weight' is [32, 32] in the model and [32, 64] in the file"});

  const CommandResult predict = runCohort({"predict", "--checkpoint", lone, "--model", two, "--data",
                                           "tokens:" + path("shard.bin"), "--output", path("p.csv")});
  EXPECT_EQ(predict.exitCode, 0) << predict.describe();
  EXPECT_NE(predict.stdoutText.find("RESULT predict model=" + two), std::string::npos) << predict.describe();
  const CommandResult guessedText = runCohort({"generate", "--checkpoint", lone, "--prompt-tokens", "1,2", "--tokens", "3"});
  EXPECT_EQ(guessedText.exitCode, 0) << guessedText.describe();
  EXPECT_NE(guessedText.stderrText.find("cohort generate: " + lone), std::string::npos) << guessedText.describe();
  const CommandResult text =
      runCohort({"generate", "--checkpoint", lone, "--model", two, "--prompt-tokens", "1,2", "--tokens", "3"});
  EXPECT_EQ(text.exitCode, 0) << text.describe();
  EXPECT_EQ(text.stderrText, "") << text.describe();
}

}  // namespace
}  // namespace cohort::testing
