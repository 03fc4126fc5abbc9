// The layout of the shm backend's job segment "cohort.<jobId>.comm" (docs/collectives.md).
//
//   payload offset 0     Control: magic, numRanks, slots, chunkBytes (checked by every opener)
//   64                   ipc::ProcessBarrier for numRanks ranks (set-up only)
//   64-aligned           RankSlot[numRanks]: pid/start time, the published fingerprint and buffer
//                        references, the chunk counters (copied, reduced, consumed) and the futex "bell"
//   4096-aligned         staging: numRanks x kSlots buffers of chunkBytes each
// Every word another process reads is a lock-free std::atomic; the staging buffers are plain memory
// whose hand-over is ordered by the counters (release store by the writer, acquire load by readers).
// Thread safety: a RankSlot is written only by its own rank (its progress thread); any rank reads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "ipc/barrier.h"

namespace cohort::collectives::shm {

inline constexpr uint64_t kCommMagic = 0x4d4d4f43484f4332ull;  // bumped with every change of this layout
inline constexpr int kSlots = 4;  // staging buffers per rank: chunk g uses slot g % kSlots

struct ShmControl {
  uint64_t magic;
  uint32_t numRanks;
  uint32_t slots;
  uint64_t chunkBytes;
};

// The fingerprint is published seqlock-style: fpState = kFpWriting, the two words, then
// fpState = sequence + 1 (release). A reader that sees the same state before and after reading the
// words has a consistent fingerprint.
inline constexpr uint64_t kFpWriting = ~uint64_t{0};

struct alignas(64) RankSlot {
  std::atomic<uint64_t> pid;
  std::atomic<uint64_t> startTicks;
  std::atomic<uint64_t> fpState;  // 0 = none yet, kFpWriting, or sequence + 1
  std::atomic<uint64_t> fpWord;   // kind | op << 8 | dtype << 16 | (uint32 root) << 32
  std::atomic<uint64_t> fpCount;
  // Published with the fingerprint (same seqlock): where this rank's input and output lie when they
  // are in its shared buffers (shm_buffers.h; id 0 = not shared).
  alignas(64) std::atomic<uint64_t> inId;
  std::atomic<uint64_t> inOffset;
  std::atomic<uint64_t> inBytes;
  std::atomic<uint64_t> outId;
  std::atomic<uint64_t> outOffset;
  std::atomic<uint64_t> outBytes;
  alignas(64) std::atomic<uint64_t> copied;  // chunks whose input this rank has staged
  std::atomic<uint64_t> reduced;             // chunks whose own segment this rank has reduced
  std::atomic<uint64_t> consumed;            // chunks this rank has finished reading (its slot reads done)
  alignas(64) std::atomic<uint32_t> bell;    // bumped on every publish; futex word
  std::atomic<uint32_t> waiters;             // processes sleeping on bell (the publisher wakes only if > 0)
};

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(RankSlot) == 256);

inline size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct SegmentLayout {
  size_t barrierOffset = 64;
  size_t slotsOffset = 0;
  size_t stagingOffset = 0;
  size_t totalBytes = 0;

  SegmentLayout(int numRanks, size_t chunkBytes) {
    slotsOffset = alignUp(barrierOffset + ipc::ProcessBarrier::bytesFor(numRanks), 64);
    stagingOffset = alignUp(slotsOffset + sizeof(RankSlot) * numRanks, 4096);
    totalBytes = stagingOffset + static_cast<size_t>(numRanks) * kSlots * chunkBytes;
  }
};

}  // namespace cohort::collectives::shm
