// What cohortrun finds out, without CUDA, about GPUs its workers share and about NVIDIA's
// Multi-Process Service (MPS), so that it can say once when a job would run faster under MPS
// (docs/gpu.md, "Hogwild on a GPU"; docs/launcher.md, "MPS").
//
// cohortrun never links or loads CUDA or the driver (docs/architecture.md, "Layers"; a test starts it without
// libcuda), so everything here reads files:
//  - GPUs: one directory per GPU in /proc/driver/nvidia/gpus/ (the driver's; absent without an
//    NVIDIA driver), limited as CUDA limits them by CUDA_VISIBLE_DEVICES (countVisibleGpus).
//  - The workers' GPU: the last `--device D` or `--device=D` of the worker command (workerDevice).
//    Every worker on one GPU means `cuda:N` with at least two workers. `--device cuda` is one GPU
//    per local rank (cohort train refuses more local ranks than GPUs), so it never shares.
//  - MPS running: the control daemon's socket $CUDA_MPS_PIPE_DIRECTORY/control (default
//    /tmp/nvidia-mps/control) accepts a connection — a unix socket that connect() reaches, or a
//    FIFO (older daemons) that a reader holds open (mpsControlAccepts). Existence alone is not
//    enough: a daemon that was killed leaves its socket behind, and CUDA then runs without MPS.
//    The probe connects and closes without sending a command; the daemon reads end of file.
// Every path comes in through the inputs, so tests run on fake trees. Pure functions of their
// inputs and the file system; safe to call from any thread.
//
//   std::string note = mpsNote({.workers = 4, .command = flags.command, .environment = env,
//                               .gpusDirectory = nvidiaGpusDirectory(env), .mpsRequested = flags.mps});
//   if (!note.empty()) say(note);  // "note: 4 workers share GPU cuda:0 but no MPS daemon …"
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace cohort::launcher {

// The value of NAME in "NAME=value" entries (the last one), or nullopt when absent.
std::optional<std::string> environmentValue(const std::vector<std::string>& environment, const std::string& name);

// /proc/driver/nvidia/gpus, or $COHORT_NVIDIA_GPUS_DIR when set (tests give cohortrun a fake tree).
std::string nvidiaGpusDirectory(const std::vector<std::string>& environment);

// The GPUs a CUDA program would see: the directories in `gpusDirectory` (0 when it is absent), or,
// when CUDA_VISIBLE_DEVICES is set, its entries up to the first one CUDA would reject (as CUDA
// stops there): an index below the GPU count not given before, or a GPU-/MIG- UUID. "" sees none.
int countVisibleGpus(const std::string& gpusDirectory, const std::optional<std::string>& cudaVisibleDevices);

// The value of the last `--device D` / `--device=D` after PROGRAM in `command`, or nullopt.
std::optional<std::string> workerDevice(const std::vector<std::string>& command);

struct GpuSharing {
  bool shared = false;  // at least two workers on one GPU
  std::string device;   // the shared GPU ("cuda:0") when shared
  std::string reason;   // why not, when not shared ("each worker gets its own GPU (--device cuda)")
};

struct MpsProbeInputs {
  int workers = 1;                       // --nproc-per-node
  std::vector<std::string> command;      // PROGRAM ARGS…
  std::vector<std::string> environment;  // cohortrun's: CUDA_VISIBLE_DEVICES, CUDA_MPS_PIPE_DIRECTORY
  std::string gpusDirectory = "/proc/driver/nvidia/gpus";
  bool mpsRequested = false;  // --mps: cohortrun starts a daemon of its own
};

GpuSharing detectGpuSharing(const MpsProbeInputs& inputs);

// $CUDA_MPS_PIPE_DIRECTORY/control, or /tmp/nvidia-mps/control, as the CUDA driver looks for it.
std::string mpsControlPath(const std::vector<std::string>& environment);

// True when a control daemon answers at `path` (see the top of this file); false for a missing
// file, a socket nobody listens on, a FIFO without a reader, or anything else.
bool mpsControlAccepts(const std::string& path);

// The one line cohortrun says before the first attempt (without "cohortrun: "), or "" for none:
//  - workers share a GPU, no --mps and no daemon answers: what to expect and how to get MPS;
//  - --mps where the workers share no GPU: MPS is not needed (the daemon runs anyway, as asked).
std::string mpsNote(const MpsProbeInputs& inputs);

}  // namespace cohort::launcher
