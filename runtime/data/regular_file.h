// The rule every file-based dataset (mnist:, cifar10:, csv:, text:) opens its files by: a regular
// file, symbolic links followed, or an IoError naming the path and what it is instead.
//
// Why not devices, FIFOs or pipes: a dataset is read whole, once per split (text: reads its file for
// the train and again for the test split) and once per rank, so a stream that gives its bytes once
// cannot serve it, and one without an end (/dev/zero, /dev/urandom) would be read until memory runs
// out. A FIFO is refused without waiting for a writer (the open does not block). /dev/stdin works
// when the shell redirects a regular file into it (`< data.csv`), not from a pipe.
//
// Messages, one line: "PATH: no such file", "PATH: cannot open: <errno text>", "PATH: is a
// directory, not a regular file" (likewise "a character device", "a block device", "a FIFO or
// pipe", "a socket"), "PATH: read failed at byte N: <errno text>".
// Thread safety: plain functions of the file system.
//
//   std::string bytes = readRegularFile(path);           // csv:, text:
//   runtime::UniqueFd fd = openRegularFile(path);         // cifar10:, mnist: (read in chunks)
#pragma once

#include <sys/types.h>

#include <string>

#include "runtime/unique_fd.h"

namespace cohort::runtime::data {

// What `mode` (a stat st_mode) names, for messages: "a directory", "a character device", ...
const char* fileTypeName(mode_t mode);

// Throws IoError "PATH: is <fileTypeName>, not a regular file" unless `mode` is a regular file's.
void requireRegularFile(const std::string& path, mode_t mode);

// For the DIR of mnist:DIR and cifar10:DIR: throws IoError "PATH: is a regular file, not a
// directory; HINT" when something other than a directory is at `path`. A missing path passes: the
// reader then names the file it did not find in it.
void requireDirectoryIfPresent(const std::string& path, const char* hint);

// Opens `path` read-only (blocking reads) after checking that it is a regular file.
runtime::UniqueFd openRegularFile(const std::string& path);

// The whole of the regular file `path`.
std::string readRegularFile(const std::string& path);

}  // namespace cohort::runtime::data
