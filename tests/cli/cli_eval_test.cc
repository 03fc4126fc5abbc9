// `cohort eval` and `cohort predict` (issue 16): on a training run's final checkpoint they give
// exactly the test figures of its RESULT line, predict's rows agree with them (classification and
// regression), and bad checkpoints and data of another shape exit 2 naming the problem.
#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
}  // namespace cohort::testing
