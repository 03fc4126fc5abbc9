// The probe behind cohortrun's MPS note (launcher/mps_probe.h) on fake trees: GPU directories in
// place of /proc/driver/nvidia/gpus, CUDA_VISIBLE_DEVICES, the worker's --device, and control
// files that do or do not answer (a FIFO with and without a reader, listening and stale unix
// sockets of both types MPS versions use).
#include "launcher/mps_probe.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "runtime/unique_fd.h"
#include "tests/launcher/launcher_test_support.h"

namespace cohort::launcher {
namespace {

using runtime::UniqueFd;

class MpsProbeTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::freshTempDir(); }

  // A fake /proc/driver/nvidia/gpus with `n` GPU directories (and a file that is not one).
  std::string gpuTree(int n) {
    const std::string gpus = dir_ + "/gpus" + std::to_string(n);
    EXPECT_EQ(::mkdir(gpus.c_str(), 0700), 0);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(::mkdir((gpus + "/0000:" + std::to_string(17 + i) + ":00.0").c_str(), 0700), 0);
    }
    std::ofstream(gpus + "/README") << "not a GPU\n";
    return gpus;
  }

  // A unix socket of `type` bound at `path` (through its directory's descriptor: the test's
  // directory is longer than sockaddr_un holds), listening when `listen` says so.
  static UniqueFd socketAt(const std::string& path, int type, bool listen) {
    const size_t slash = path.rfind('/');
    UniqueFd dir(::open(path.substr(0, slash).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    const std::string target = "/proc/self/fd/" + std::to_string(dir.get()) + path.substr(slash);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, target.c_str(), target.size() + 1);
    UniqueFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address), 0) << std::strerror(errno);
    if (listen) EXPECT_EQ(::listen(fd.get(), 4), 0);
    return fd;
  }

  std::string dir_;
};

TEST_F(MpsProbeTest, CountsTheGpuDirectoriesThatCudaVisibleDevicesLeaves) {
  const std::string four = gpuTree(4);
  EXPECT_EQ(countVisibleGpus(four, std::nullopt), 4);
  EXPECT_EQ(countVisibleGpus(gpuTree(0), std::nullopt), 0);
  EXPECT_EQ(countVisibleGpus(dir_ + "/absent", std::nullopt), 0);  // no NVIDIA driver
  EXPECT_EQ(countVisibleGpus(dir_ + "/absent", "0,1"), 0);
  EXPECT_EQ(countVisibleGpus(four, "0,1"), 2);
  EXPECT_EQ(countVisibleGpus(four, " 3 , 0 "), 2);
  EXPECT_EQ(countVisibleGpus(four, "2"), 1);
  EXPECT_EQ(countVisibleGpus(four, ""), 0);
  EXPECT_EQ(countVisibleGpus(four, "-1"), 0);
  EXPECT_EQ(countVisibleGpus(four, "0,7,1"), 1);  // CUDA stops at the first index it cannot use
  EXPECT_EQ(countVisibleGpus(four, "1,1"), 1);    // ... and at a repeated one
  EXPECT_EQ(countVisibleGpus(four, "GPU-8a3f,MIG-1c2d"), 2);
  EXPECT_EQ(countVisibleGpus(four, "0,none,1"), 1);
}

TEST(MpsProbe, ReadsTheLastDeviceOfTheWorkerCommand) {
  EXPECT_EQ(workerDevice({"cohort", "train", "--device", "cuda:0", "--mode", "hogwild"}), "cuda:0");
  EXPECT_EQ(workerDevice({"cohort", "train", "--device=cuda:1"}), "cuda:1");
  EXPECT_EQ(workerDevice({"cohort", "--device", "cpu", "--device=cuda"}), "cuda");
  EXPECT_EQ(workerDevice({"cohort", "train", "--mode", "hogwild"}), std::nullopt);
  EXPECT_EQ(workerDevice({"cohort", "train", "--device"}), std::nullopt);
  EXPECT_EQ(workerDevice({"--device", "cuda:0"}), std::nullopt);  // PROGRAM itself is not a flag
  EXPECT_EQ(workerDevice({}), std::nullopt);
}

TEST_F(MpsProbeTest, WorkersShareAGpuOnlyWithCudaNAndTwoOrMoreOfThem) {
  const std::string two = gpuTree(2);
  auto sharing = [&](int workers, std::vector<std::string> command, std::vector<std::string> env = {},
                     std::string gpus = "") {
    return detectGpuSharing(
        {.workers = workers, .command = command, .environment = env, .gpusDirectory = gpus.empty() ? two : gpus});
  };
  const std::vector<std::string> onGpu0 = {"cohort", "train", "--device", "cuda:0", "--mode", "hogwild"};
  GpuSharing shared = sharing(4, onGpu0);
  EXPECT_TRUE(shared.shared);
  EXPECT_EQ(shared.device, "cuda:0");
  EXPECT_TRUE(sharing(2, {"cohort", "train", "--device=cuda:1"}).shared);

  auto notShared = [&](const GpuSharing& s, const std::string& why) {
    EXPECT_FALSE(s.shared) << why;
    EXPECT_NE(s.reason.find(why), std::string::npos) << s.reason;
  };
  notShared(sharing(1, onGpu0), "single worker");
  notShared(sharing(4, {"cohort", "train", "--device", "cuda"}), "its own GPU (--device cuda)");
  notShared(sharing(4, {"cohort", "train", "--device", "cuda:2"}), "not one of the 2 visible");
  notShared(sharing(4, {"cohort", "train", "--device", "cuda:x"}), "not one of the 2 visible");
  notShared(sharing(4, {"cohort", "train", "--device", "cpu"}), "no --device cuda:N");
  notShared(sharing(4, {"cohort", "train"}), "no --device cuda:N");
  notShared(sharing(4, onGpu0, {}, gpuTree(0)), "no NVIDIA GPU is visible");
  notShared(sharing(4, onGpu0, {"CUDA_VISIBLE_DEVICES="}), "no NVIDIA GPU is visible");
  notShared(sharing(4, {"cohort", "--device", "cuda:1"}, {"CUDA_VISIBLE_DEVICES=1"}), "not one of the 1 visible");
}

