// Checkpoints: named float32 tensors plus string metadata in one safetensors file.
//
// The file is standard safetensors, so PyTorch's `safetensors` reads it:
//   [8 bytes: header length N, little-endian u64]
//   [N bytes: UTF-8 JSON, space-padded so that the byte buffer starts 8-byte aligned]
//   [byte buffer]
// The JSON holds one entry per tensor, {"dtype":"F32","shape":[...],"data_offsets":[begin,end]}
// (offsets relative to the byte buffer; tensors lie contiguously in the order given to
// writeCheckpoint and cover the buffer exactly), and "__metadata__", a string-to-string map with
// the caller's metadata plus reserved keys (CRCs as 8 lowercase hex digits):
//   "format"          kCheckpointFormat
//   "crc32c.<name>"   CRC32C of that tensor's bytes
//   "header_crc32c"   CRC32C of the header's meaning, so that altered names, shapes or metadata
//                     are caught too. It covers this compact, key-sorted JSON, which Python's
//                     json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
//                     also produces:
//     {"metadata":{all other metadata keys},"tensors":{"<name>":{"dtype":"F32","shape":[...]}}}
//
// Writing is atomic (runtime/output_file.h): the bytes go to a fresh `.<basename>.tmp.<pid>.<random>`
// in the target's directory, created exclusively (O_EXCL|O_NOFOLLOW, 0600, so no file or symbolic
// link another user planted is ever written); that file is fsynced and renamed over the target,
// then the directory is fsynced. A checkpoint is mode 0600. A crash leaves either the old or the new
// complete file at the path (a writer killed mid-write leaves its temporary file behind, which the
// next writer of that path removes).
// Reading validates the whole file (layout, JSON, dtypes, shapes, offsets, CRCs) and either returns
// everything or throws IoError with a one-line message naming the file, the problem and, where
// meaningful, the byte offset in the file (ranges are "bytes begin..end", half-open file offsets);
// it never returns partial results. It reads the file once, straight into the new tensors.
//
// Ownership: readCheckpoint returns tensors that own fresh CPU memory; writeCheckpoint only reads
// the caller's tensors. Thread safety: the functions share no state. Several processes may write
// one path at once, and so may several threads (each writer has its own temporary file; the last
// rename wins).
//
//   writeCheckpoint(path, {{"fc1.weight", w}, {"fc1.bias", b}}, {{"step", "100"}});
//   Checkpoint ckpt = readCheckpoint(path);
//   const runtime::Tensor* w2 = ckpt.find("fc1.weight");
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/output_mode.h"
#include "runtime/tensor.h"

namespace cohort::nn {

inline constexpr char kCheckpointFormat[] = "cohort-checkpoint-v1";
// Headers longer than this are refused as corrupt (the same limit as the safetensors library).
inline constexpr uint64_t kMaxCheckpointHeaderBytes = 100'000'000;

// A float32 tensor and the name it is stored under.
struct NamedTensor {
  std::string name = {};
  runtime::Tensor tensor = {};
};

// Caller metadata: strings only (safetensors allows nothing else). The keys "format",
// "header_crc32c" and "crc32c.*" are reserved.
using Metadata = std::map<std::string, std::string>;

struct Checkpoint {
  std::vector<NamedTensor> tensors = {};  // in file order, i.e. the order they were written in
  Metadata metadata = {};                 // the caller's metadata; reserved keys removed

