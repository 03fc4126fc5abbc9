#include "launcher/mps_probe.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>

#include "runtime/unique_fd.h"

namespace cohort::launcher {
namespace {

bool allDigits(const std::string& text) {
  return !text.empty() && text.size() < 10 &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string trimmed(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

// The subdirectories of `dir` (one per GPU, named by PCI bus id); 0 when it cannot be read.
int countSubdirectories(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return 0;
  int count = 0;
  while (dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (::stat((dir + "/" + name).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) ++count;
  }
  return count;
}

// A unix socket at `path` that connect() reaches. Non-blocking: a full backlog (EAGAIN) still
// means that someone listens. MPS's control socket is SOCK_SEQPACKET; a stream socket is tried
// too, so the probe does not depend on the daemon's version. A path longer than sockaddr_un holds
// (107 bytes) is reached through its directory's descriptor, /proc/self/fd/N/NAME.
bool socketAccepts(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::string target = path;
  runtime::UniqueFd dir;
  if (path.size() >= sizeof address.sun_path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos || slash == 0) return false;
    dir = runtime::UniqueFd(::open(path.substr(0, slash).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir) return false;
    target = "/proc/self/fd/" + std::to_string(dir.get()) + path.substr(slash);
    if (target.size() >= sizeof address.sun_path) return false;
  }
  std::memcpy(address.sun_path, target.c_str(), target.size() + 1);
  for (int type : {SOCK_SEQPACKET, SOCK_STREAM}) {
    runtime::UniqueFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) return false;
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) return true;
    if (errno == EAGAIN || errno == EINPROGRESS) return true;
    if (errno != EPROTOTYPE) return false;  // ECONNREFUSED: a socket left by a daemon that is gone
  }
  return false;
}

// A FIFO that some process holds open for reading: opening it for writing without blocking
// succeeds only then (ENXIO otherwise).
bool fifoHasReader(const std::string& path) {
  runtime::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  return static_cast<bool>(fd);
}

GpuSharing notShared(const std::string& reason) { return {.shared = false, .device = "", .reason = reason}; }

}  // namespace

std::optional<std::string> environmentValue(const std::vector<std::string>& environment, const std::string& name) {
  std::optional<std::string> value;
  const std::string prefix = name + "=";
  for (const std::string& entry : environment) {
    if (entry.rfind(prefix, 0) == 0) value = entry.substr(prefix.size());
  }
  return value;
}

std::string nvidiaGpusDirectory(const std::vector<std::string>& environment) {
  std::optional<std::string> dir = environmentValue(environment, "COHORT_NVIDIA_GPUS_DIR");
  return dir && !dir->empty() ? *dir : std::string("/proc/driver/nvidia/gpus");
}

int countVisibleGpus(const std::string& gpusDirectory, const std::optional<std::string>& cudaVisibleDevices) {
  const int installed = countSubdirectories(gpusDirectory);
  if (!cudaVisibleDevices) return installed;
  if (installed == 0) return 0;
  int visible = 0;
  std::set<int> indices;
  std::string list = *cudaVisibleDevices;
  for (size_t begin = 0; begin <= list.size();) {
    size_t end = list.find(',', begin);
    if (end == std::string::npos) end = list.size();
    const std::string entry = trimmed(list.substr(begin, end - begin));
    if (allDigits(entry)) {
      const int index = std::stoi(entry);
      if (index >= installed || !indices.insert(index).second) break;
    } else if (entry.rfind("GPU-", 0) != 0 && entry.rfind("MIG-", 0) != 0) {
      break;  // "", "-1", "none": CUDA sees nothing from here on
    }
    ++visible;
    begin = end + 1;
  }
  return visible;
}

std::optional<std::string> workerDevice(const std::vector<std::string>& command) {
  std::optional<std::string> device;
  for (size_t i = 1; i < command.size(); ++i) {
    if (command[i] == "--device" && i + 1 < command.size()) {
      device = command[++i];
    } else if (command[i].rfind("--device=", 0) == 0) {
      device = command[i].substr(9);
    }
  }
  return device;
}

GpuSharing detectGpuSharing(const MpsProbeInputs& inputs) {
  const int gpus = countVisibleGpus(inputs.gpusDirectory, environmentValue(inputs.environment, "CUDA_VISIBLE_DEVICES"));
  if (gpus == 0) {
    return notShared("no NVIDIA GPU is visible (none in " + inputs.gpusDirectory +
                     ", or CUDA_VISIBLE_DEVICES hides them)");
  }
  const std::optional<std::string> device = workerDevice(inputs.command);
  if (!device || device->rfind("cuda", 0) != 0) {
    return notShared("the worker command has no --device cuda:N");
  }
  if (*device == "cuda") return notShared("each worker gets its own GPU (--device cuda)");
  const std::string index = device->rfind("cuda:", 0) == 0 ? device->substr(5) : "";
  if (!allDigits(index) || std::stoi(index) >= gpus) {
    return notShared("--device " + *device + " is not one of the " + std::to_string(gpus) + " visible GPU(s)");
  }
  if (inputs.workers < 2) return notShared("a single worker has the GPU to itself");
  return {.shared = true, .device = *device, .reason = ""};
}

std::string mpsControlPath(const std::vector<std::string>& environment) {
  std::optional<std::string> dir = environmentValue(environment, "CUDA_MPS_PIPE_DIRECTORY");
  return (dir && !dir->empty() ? *dir : std::string("/tmp/nvidia-mps")) + "/control";
}

bool mpsControlAccepts(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  if (S_ISSOCK(st.st_mode)) return socketAccepts(path);
  if (S_ISFIFO(st.st_mode)) return fifoHasReader(path);
  return false;
}

std::string mpsNote(const MpsProbeInputs& inputs) {
  const GpuSharing sharing = detectGpuSharing(inputs);
  if (inputs.mpsRequested) {
    if (sharing.shared) return "";
    return "note: --mps: MPS is not needed, as far as cohortrun can tell: " + sharing.reason +
           " (the daemon runs anyway)";
  }
  if (!sharing.shared) return "";
  const std::string control = mpsControlPath(inputs.environment);
  if (mpsControlAccepts(control)) return "";
  const std::string n = std::to_string(inputs.workers);
  return "note: " + n + " workers share GPU " + sharing.device + " but no MPS daemon answers at " + control +
         ", so the GPU time-slices between them and they run no faster than one (Hogwild on an H200: 201k "
         "samples/s with 1 worker, 185k with 4, 296k with 4 under MPS); add --mps to start a daemon for this job "
         "(docs/gpu.md)";
}

}  // namespace cohort::launcher