TEST(MpsProbe, FindsTheControlSocketWhereTheDriverLooks) {
  EXPECT_EQ(mpsControlPath({"HOME=/root"}), "/tmp/nvidia-mps/control");
  EXPECT_EQ(mpsControlPath({"CUDA_MPS_PIPE_DIRECTORY="}), "/tmp/nvidia-mps/control");
  EXPECT_EQ(mpsControlPath({"CUDA_MPS_PIPE_DIRECTORY=/run/mps"}), "/run/mps/control");
  EXPECT_EQ(nvidiaGpusDirectory({}), "/proc/driver/nvidia/gpus");
  EXPECT_EQ(nvidiaGpusDirectory({"COHORT_NVIDIA_GPUS_DIR=/x/gpus"}), "/x/gpus");
}

TEST_F(MpsProbeTest, ADaemonAnswersOnlyThroughAControlThatAcceptsAConnection) {
  EXPECT_FALSE(mpsControlAccepts(dir_ + "/missing"));
  std::ofstream(dir_ + "/file") << "x";
  EXPECT_FALSE(mpsControlAccepts(dir_ + "/file"));

  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_FALSE(mpsControlAccepts(fifo));  // nobody reads it
  {
    UniqueFd reader(::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    ASSERT_TRUE(reader);
    EXPECT_TRUE(mpsControlAccepts(fifo));
  }
  EXPECT_FALSE(mpsControlAccepts(fifo));

  for (int type : {SOCK_SEQPACKET, SOCK_STREAM}) {
    const std::string socket = dir_ + "/control-" + std::to_string(type);
    ASSERT_GE(socket.size(), sizeof(sockaddr_un::sun_path)) << "the long-path case is what this test reaches";
    {
      UniqueFd listening = socketAt(socket, type, true);
      EXPECT_TRUE(mpsControlAccepts(socket)) << type;
    }
    // The daemon is gone and its socket file stays: CUDA would run without MPS.
    EXPECT_FALSE(mpsControlAccepts(socket)) << type;
  }
  UniqueFd bound = socketAt(dir_ + "/unlistened", SOCK_SEQPACKET, false);
  EXPECT_FALSE(mpsControlAccepts(dir_ + "/unlistened"));
}

TEST_F(MpsProbeTest, TheNoteNamesTheSharedGpuOnlyWhenNoDaemonAnswers) {
  const std::string gpus = gpuTree(1);
  const std::string pipes = dir_ + "/mps";
  ASSERT_EQ(::mkdir(pipes.c_str(), 0700), 0);
  MpsProbeInputs inputs{.workers = 4,
                        .command = {"cohort", "train", "--device", "cuda:0", "--mode", "hogwild"},
                        .environment = {"CUDA_MPS_PIPE_DIRECTORY=" + pipes},
                        .gpusDirectory = gpus,
                        .mpsRequested = false};
  const std::string note = mpsNote(inputs);
  EXPECT_EQ(note.rfind("note: 4 workers share GPU cuda:0 but no MPS daemon answers at " + pipes + "/control", 0), 0u)
      << note;
  EXPECT_NE(note.find("time-slices"), std::string::npos) << note;
  EXPECT_NE(note.find("add --mps"), std::string::npos) << note;
  EXPECT_NE(note.find("docs/gpu.md"), std::string::npos) << note;
  EXPECT_EQ(note.find('\n'), std::string::npos) << note;

  EXPECT_EQ(mpsNote({.workers = 4,
                     .command = {"cohort", "train", "--device", "cuda"},
                     .environment = inputs.environment,
                     .gpusDirectory = gpus,
                     .mpsRequested = false}),
            "");
  {
    ASSERT_EQ(::mkfifo((pipes + "/control").c_str(), 0600), 0);
    UniqueFd daemon(::open((pipes + "/control").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    EXPECT_EQ(mpsNote(inputs), "");
  }
  inputs.mpsRequested = true;
  EXPECT_EQ(mpsNote(inputs), "");  // --mps where it helps: nothing to say
  inputs.command = {"cohort", "train", "--device", "cuda"};
  EXPECT_EQ(mpsNote(inputs),
            "note: --mps: MPS is not needed, as far as cohortrun can tell: each worker gets its own GPU (--device "
            "cuda) (the daemon runs anyway)");
}

}  // namespace
}  // namespace cohort::launcher
