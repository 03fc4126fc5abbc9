// DeviceShare without a GPU: the handle exchange through the job segment, its checks, the owner
// outliving its importers, and owner-loss detection, with ranks as forked processes. A fake
// DeviceMemory stands in for CUDA: an "allocation" is a file in the test's shared-memory directory,
// its "IPC handle" the file's name, and opening one maps the file, so ranks really share the bytes.
#include "ipc/device_share.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <set>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "runtime/error.h"
#include "tests/ipc/multiproc.h"

namespace cohort::ipc {
namespace {

using namespace std::chrono_literals;
using testing::forkChild;
using testing::freshJobId;
using testing::ScopedShmDir;
using testing::waitChild;

constexpr size_t kBytes = 4096 * 3;
constexpr size_t kFloats = kBytes / sizeof(float);

class FakeDeviceMemory final : public DeviceMemory {
 public:
  explicit FakeDeviceMemory(std::string id, std::set<std::string> peers = {})
      : id_(std::move(id)), peers_(std::move(peers)) {}

  std::string deviceId() const override { return id_; }
  void* allocate(size_t bytes) override {
    const std::string name = "fakegpu-" + std::to_string(getpid()) + "-" + std::to_string(next_++);
    int fd = ::open(path(name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) COHORT_THROW(Error) << "fake allocate " << name;
    void* p = map(fd, bytes);
    names_[p] = name;
    sizes_[p] = bytes;
    return p;
  }
  void release(void* ptr) noexcept override {
    ++released;
    ::munmap(ptr, sizes_[ptr]);
    ::unlink(path(names_[ptr]).c_str());
  }
  IpcHandle exportHandle(void* ptr) override {
    IpcHandle h{};
    const std::string& name = names_.at(ptr);
    std::memcpy(h.data(), name.c_str(), name.size() + 1);
    return h;
  }
  bool canAccess(const std::string& id) const override { return id == id_ || peers_.count(id) > 0; }
  void* open(const IpcHandle& handle) override {
    const std::string name(reinterpret_cast<const char*>(handle.data()));
    int fd = ::open(path(name).c_str(), O_RDWR);
    if (fd < 0) COHORT_THROW(Error) << "fake open of " << name << " failed";
    void* p = map(fd, kBytes);
    sizes_[p] = kBytes;
    ++opened;
    return p;
  }
  void close(void* ptr) noexcept override {
    ++closed;
    ::munmap(ptr, sizes_[ptr]);
  }

  // Atomic: the owner's destructor may run on another thread than the test's checks.
  std::atomic<int> released{0}, opened{0}, closed{0};

  // The fake allocations whose files still exist in the test's directory (released removes them).
  static int allocationsOnDisk() {
    int n = 0;
    if (DIR* d = ::opendir(std::getenv("COHORT_SHM_DIR"))) {
      while (dirent* e = ::readdir(d)) n += std::string(e->d_name).rfind("fakegpu-", 0) == 0 ? 1 : 0;
      ::closedir(d);
    }
    return n;
  }

 private:
  static std::string path(const std::string& name) { return std::string(std::getenv("COHORT_SHM_DIR")) + "/" + name; }
  static void* map(int fd, size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) COHORT_THROW(Error) << "fake mmap failed";
    return p;
  }
  std::string id_;
  std::set<std::string> peers_;
  std::map<void*, std::string> names_;
  std::map<void*, size_t> sizes_;
  int next_ = 0;
};

DeviceShare::Options optionsFor(const std::string& job, int rank, int ranks = 2) {
  return {.jobId = job,
          .localRank = rank,
          .localWorldSize = ranks,
          .bytes = kBytes,
          .timeout = 10s,
          .ownerCheckInterval = 50ms};
}

void fillPattern(void* p, size_t bytes) {
  float* f = static_cast<float*>(p);
  for (size_t i = 0; i < bytes / sizeof(float); ++i) f[i] = static_cast<float>(i);
}

// Polls (bounded) until `cond` holds.
template <class F>
bool eventually(F cond, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(DeviceShare, ImportersUpdateTheOwnersMemoryInPlace) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  FakeDeviceMemory memory("0000:01:00.0");
  auto owner = std::make_unique<DeviceShare>(memory, optionsFor(job, 0, 3), fillPattern);
  EXPECT_TRUE(owner->isOwner());
  float* values = static_cast<float*>(owner->data());
  pid_t children[2];
  for (int rank = 1; rank <= 2; ++rank) {
    children[rank - 1] = forkChild([&, rank] {
      FakeDeviceMemory mine("0000:01:00.0");
      DeviceShare share(mine, optionsFor(job, rank, 3), nullptr);
      if (share.isOwner() || mine.opened != 1) return 10;
      float* v = static_cast<float*>(share.data());
      for (size_t i = 3; i < kFloats; ++i) {           // (1 and 2 are the importers' own writes)
        if (v[i] != static_cast<float>(i)) return 11;  // the owner's initial values
      }
      v[rank] = -static_cast<float>(rank);  // an update the owner must see
      share.throwIfOwnerLost();
      return 0;
    });
  }
  for (pid_t c : children) EXPECT_EQ(waitChild(c), 0);
  EXPECT_EQ(values[1], -1.0f);
  EXPECT_EQ(values[2], -2.0f);
  EXPECT_EQ(values[3], 3.0f);
  owner.reset();  // both importers detached: returns at once
  EXPECT_EQ(memory.released.load(), 1);
}

TEST(DeviceShare, AHandleIsNeverOpenedInTheProcessThatExportedIt) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  FakeDeviceMemory memory("0000:01:00.0");
  DeviceShare owner(memory, optionsFor(job, 0), fillPattern);
  try {
    DeviceShare importer(memory, optionsFor(job, 1), nullptr);
    FAIL() << "opened its own handle";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("same process"), std::string::npos) << e.what();
  }
  EXPECT_EQ(memory.opened.load(), 0);
}

