// One rank of zero_test's training (tests/train/zero_run.h) under mpirun, for zero_mpi_test (over
// mpi) and tests/cluster's multi_node_test (over hierarchical on the simulated cluster): its world
// from mpirun's variables, the parameters it ends with in DIR/NAME-rank<R>.bin and the job's
// checkpoint in DIR/NAME.ckpt.
//
//   zero_mpi_worker --zero Z --backend mpi|hierarchical [--scope job|node] [--model SPEC] --dir DIR --name NAME
// Prints "OK rank=R" and exits 0, or "FAIL rank=R ..." (the code of the failed expectation, or what
// was thrown) and exits 1; exits 2 on bad arguments.
#include <cstdio>
#include <exception>
#include <map>
#include <string>

#include "runtime/world_info.h"
#include "tests/train/zero_run.h"

namespace {

using cohort::train::Backend;
using cohort::train::ZeroScope;
using cohort::train::testing::ZeroRun;

// --flag value pairs; false on anything else, a missing value or an unknown backend or scope.
bool parse(int argc, char** argv, ZeroRun& run) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  if (argc % 2 != 1 || flags.count("--dir") == 0 || flags.count("--name") == 0) return false;
  for (const auto& [flag, value] : flags) {
    if (flag == "--zero") {
      run.zero = std::stoi(value);
    } else if (flag == "--backend" && (value == "mpi" || value == "hierarchical")) {
      run.backend = value == "mpi" ? Backend::kMpi : Backend::kHierarchical;
    } else if (flag == "--scope" && (value == "job" || value == "node")) {
      run.scope = value == "job" ? ZeroScope::kJob : ZeroScope::kNode;
    } else if (flag == "--model") {
      run.model = value;
    } else if (flag == "--dir") {
      run.dir = value;
    } else if (flag == "--name") {
      run.name = value;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ZeroRun run;
  bool parsed = false;
  try {
    parsed = parse(argc, argv, run);
  } catch (const std::exception&) {  // std::stoi of a --zero that is no number
  }
  if (!parsed) {
    std::fprintf(stderr,
                 "usage: zero_mpi_worker --zero Z --backend mpi|hierarchical [--scope job|node] [--model SPEC] "
                 "--dir DIR --name NAME\n");
    return 2;
  }
  const cohort::runtime::WorldInfo world = cohort::runtime::WorldInfo::detect();
  run.ranks = world.worldSize;
  int code = 0;
  try {
    code = cohort::train::testing::trainZeroRank(run, world);
  } catch (const std::exception& e) {
    std::printf("FAIL rank=%d %s: %s\n", world.rank, run.label().c_str(), e.what());
    return 1;
  }
  if (code != 0) {
    std::printf("FAIL rank=%d %s: expectation %d\n", world.rank, run.label().c_str(), code);
    return 1;
  }
  std::printf("OK rank=%d\n", world.rank);
  return 0;
}
