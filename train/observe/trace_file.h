// The job's trace (--trace FILE): every rank's timeline (train/observe/timeline.h) merged by rank 0 into one
// Chrome trace / Perfetto JSON file, one process row per rank on rank 0's clock.
//
// Common clock. Ranks on different nodes have unrelated CLOCK_MONOTONIC clocks, so at start-up
// measureClocks() runs kClockRounds rounds of two back-to-back collectives (Job::reduce of one
// value). A collective cannot complete on rank r before rank 0 entered it, nor on rank 0 before rank
// r entered it, so with rank 0 entering the first at A and leaving the second at D (its clock), and
// rank r leaving the first at B and entering the second at C (its clock), rank r's clock is ahead of
// rank 0's by theta with C - D <= theta <= B - A. The estimate is the middle of the round whose
// interval is narrowest, and half its width is the error bound, written into the file
// ("otherData": "clock_error_bound_us" per rank) — a few microseconds over shared memory, tens over
// MPI on a network. On one node the clocks are one clock and the offsets come out near 0.
//
// Merging. writeTrace() is collective: every rank's spans travel to rank 0 through Job::reduce
// (sums of rows that are zero except the sender's, exact: each 64-bit time goes as three 21-bit
// integers, which float32 holds exactly), and rank 0 writes the file (temporary file, then rename).
// Spans: "X" events with ts/dur in microseconds, pid = rank, tid 0 = the training thread (nested
// spans: a step holds its barriers, communication wait and optimizer), tid 1 = the bucket
// all-reduces (issued -> seen done), args.step = the optimizer step. A ring that overflowed keeps
// its newest spans; "otherData": "dropped_spans" says how many went per rank.
// Thread safety: the training thread; collective (every rank, same order).
#pragma once

#include <string>

#include "train/job.h"
#include "train/observe/timeline.h"

namespace cohort::train {

inline constexpr int kClockRounds = 16;

// Collective: fills timeline.clockRounds() (nothing in a world of one). Call right after a barrier.
void measureClocks(Job& job, Timeline& timeline);
// Collective: gathers every rank's spans and rank 0 writes `path`. IoError (rank 0) when it cannot.
// `testSkewNs` (a test hook, TestHooks::clockSkew; 0 otherwise): this rank's clock reads that far
// ahead, as another node's may, so that tests can check that the offsets undo it.
void writeTrace(Job& job, const Timeline& timeline, const std::string& path, int64_t testSkewNs = 0);

}  // namespace cohort::train
