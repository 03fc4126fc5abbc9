// The header at offset 0 of every Cohort shared-memory segment (docs/ipc.md).
//
// Layout (little-endian, this machine's ABI; the segment never leaves the node):
//   [0, kSegmentHeaderBytes)                  SegmentHeader, zero-padded
//   [kSegmentHeaderBytes, + payloadBytes)     payload (4096-byte aligned, so 64-byte aligned too)
// The creator writes every field except `ready` before the file is sized, so a crashed creator
// still leaves a header that sweepStaleSegments() can attribute; it initialises the payload and only
// then stores ready = 1 with release order. Openers load `ready` with acquire order, then validate
// every other field before trusting the payload.
// Thread safety: `ready` is the only field written after creation; everything else is immutable.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace cohort::ipc {

inline constexpr uint64_t kSegmentMagic = 0x48535452484f43ull;  // "COHRTSH\0" read little-endian
inline constexpr uint32_t kSegmentLayoutVersion = 1;
inline constexpr size_t kSegmentHeaderBytes = 4096;

struct SegmentHeader {
  uint64_t magic;
  uint32_t layoutVersion;
  uint32_t headerBytes;  // == kSegmentHeaderBytes: where the payload starts
  uint64_t payloadBytes;
  uint64_t generation;
  int32_t creatorPid;
  uint32_t reserved;
  uint64_t creatorStartTicks;  // /proc/<pid>/stat field 22; 0 when unknown
  std::atomic<uint32_t> ready;
};

// `n` rounded up to a multiple of `to`: payload layouts place their areas on cache lines with it.
inline constexpr size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

static_assert(std::atomic<uint32_t>::is_always_lock_free, "ready must be lock-free across processes");
static_assert(sizeof(SegmentHeader) <= kSegmentHeaderBytes);

}  // namespace cohort::ipc
