// TensorBoardWriter: scalars (loss, accuracy, learning rate, ...) as a TensorBoard event file, so that
// `tensorboard --logdir DIR` plots a run.
//
// Each writer creates one new file, DIR/events.out.tfevents.<unix seconds, 10 digits>.<hostname>.<pid>.<n>
// (TensorBoard's naming; n is the lowest number from 0 that makes the name new, so two writers of one
// process in one second get two files). The file is a sequence of TFRecord records, each
//   [u64 length N, little-endian][u32 masked CRC32C of those 8 bytes][N bytes][u32 masked CRC32C of them]
// with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (u32 arithmetic, little-endian). Each
// record's bytes are one serialized Event (train/observe/tensorboard_event.proto, TensorBoard's field numbers):
// the first {wall_time, file_version: "brain.Event:2"}, then one per scalar
// {wall_time, step, summary: {value: [{tag, simple_value}]}}. simple_value is a float32 (the value
// rounded to nearest). tests/train/tensorboard_reader.py reads the files independently.
//
// Records are buffered and reach the file at flush(), when the buffer holds 64 KiB, when a scalar
// comes more than 5 s after the last write, and in the destructor; nothing is fsynced (a crash may
// lose the last records, never corrupt the earlier ones). Errors are IoError naming the file; after
// one, every later call throws again, since the file may end in a torn record.
//
// Ownership: the writer owns its open file (closed by the destructor); copy is deleted. Thread
// safety: none; use a writer from one thread (in a job, rank 0's training thread).
//
//   train::TensorBoardWriter tb(runDir);               // IoError if runDir cannot hold the file
//   tb.scalar("train/loss", step, loss);
//   tb.flush();                                        // e.g. at each epoch's end
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/unique_fd.h"

namespace cohort::train {

// The TFRecord file version TensorBoard expects in each file's first event.
inline constexpr char kTensorBoardFileVersion[] = "brain.Event:2";

// One scalar event. The tag must be valid UTF-8 (TensorBoard's tags are proto3 strings).
struct TensorBoardScalar {
  std::string_view tag = {};
  int64_t step = 0;
  double value = 0;
  std::optional<double> wallTime = {};  // seconds since the Unix epoch; unset: now
};

class TensorBoardWriter {
 public:
  // Creates `dir` and its missing parents (as mkdir -p does) and a new event file in it holding the
  // file-version record (written at once, so the file is valid from the start). IoError naming the
  // directory or file and the reason when either cannot be created or written; InvalidArgument for
  // an empty `dir`.
  explicit TensorBoardWriter(const std::string& dir);
  // Flushes; an error there is lost (call flush() first to see it).
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends one scalar event with the wall time now. InvalidArgument for a tag that is not UTF-8.
  void scalar(std::string_view tag, int64_t step, double value);
  // The same with the wall time given (e.g. one shared by several scalars of a step).
  void scalar(const TensorBoardScalar& scalar);

  // Writes the buffered records to the file (no fsync). IoError naming the file.
  void flush();

  // The event file's path: dir + "/" + its name.
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event);
  void writeAll(std::string_view bytes);

  std::string path_;
  runtime::UniqueFd fd_;
  std::string pending_;  // whole records not yet written
  std::chrono::steady_clock::time_point lastWrite_;
  std::string failure_;  // the first error's message; non-empty: the writer is broken
};

}  // namespace cohort::train
