// What Job::save is asked, and what Job::settleCheckpoint reports (public, part of Job's API;
// docs/checkpoints.md, "Sharded checkpoints in training").
//
// A sharded job (JobOptions::zero >= 1) writes each rank's shard file and commits a manifest
// (train/checkpoint/sharded_checkpointer.h). With SaveOptions::async the save only copies the
// rank's shard to staging memory and returns; the file is written in the background and the
// checkpoint is committed by a later Job::settleCheckpoint (or the next save, or a load).
//
//   job.save(path, metadata, {.async = true});                   // training goes on at once
//   ... job.step(); if (auto c = job.settleCheckpoint({.wait = false})) log(*c);  // committed?
//   job.settleCheckpoint();                                       // before the program ends
// Thread safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::train {

struct SaveOptions {
  // Sharded jobs: stage the shard and write it in the background (above). Other jobs refuse it
  // (InvalidArgument): they write one whole-model file from rank 0 and have nothing to stage.
  bool async = false;
};

struct SettleOptions {
  // true: wait (up to the job's timeout) until every rank's shard file is durable, then commit.
  // false: commit only if every rank's write is already durable, otherwise return at once (one
  // small collective either way).
  bool wait = true;
};

// A checkpoint the job committed (its manifest renamed into place).
struct CheckpointCommit {
  std::string path = {};
  uint64_t generation = 0;
  int shardFiles = 0;          // how many ranks' files the manifest names
  std::string step = {};       // the saved metadata's "step", where the caller gave one
  double stagedSeconds = 0;    // how long the save held training (this rank: packing, staging)
  double writtenSeconds = 0;   // from the save to the commit (this rank)
  size_t stagingBytes = 0;     // this rank's staging memory (one checkpoint's shard), 0 when synchronous
  // Rank 0: old files the commit could not remove, one line each (the commit itself succeeded).
  std::vector<std::string> cleanupErrors = {};
};

}  // namespace cohort::train
