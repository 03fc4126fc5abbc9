#include "nn/corpus_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "runtime/data/regular_file.h"
#include "runtime/error.h"
#include "runtime/printable.h"

namespace cohort::nn {
namespace {

constexpr size_t kReadBytes = size_t{1} << 20;

bool endsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool isCutSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Unicode's White_Space characters past ASCII, and a few that some engines count as spaces
// (U+180E, U+200B, U+FEFF): a cut is never made after any of them.
bool isWideSpace(uint32_t cp) {
  return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || cp == 0x180e || (cp >= 0x2000 && cp <= 0x200b) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000 || cp == 0xfeff;
}

// Whether the character that ends at text[end - 1] is one a piece of GPT-2's pattern cannot hold
// together with a whitespace after it: printable ASCII, or a well-formed UTF-8 character that is not
// a space. (A malformed byte or a C1 control: no.)
bool endsInNonSpace(std::string_view text, size_t end) {
  const auto last = static_cast<unsigned char>(text[end - 1]);
  if (last < 0x80) return last > 0x20 && last < 0x7f;
  for (size_t length = 2; length <= 4 && length <= end; ++length) {
    const size_t start = end - length;
    if (runtime::printable_detail::utf8SequenceLength(text, start) != length) continue;
    const auto lead = static_cast<unsigned char>(text[start]);
    uint32_t cp = lead & (0xff >> (length + 1));
    for (size_t k = 1; k < length; ++k) cp = cp << 6 | (static_cast<unsigned char>(text[start + k]) & 0x3f);
    return !isWideSpace(cp);
  }
  return false;
}

bool isCut(std::string_view text, size_t p) { return isCutSpace(text[p]) && endsInNonSpace(text, p); }

// A place in text(from, size) where a document may be cut (see the header): the last at or before
// `target`, else the first after it; 0 when there is none.
size_t findCut(std::string_view text, size_t from, size_t target) {
  target = std::min(target, text.size() - 1);
  for (size_t p = target; p > from; --p) {
    if (isCut(text, p)) return p;
  }
  for (size_t p = target + 1; p < text.size(); ++p) {
    if (isCut(text, p)) return p;
  }
  return 0;
}

bool isBlank(std::string_view line) {
  for (char c : line) {
    if (!isCutSpace(c)) return false;
  }
  return true;
}

}  // namespace

const char* documentFormName(DocumentForm form) {
  switch (form) {
    case DocumentForm::kAuto:
      return "auto";
    case DocumentForm::kFile:
      return "file";
    case DocumentForm::kLine:
      return "lines";
    case DocumentForm::kJsonLine:
      return "jsonl";
  }
  return "?";
}

CorpusReader::CorpusReader(CorpusReaderOptions options) : options_(std::move(options)) {
  COHORT_CHECK(options_.batchBytes > 0 && options_.maxLineBytes > 0);
  for (const std::string& path : options_.paths) {
    const runtime::UniqueFd fd = runtime::data::openRegularFile(path);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) COHORT_THROW(IoError) << path << ": cannot read its size: " << std::strerror(errno);
    totalBytes_ += static_cast<int64_t>(st.st_size);
    DocumentForm form = options_.form;
    if (form == DocumentForm::kAuto) form = endsWith(path, ".jsonl") ? DocumentForm::kJsonLine : DocumentForm::kFile;
    forms_.push_back(form);
  }
}

bool CorpusReader::next(CorpusBatch& batch) {
  batch.bytes.clear();
  batch.segments.clear();
  while (batch.bytes.size() < options_.batchBytes) {
    if (!open_ && !openNextFile()) break;
    if (takeSegment(batch)) continue;
    if (eof_) {  // the file's last segment was taken
      fileStart_ += bufferStart_ + static_cast<int64_t>(buffer_.size());
      fd_ = runtime::UniqueFd();
      open_ = false;
      ++file_;
    } else {
      refill();
    }
  }
  batch.inputEnd = fileStart_ + (open_ ? bufferStart_ + static_cast<int64_t>(begin_) : 0);
  return !batch.segments.empty();
}

