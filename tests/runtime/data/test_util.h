// Helpers for the data tests: a fresh temporary directory per test, file writers and a matcher for
// error messages. Test-only; not thread-safe.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace cohort::runtime::data::testing {

// A new directory under $TEST_TMPDIR (or /tmp) that this test alone uses.
inline std::string freshTempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/cohort_data_XXXXXX";
  if (!::mkdtemp(pattern.data())) ADD_FAILURE() << "mkdtemp failed for " << pattern;
  return pattern;
}

inline void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Runs f, expects it to throw E, and returns the message ("" and a failure otherwise).
template <class E, class F>
std::string messageOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

}  // namespace cohort::runtime::data::testing