TEST(DeviceShare, ADifferentSizeIsRefusedNamingBoth) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  FakeDeviceMemory memory("0000:01:00.0");
  DeviceShare owner(memory, optionsFor(job, 0), fillPattern);
  pid_t child = forkChild([&] {
    FakeDeviceMemory mine("0000:01:00.0");
    DeviceShare::Options o = optionsFor(job, 1);
    o.bytes = kBytes - 4;
    try {
      DeviceShare share(mine, o, nullptr);
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      return m.find(std::to_string(kBytes)) != std::string::npos &&
                     m.find(std::to_string(kBytes - 4)) != std::string::npos
                 ? 0
                 : 12;
    }
    return 13;
  });
  EXPECT_EQ(waitChild(child), 0);
}

TEST(DeviceShare, AnotherGpuNeedsPeerAccess) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  FakeDeviceMemory memory("0000:01:00.0");
  DeviceShare owner(memory, optionsFor(job, 0, 3), fillPattern);
  pid_t refused = forkChild([&] {
    FakeDeviceMemory other("0000:02:00.0");  // no peer access to 01
    try {
      DeviceShare share(other, optionsFor(job, 1, 3), nullptr);
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      return m.find("0000:02:00.0") != std::string::npos && m.find("0000:01:00.0") != std::string::npos &&
                     m.find("peer access") != std::string::npos
                 ? 0
                 : 14;
    }
    return 15;
  });
  EXPECT_EQ(waitChild(refused), 0);
  pid_t peer = forkChild([&] {
    FakeDeviceMemory other("0000:03:00.0", {"0000:01:00.0"});
    DeviceShare share(other, optionsFor(job, 2, 3), nullptr);
    return static_cast<float*>(share.data())[5] == 5.0f ? 0 : 16;
  });
  EXPECT_EQ(waitChild(peer), 0);
}

// What the test and its importer say to each other, in memory both map (MAP_SHARED, before fork).
struct Handshake {
  std::atomic<int> holding{0};  // the importer has the memory open and keeps it so
  std::atomic<int> detach{0};   // the test lets it go
};

