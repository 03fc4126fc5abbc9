// FileStore: set/get/wait/check in one process and across forked processes; timeouts name the
// missing keys; keys are validated; readers never see a partial value.
#include "collectives/store.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "tests/collectives/job_runner.h"

namespace cohort::collectives {
namespace {

using testing::forkChild;
using testing::freshDir;
using testing::waitChild;

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

TEST(FileStore, SetThenGetAndCheck) {
  FileStore store(freshDir("store") + "/nested/dir");
  EXPECT_FALSE(store.check({"a"}));
  store.set("a", bytes("hello"));
  store.set("empty", {});
  EXPECT_TRUE(store.check({"a", "empty"}));
  EXPECT_EQ(store.get("a", std::chrono::milliseconds(10)), bytes("hello"));
  EXPECT_TRUE(store.get("empty", std::chrono::milliseconds(10)).empty());
  store.set("a", bytes("replaced"));
  EXPECT_EQ(store.get("a", std::chrono::milliseconds(10)), bytes("replaced"));
}

TEST(FileStore, TimeoutNamesTheMissingKeys) {
  FileStore store(freshDir("store"));
  store.set("present", bytes("x"));
  try {
    store.wait({"present", "rank1", "rank2"}, std::chrono::milliseconds(50));
    FAIL() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for keys 'rank1', 'rank2' (2 of 3 missing)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(store.get("never", std::chrono::milliseconds(20)), TimeoutError);
}

TEST(FileStore, RejectsBadKeys) {
  FileStore store(freshDir("store"));
  EXPECT_THROW(store.set("a/b", {}), InvalidArgument);
  EXPECT_THROW(store.set(".hidden", {}), InvalidArgument);
  EXPECT_THROW(store.set("", {}), InvalidArgument);
  EXPECT_THROW(store.check({"x y"}), InvalidArgument);
}

// Every process publishes its key and waits for everyone's: the rendezvous the store exists for.
TEST(FileStore, RendezvousAcrossProcesses) {
  const std::string dir = freshDir("store");
  constexpr int kRanks = 4;
  std::vector<pid_t> children;
  for (int r = 0; r < kRanks; ++r) {
    children.push_back(forkChild([&, r] {
      FileStore store(dir);
      std::vector<std::string> keys;
      for (int q = 0; q < kRanks; ++q) keys.push_back("rank" + std::to_string(q));
      store.set(keys[r], bytes(std::string(100000, static_cast<char>('a' + r))));
      store.wait(keys, std::chrono::seconds(20));
      for (int q = 0; q < kRanks; ++q) {
        auto value = store.get(keys[q], std::chrono::seconds(1));
        if (value != bytes(std::string(100000, static_cast<char>('a' + q)))) return 1;
      }
      return 0;
    }));
  }
  for (pid_t pid : children) EXPECT_EQ(waitChild(pid, std::chrono::seconds(30)), 0);
}

TEST(FileStore, GetWaitsForAWriterInAnotherProcess) {
  const std::string dir = freshDir("store");
  pid_t writer = forkChild([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    FileStore(dir).set("late", bytes("value"));
    return 0;
  });
  FileStore store(dir);
  EXPECT_EQ(store.get("late", std::chrono::seconds(20)), bytes("value"));
  EXPECT_EQ(waitChild(writer, std::chrono::seconds(20)), 0);
}

}  // namespace
}  // namespace cohort::collectives
