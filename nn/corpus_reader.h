// CorpusReader: the documents of text files, read in batches of about a megabyte for
// `cohort tokenize` (nn/corpus_tokenizer.h), never a whole file at once.
//
// A document is (DocumentForm):
//   kFile      a whole file (an empty file is an empty document);
//   kLine      a line, without its '\n' (empty lines are no documents);
//   kJsonLine  the "text" string of a JSON line (lines of spaces only are skipped); the reader hands
//              the line on as it is (CorpusSegment::json), the tokenizer's threads parse it;
//   kAuto      kJsonLine for a file whose name ends in ".jsonl", else kFile.
//
// A document longer than a batch is handed on in pieces (segments), each encoded on its own. The
// pieces are cut only where GPT-2's pattern (nn/gpt2_pattern.h) cannot join across: before an ASCII
// whitespace byte (' ', '\t', '\n', '\r') that follows a character that is not whitespace. No piece of
// the pattern holds both a non-whitespace character and a whitespace after it, and the pattern has
// no lookbehind, so the pieces of the whole are the pieces of its parts, and so are its tokens
// (tests/nn/corpus_reader_test and tests/cli/cli_tokenize_test compare with the whole's encoding).
// A piece ends at the last such place within batchBytes, else at the first after it. Memory is
// therefore bounded by the batch size, except for a stretch of text without such a place (no space
// or line break after a visible character), which is held whole; and a JSON line, held whole up to
// maxLineBytes.
//
// Errors: IoError naming the file (cannot open, read failed: runtime/data/regular_file.h's rules;
// a FIFO or device is refused); InvalidArgument "FILE:LINE: a JSON line longer than N bytes".
// Ownership: owns the open file and the bytes of the current batch. Thread safety: one thread.
//
//   CorpusReader reader({.paths = {"a.jsonl"}});
//   CorpusBatch batch;
//   while (reader.next(batch)) encode(batch);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/unique_fd.h"

namespace cohort::nn {

enum class DocumentForm { kAuto, kFile, kLine, kJsonLine };

// "auto", "file", "lines", "jsonl".
const char* documentFormName(DocumentForm form);

struct CorpusSegment {
  size_t offset = 0;            // its bytes: batch.bytes[offset, offset + size)
  size_t size = 0;
  bool startsDocument = false;  // the first piece of a document
  bool json = false;            // the bytes are a JSON line; the document is its "text"
  size_t file = 0;              // index into the reader's paths, for messages
  int64_t line = 0;             // its line (from 1) in kLine and kJsonLine; 0 in kFile
  int64_t inputOffset = 0;      // its first byte's place in the input (all files one after another)
};

struct CorpusBatch {
  std::string bytes;
  std::vector<CorpusSegment> segments;
  int64_t inputEnd = 0;  // the input bytes read up to the end of this batch
};

struct CorpusReaderOptions {
  std::vector<std::string> paths;
  DocumentForm form = DocumentForm::kAuto;
  size_t batchBytes = size_t{1} << 20;     // a batch ends once it holds this many bytes
  size_t maxLineBytes = size_t{1} << 30;   // the longest JSON line
};

class CorpusReader {
 public:
  // Checks that every path is a regular file and sums their sizes (IoError naming one that is not).
  explicit CorpusReader(CorpusReaderOptions options);
  CorpusReader(const CorpusReader&) = delete;
  CorpusReader& operator=(const CorpusReader&) = delete;

  const std::vector<std::string>& paths() const { return options_.paths; }
  int64_t totalBytes() const { return totalBytes_; }  // the files' sizes when opened

  // The next batch into `batch` (replacing what it held); false when the input is done.
  bool next(CorpusBatch& batch);

 private:
  bool openNextFile();
  bool refill();                      // reads more of the file; false at its end
  bool takeSegment(CorpusBatch& batch);  // one segment (or skipped line) from buffer_; false: needs more bytes
  bool takeFilePiece(CorpusBatch& batch);
  bool takeLine(CorpusBatch& batch, bool json);
  void emit(CorpusBatch& batch, size_t begin, size_t end, bool json);

  CorpusReaderOptions options_;
  std::vector<DocumentForm> forms_;   // each file's form (kAuto resolved)
  int64_t totalBytes_ = 0;
  size_t file_ = 0;                   // the file being read (or next to open)
  runtime::UniqueFd fd_;
  bool open_ = false, eof_ = false;
  std::string buffer_;                // bytes of the file from bufferStart_; buffer_[begin_, ...) not yet handed on
  size_t begin_ = 0, scanned_ = 0;    // scanned_: no '\n' in buffer_[begin_, scanned_)
  int64_t bufferStart_ = 0;           // file offset of buffer_[0]
  int64_t fileStart_ = 0;             // input offset of the file's first byte
  int64_t line_ = 1;                  // the line at begin_
  bool inDocument_ = false;           // a document's first piece was handed on, its rest not yet
};

}  // namespace cohort::nn