  // The tensor stored under `name`, or nullptr.
  const runtime::Tensor* find(const std::string& name) const;
};

// Writes `tensors` and `metadata` to `path` atomically (see above). Throws InvalidArgument for
// empty, duplicate or reserved names ("__metadata__"), reserved metadata keys, and undefined
// tensors (before touching the disk); GPU tensors are copied to the host first (synchronise the
// stream that wrote them before calling); IoError naming the path and the errno text when the
// file cannot be written, in which case the temporary file is removed and `path` is untouched. (If
// only the final directory fsync fails, the new file is already in place but may not survive a
// power loss; that is an IoError too.)
void writeCheckpoint(const std::string& path, const std::vector<NamedTensor>& tensors,
                     const Metadata& metadata = {});

// Writes `parts`, one after the other, to `path` atomically as writeCheckpoint writes (the same
// temporary file, lock, fsyncs and rename; the same errors): for other files that must never be
// seen half-written, e.g. an llm.c model file (nn/gpt_files.h). `mode`: the finished file's
// (runtime/output_file.h); writeCheckpoint's are kPrivate (0600), writeSafetensors' kUserVisible.
void writeFileAtomically(const std::string& path, const std::vector<std::span<const std::byte>>& parts,
                         runtime::OutputMode mode = runtime::OutputMode::kUserVisible);

// Before a run writes `path` (a checkpoint, metrics, a trace, a plot): IoError "<path>: <why>"
// unless the path is no directory, the directory it is in exists (nothing is created) and a file can
// be created there (a probe file, created exclusively and removed). `what` names the output in the
// message ("checkpoints", "metrics"). InvalidArgument for a path ending in '/'.
void checkOutputFile(const std::string& path, const std::string& what);

// Before a run trains: checks that checkpoints can be written at `path` (checkOutputFile) and removes the
// temporary files of `path` that earlier writers left behind when they were killed mid-write
// (".<name>.tmp.<pid>" whose writer is gone; never one a live process is writing). writeCheckpoint
// removes them too. Returns how many it removed.
size_t prepareCheckpointDestination(const std::string& path);

// Holds `path` for one run's checkpoints (the Trainer takes it on rank 0 before the first step):
// an exclusive flock on "<dir>/.<name>.lock" (created 0600, opened O_NOFOLLOW), which records who
// holds it (pid and host). A second run with the same path is refused at once with IoError naming
// the holder, where it used to run beside the first, the last writer winning. The lock is judged by
// its live holder (/proc/locks), never by the pid the file records: the lock goes with the process
// however it ends (a stale file holds no lock), and a lock held by another user's process (who
// opened our old 0644 file and flocked it) is no run of ours: the file is replaced and taken. A lock
// file that is a symbolic link, not a regular file, or owned by another user is refused at once
// ("<lock> is owned by user X (uid N), not you: ..."). The destructor removes the file. Movable,
// not copyable.
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::string& path);
  CheckpointLock(CheckpointLock&& other) noexcept;
  CheckpointLock& operator=(CheckpointLock&&) = delete;
  CheckpointLock(const CheckpointLock&) = delete;
  ~CheckpointLock();

 private:
  std::string lockPath_;
  int fd_ = -1;
};

// Who holds `path`'s CheckpointLock now ("pid N on HOST; <lock file>"), or nullopt when no process of
// this user does (no lock file, or one nobody of ours holds). Takes no lock: a run starting meanwhile
// is not disturbed.
std::optional<std::string> checkpointLockHolder(const std::string& path);

// Reads and validates the checkpoint at `path`. Throws IoError for anything missing or corrupt.
Checkpoint readCheckpoint(const std::string& path);

// Any safetensors file, e.g. HuggingFace's model.safetensors: tensors of dtype F32, F16 or BF16
// (widened to float32), with or without metadata, returned as given. The layout is validated as
// readCheckpoint validates it; the CRCs are checked where the file is a Cohort checkpoint (its
// metadata says so), and then the CRC keys are removed (its "format", kCheckpointFormat, is kept).
Checkpoint readSafetensors(const std::string& path);

// Writes plain safetensors, atomically as writeCheckpoint writes: float32 tensors and `metadata`
// as given (no format key, no CRCs; none of the keys is reserved), e.g. {"format": "pt"} for
// HuggingFace's loaders, which insist on it.
void writeSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const Metadata& metadata = {});

// CRC32C (Castagnoli; check value crc32c("123456789") == 0xE3069283). Chains: crc32c(b, nb,
// crc32c(a, na)) is the CRC of a followed by b.
uint32_t crc32c(const void* data, size_t bytes, uint32_t previous = 0);

}  // namespace cohort::nn