TEST(DeviceShare, TheOwnerOutlivesItsImporters) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  void* shared = ::mmap(nullptr, sizeof(Handshake), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  Handshake* talk = new (shared) Handshake;
  FakeDeviceMemory memory("0000:01:00.0");
  auto owner = std::make_unique<DeviceShare>(memory, optionsFor(job, 0), fillPattern);
  pid_t child = forkChild([&] {
    FakeDeviceMemory mine("0000:01:00.0");
    DeviceShare share(mine, optionsFor(job, 1), nullptr);
    float* v = static_cast<float*>(share.data());
    talk->holding = 1;
    if (!eventually([&] { return talk->detach.load() == 1; }, 20s)) return 17;
    // Still the owner's allocation: the fake frees it by removing its file.
    if (mine.allocationsOnDisk() != 1) return 18;
    v[1] = 43.0f;
    return 0;  // detaches here
  });
  ASSERT_TRUE(eventually([&] { return talk->holding.load() == 1; }));
  std::atomic<bool> resetReturned{false};
  std::thread closing([&] {
    owner.reset();
    resetReturned = true;
  });
  // A correct owner cannot return while the importer holds on, however this thread is scheduled
  // (only its 10 s timeout would end the wait): this bounded wait can let a broken owner pass,
  // never fail a correct one.
  EXPECT_FALSE(eventually([&] { return resetReturned.load(); }, 300ms)) << "returned while an importer held it";
  EXPECT_EQ(memory.released.load(), 0) << "freed while an importer still had it open";
  talk->detach = 1;
  EXPECT_TRUE(eventually([&] { return resetReturned.load(); })) << "still waiting after the importer detached";
  closing.join();
  EXPECT_EQ(memory.released.load(), 1);
  EXPECT_EQ(waitChild(child), 0);
  ::munmap(shared, sizeof(Handshake));
}

TEST(DeviceShare, AnImporterThatDiedDoesNotHoldTheOwner) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  FakeDeviceMemory memory("0000:01:00.0");
  auto owner = std::make_unique<DeviceShare>(memory, optionsFor(job, 0), fillPattern);
  float* values = static_cast<float*>(owner->data());
  pid_t child = forkChild([&] {
    FakeDeviceMemory mine("0000:01:00.0");
    DeviceShare share(mine, optionsFor(job, 1), nullptr);
    static_cast<float*>(share.data())[0] = 42.0f;
    pause();  // killed below, still attached
    return 0;
  });
  ASSERT_TRUE(eventually([&] { return values[0] == 42.0f; }));
  kill(child, SIGKILL);
  EXPECT_EQ(waitChild(child), -SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  owner.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "waited for a dead importer";
}

TEST(DeviceShare, ImportersDetectTheLossOfTheOwner) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  pid_t ownerPid = forkChild([&] {
    FakeDeviceMemory memory("0000:01:00.0");
    DeviceShare owner(memory, optionsFor(job, 0), fillPattern);
    pause();  // killed by the test
    return 0;
  });
  FakeDeviceMemory mine("0000:01:00.0");
  DeviceShare share(mine, optionsFor(job, 1), nullptr);
  EXPECT_NO_THROW(share.throwIfOwnerLost());
  std::this_thread::sleep_for(150ms);
  EXPECT_NO_THROW(share.throwIfOwnerLost()) << "a live owner reported lost";
  kill(ownerPid, SIGKILL);
  EXPECT_EQ(waitChild(ownerPid), -SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  bool lost = eventually([&] {
    try {
      share.throwIfOwnerLost();
      return false;
    } catch (const PeerError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("pid " + std::to_string(ownerPid)), std::string::npos) << m;
      EXPECT_NE(m.find("owns the shared GPU parameters"), std::string::npos) << m;
      return true;
    }
  });
  EXPECT_TRUE(lost);
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 2s);
}

TEST(DeviceShare, ACallerWhoseWorkFailedLearnsOfTheOwnersLossAtOnce) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  pid_t ownerPid = forkChild([&] {
    FakeDeviceMemory memory("0000:01:00.0");
    DeviceShare owner(memory, optionsFor(job, 0), fillPattern);
    pause();
    return 0;
  });
  FakeDeviceMemory mine("0000:01:00.0");
  DeviceShare::Options o = optionsFor(job, 1);
  o.ownerCheckInterval = 10s;  // the watcher would notice far too late
  DeviceShare share(mine, o, nullptr);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(share.throwIfOwnerLost(100ms)) << "a live owner reported lost";
  EXPECT_GE(std::chrono::steady_clock::now() - start, 90ms) << "did not give the owner's exit time to show";
  kill(ownerPid, SIGKILL);
  EXPECT_EQ(waitChild(ownerPid), -SIGKILL);
  EXPECT_THROW(share.throwIfOwnerLost(1s), PeerError);
  EXPECT_THROW(share.throwIfOwnerLost(), PeerError) << "the loss is remembered";
}

TEST(DeviceShare, AnImporterWithoutAnOwnerTimesOut) {
  ScopedShmDir dir;
  FakeDeviceMemory mine("0000:01:00.0");
  DeviceShare::Options o = optionsFor(freshJobId(), 1);
  o.timeout = 200ms;
  try {
    DeviceShare share(mine, o, nullptr);
    FAIL() << "attached to nothing";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("owner of the GPU parameters"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cohort::ipc
