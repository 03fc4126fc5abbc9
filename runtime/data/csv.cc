#include "runtime/data/csv.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>
#include <vector>

#include "runtime/data/regular_file.h"
#include "runtime/error.h"
#include "runtime/printable.h"

namespace cohort::runtime::data {
namespace {

constexpr float kMaxClassTarget = 16777216.0f;  // 2^24: beyond it floats skip integers

std::string_view trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return s.substr(b, e - b);
}

// Strict: the whole field is one finite float (a leading '+' is allowed, as strtof would).
bool parseNumber(std::string_view field, float& out) {
  if (!field.empty() && field[0] == '+') field.remove_prefix(1);
  if (field.empty()) return false;
  const char* end = field.data() + field.size();
  auto [ptr, ec] = std::from_chars(field.data(), end, out);
  return ec == std::errc() && ptr == end && std::isfinite(out);
}

void splitFields(std::string_view line, std::vector<std::string_view>& fields) {
  fields.clear();
  size_t start = 0;
  while (true) {
    size_t comma = line.find(',', start);
    fields.push_back(
        trim(line.substr(start, comma == std::string_view::npos ? comma : comma - start)));
    if (comma == std::string_view::npos) return;
    start = comma + 1;
  }
}

// The text split into lines (without '\n'); trailing blank lines dropped.
std::vector<std::string_view> splitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  while (!lines.empty() && trim(lines.back()).empty()) lines.pop_back();
  return lines;
}

bool isHeader(const std::vector<std::string_view>& fields) {
  float unused;
  for (std::string_view f : fields) {
    if (!parseNumber(f, unused)) return true;
  }
  return false;
}

struct Table {
  std::vector<float> values;  // rows x columns, row-major
  int64_t columns = 0;
  int64_t rows = 0;
};

Table parseTable(const std::string& text, const std::string& name) {
  std::vector<std::string_view> lines = splitLines(text);
  if (lines.empty()) COHORT_THROW(IoError) << name << ":1: empty file (expected numeric rows)";
  std::vector<std::string_view> fields;
  Table t;
  splitFields(lines[0], fields);
  t.columns = static_cast<int64_t>(fields.size());
  if (t.columns < 2) {
    COHORT_THROW(IoError) << name
                          << ":1: expected at least 2 columns (features, then the target), got "
                          << t.columns;
  }
  size_t first = isHeader(fields) ? 1 : 0;
  if (first == lines.size()) COHORT_THROW(IoError) << name << ":1: a header but no data rows";
  t.values.reserve((lines.size() - first) * static_cast<size_t>(t.columns));
  for (size_t l = first; l < lines.size(); ++l) {
    size_t lineNo = l + 1;
    if (trim(lines[l]).empty()) {
      COHORT_THROW(IoError) << name << ":" << lineNo << ": blank line before the end of the file";
    }
    splitFields(lines[l], fields);
    if (static_cast<int64_t>(fields.size()) != t.columns) {
      COHORT_THROW(IoError) << name << ":" << lineNo << ": expected " << t.columns
                            << " columns, got " << fields.size();
    }
    for (size_t k = 0; k < fields.size(); ++k) {
      float v;
      if (!parseNumber(fields[k], v)) {
        COHORT_THROW(IoError) << name << ":" << lineNo << ": column " << k + 1 << ": '"
                              << printable(fields[k]) << "' is not a number";
      }
      t.values.push_back(v);
    }
    ++t.rows;
  }
  return t;
}

// max + 1 when every target is a non-negative integer below 2^24, else 0.
int64_t classCount(const Table& t) {
  float maxTarget = 0;
  for (int64_t r = 0; r < t.rows; ++r) {
    float v = t.values[static_cast<size_t>((r + 1) * t.columns - 1)];
    if (!(v >= 0 && v < kMaxClassTarget && std::floor(v) == v)) return 0;
    maxTarget = std::max(maxTarget, v);
  }
  return static_cast<int64_t>(maxTarget) + 1;
}

}  // namespace

std::unique_ptr<Dataset> parseCsv(const std::string& text, const std::string& name) {
  Table t = parseTable(text, name);
  int64_t features = t.columns - 1;
  DatasetContents c;
  c.name = "csv:" + name;
  c.numClasses = classCount(t);
  c.inputs = Tensor::empty(Shape{t.rows, features}, cpuAllocator());
  c.targets = c.numClasses > 0 ? Tensor::empty(Shape{t.rows}, cpuAllocator())
                               : Tensor::empty(Shape{t.rows, 1}, cpuAllocator());
  for (int64_t r = 0; r < t.rows; ++r) {
    const float* row = t.values.data() + r * t.columns;
    std::memcpy(c.inputs.data() + r * features, row, static_cast<size_t>(features) * sizeof(float));
    c.targets.at(r) = row[features];
  }
  return std::make_unique<Dataset>(std::move(c));
}

std::unique_ptr<Dataset> readCsv(const std::string& path) { return parseCsv(readRegularFile(path), path); }

}  // namespace cohort::runtime::data
