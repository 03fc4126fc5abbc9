// CSV datasets: numeric rows whose last column is the target.
//
// Format: comma-separated fields, surrounding spaces and tabs ignored, CRLF tolerated. Line 1 is a
// header if any of its fields is not a number; on any other line a non-number is an error. Every
// row has the column count of line 1 (at least 2). Blank lines may only end the file. Numbers are
// parsed strictly (the whole field; NaN and infinities refused) as float32. Errors are IoError
// "FILE:LINE: ...": "expected C columns, got D", "column K: 'abc' is not a number" (K counts from
// 1; the field as runtime::printable() quotes it, since it may hold any bytes: what is not
// printable ASCII or valid UTF-8 as \xNN, cut after 64 bytes), and an empty file or a header
// without data rows. Result: inputs [N, C-1]; if every target is a non-negative integer below
// 2^24, targets are [N] class indices and numClasses() = max + 1; otherwise targets are [N, 1] and
// numClasses() = 0. The caller decides classification versus regression from the loss.
// Ownership: returns a new Dataset the caller owns. Thread safety: a pure function of the file.
#pragma once

#include <memory>
#include <string>

#include "runtime/data/dataset.h"

namespace cohort::runtime::data {

std::unique_ptr<Dataset> readCsv(const std::string& path);

// The same from text already in memory; `name` is used in messages in place of the file name.
std::unique_ptr<Dataset> parseCsv(const std::string& text, const std::string& name);

}  // namespace cohort::runtime::data