bool CorpusReader::openNextFile() {
  if (file_ >= options_.paths.size()) return false;
  fd_ = runtime::data::openRegularFile(options_.paths[file_]);
  (void)::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  open_ = true;
  eof_ = false;
  buffer_.clear();
  begin_ = scanned_ = 0;
  bufferStart_ = 0;
  line_ = 1;
  inDocument_ = false;
  return true;
}

bool CorpusReader::refill() {
  if (begin_ > 0 && begin_ >= buffer_.size() / 2) {  // drop what was handed on
    buffer_.erase(0, begin_);
    bufferStart_ += static_cast<int64_t>(begin_);
    scanned_ -= begin_;
    begin_ = 0;
  }
  const size_t had = buffer_.size();
  buffer_.resize(had + kReadBytes);
  ssize_t n = 0;
  do {
    n = ::read(fd_.get(), buffer_.data() + had, kReadBytes);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    const int error = errno;
    buffer_.resize(had);
    COHORT_THROW(IoError) << options_.paths[file_] << ": read failed at byte " << bufferStart_ + static_cast<int64_t>(had)
                          << ": " << std::strerror(error);
  }
  buffer_.resize(had + static_cast<size_t>(n));
  eof_ = n == 0;
  return !eof_;
}

bool CorpusReader::takeSegment(CorpusBatch& batch) {
  switch (forms_[file_]) {
    case DocumentForm::kLine:
      return takeLine(batch, false);
    case DocumentForm::kJsonLine:
      return takeLine(batch, true);
    default:
      return takeFilePiece(batch);
  }
}

// kFile: the rest of the file at its end (the whole document when it was short), else a piece up
// to the last cut once a batch's worth is buffered.
bool CorpusReader::takeFilePiece(CorpusBatch& batch) {
  if (eof_) {
    if (begin_ < buffer_.size() || !inDocument_) emit(batch, begin_, buffer_.size(), false);
    begin_ = buffer_.size();
    inDocument_ = true;  // nothing more of this file
    return false;
  }
  if (buffer_.size() - begin_ < options_.batchBytes) return false;
  const size_t cut = findCut(buffer_, begin_, begin_ + options_.batchBytes);
  if (cut == 0) return false;  // no place to cut yet: read on
  emit(batch, begin_, cut, false);
  begin_ = cut;
  inDocument_ = true;
  return true;
}

// kLine and kJsonLine: the next whole line; kLine also a piece of a long line.
bool CorpusReader::takeLine(CorpusBatch& batch, bool json) {
  const size_t newline = buffer_.find('\n', scanned_);
  const bool whole = newline != std::string::npos || (eof_ && begin_ < buffer_.size());
  if (whole) {
    const size_t end = newline != std::string::npos ? newline : buffer_.size();
    const std::string_view line(buffer_.data() + begin_, end - begin_);
    if (json ? !isBlank(line) : (!line.empty() || inDocument_)) emit(batch, begin_, end, json);
    begin_ = scanned_ = std::min(end + 1, buffer_.size());
    ++line_;
    inDocument_ = false;
    return true;
  }
  scanned_ = buffer_.size();
  if (eof_) return false;
  const size_t held = buffer_.size() - begin_;
  if (json && held > options_.maxLineBytes) {
    COHORT_THROW(InvalidArgument) << options_.paths[file_] << ":" << line_ << ": a JSON line longer than "
                                  << options_.maxLineBytes << " bytes";
  }
  if (json || held < options_.batchBytes) return false;
  const size_t cut = findCut(buffer_, begin_, begin_ + options_.batchBytes);
  if (cut == 0) return false;
  emit(batch, begin_, cut, false);
  begin_ = cut;
  inDocument_ = true;
  return true;
}

void CorpusReader::emit(CorpusBatch& batch, size_t begin, size_t end, bool json) {
  batch.segments.push_back({.offset = batch.bytes.size(),
                            .size = end - begin,
                            .startsDocument = !inDocument_,
                            .json = json,
                            .file = file_,
                            .line = forms_[file_] == DocumentForm::kFile ? 0 : line_,
                            .inputOffset = fileStart_ + bufferStart_ + static_cast<int64_t>(begin)});
  batch.bytes.append(buffer_, begin, end - begin);
}

}  // namespace cohort::nn
