// docs/api.md's program with a model and data of its own (gated_mlp, built from the doc by
// tests/docs/BUILD) run as the doc says: alone, and with 2 workers under cohortrun in hogwild and in
// allreduce. In each it must exit 0, print its RESULT line on rank 0 only, and learn (a test accuracy
// of at least 0.95 on its disc task, where always answering the larger class scores about 0.62).
// Every run has its own shared-memory directory, which must be empty afterwards.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

class ApiProgramTest : public ShmDirTest {
 protected:
  // Runs the program with `mode`, under cohortrun with `workers` when it is above 1; checks what
  // every mode must give and returns the RESULT line.
  ResultLine run(const std::string& mode, int workers) {
    std::vector<std::string> argv;
    if (workers > 1) argv = {runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(workers), "--"};
    argv.push_back(runfile("tests/docs/api_gated_mlp"));
    argv.push_back(mode);
    CommandResult r = runCommand(argv, {.timeout = std::chrono::seconds(180)});
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    ResultLine result = parseResultLine(r.stdoutText);
    EXPECT_EQ(result.count, 1) << "one RESULT line, from rank 0\n" << r.describe();
    EXPECT_EQ(result.fields["mode"], mode) << r.describe();
    EXPECT_EQ(result.fields["world_size"], std::to_string(workers)) << r.describe();
    EXPECT_GE(result.number("test_acc"), 0.95) << mode << " did not learn\n" << r.describe();
    EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind by " << mode;
    return result;
  }
};

TEST_F(ApiProgramTest, LearnsAlone) { run("local", 1); }

TEST_F(ApiProgramTest, LearnsWithTwoHogwildWorkers) { run("hogwild", 2); }

TEST_F(ApiProgramTest, LearnsWithTwoAllReduceWorkers) { run("allreduce", 2); }

}  // namespace
}  // namespace cohort::testing
