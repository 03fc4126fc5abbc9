#include "cli/metrics_file.h"

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/data/regular_file.h"  // fileTypeName
#include "runtime/error.h"

namespace cohort::cli {

namespace {

using Json = nlohmann::json;

// At line[i], outside a string: the length of a token that stands for a non-finite value, else 0.
// Python's json module writes bare NaN, Infinity and -Infinity, which are not JSON; a number beyond a
// double's range (1e999) is JSON, but nlohmann refuses it. `span` receives how many bytes to copy
// unchanged when it is none of those: a finite number whole, so that no tail of it is read alone.
size_t nonFiniteToken(const std::string& line, size_t i, size_t& span) {
  span = 1;
  for (const char* token : {"-Infinity", "Infinity", "NaN"}) {
    if (line.compare(i, std::strlen(token), token) == 0) return std::strlen(token);
  }
  if (line[i] != '-' && !std::isdigit(static_cast<unsigned char>(line[i]))) return 0;
  const std::string number = line.substr(i, line.find_first_not_of("0123456789+-.eE", i) - i);
  if (std::isinf(std::strtod(number.c_str(), nullptr))) return number.size();
  span = number.size();  // finite, or not a number at all: the parser judges it
  return 0;
}

// Rewrites every non-finite token (above) outside strings to null, padded with spaces to the
// token's length so that the columns after it stay put; only NaN (3 bytes) grows, and `grownAt`
// receives the place in the rewritten line of each byte so added. False when nothing was rewritten.
bool nullForNonFinite(std::string& line, std::vector<size_t>& grownAt) {
  std::string out;
  bool inString = false, replaced = false;
  for (size_t i = 0; i < line.size();) {
    const char c = line[i];
    if (inString) {
      out += c;
      if (c == '\\' && i + 1 < line.size())
        out += line[++i];
      else if (c == '"')
        inString = false;
      ++i;
      continue;
    }
    inString = c == '"';
    size_t span = 1;
    const size_t length = inString ? 0 : nonFiniteToken(line, i, span);
    if (length == 0) {
      out.append(line, i, span);
      i += span;
      continue;
    }
    if (length < 4) grownAt.push_back(out.size() + length);
    out += "null";
    out.append(length > 4 ? length - 4 : 0, ' ');
    i += length;
    replaced = true;
  }
  if (replaced) line = out;
  return replaced;
}

// What a value is, for messages; long values are cut short.
std::string describeValue(const Json& v) {
  if (v.is_null()) return "null";  // not "null null"
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return std::string(v.type_name()) + " " + text;
}

// Where a line is, for messages.
struct Place {
  const std::string& path;
  int64_t line;
};
std::ostream& operator<<(std::ostream& os, const Place& p) { return os << p.path << ":" << p.line; }

// Arrays and objects nested deeper than this are refused before parsing: a metrics line is a flat
// object, and nesting 200000 deep overflowed the stack (nlohmann's values nest by recursion).
constexpr int kMaxNesting = 64;

void checkNesting(const std::string& text, const Place& at) {
  int depth = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      if (c == '\\') ++i;
      else if (c == '"') inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxNesting) {
        COHORT_THROW(InvalidArgument) << at << ": values nested more than " << kMaxNesting << " deep (at column "
                                      << i + 1 << "); a metrics file holds one flat JSON object per line";
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

Json parseLine(const std::string& text, const Place& at) {
  checkNesting(text, at);
  size_t column = 0;
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    column = e.byte;
  } catch (const Json::out_of_range&) {  // 406: a number beyond a double's range, handled below
  }
  std::string lenient = text;
  std::vector<size_t> grownAt;
  if (nullForNonFinite(lenient, grownAt)) {
    try {
      return Json::parse(lenient);
    } catch (const Json::exception& e) {
      const auto* syntax = dynamic_cast<const Json::parse_error*>(&e);
      column = syntax ? syntax->byte : 0;
      // Back to the line's own columns: each NaN before the error made the rewritten line longer.
      for (size_t grown : grownAt) column -= grown < column ? 1 : 0;
    }
  }
  // nlohmann's own message quotes the offending token, which may be a whole binary file.
  if (column == 0) COHORT_THROW(InvalidArgument) << at << ": not JSON; a metrics file holds one JSON object per line";
  COHORT_THROW(InvalidArgument) << at << ": not JSON (syntax error at column " << column
                                << "); a metrics file holds one JSON object per line";
}

// "epoch" and "step": required, finite numbers.
double position(const Json& object, const char* key, const Place& at) {
  auto it = object.find(key);
  if (it == object.end()) COHORT_THROW(InvalidArgument) << at << ": no \"" << key << "\" in the line";
  if (!it->is_number()) {
    COHORT_THROW(InvalidArgument) << at << ": \"" << key << "\" is " << describeValue(*it) << ", expected a number";
  }
  return it->get<double>();
}

// A plotted figure: absent is fine, null or non-finite is dropped (and counted), anything else
// that is not a number is an error.
double figure(const Json& object, const char* key, const Place& at, int64_t& nonFinite) {
  auto it = object.find(key);
  if (it == object.end()) return MetricsLine::kMissing;
  if (it->is_null()) {
    ++nonFinite;
    return MetricsLine::kMissing;
  }
  if (!it->is_number()) {
    COHORT_THROW(InvalidArgument) << at << ": \"" << key << "\" is " << describeValue(*it) << ", expected a number";
  }
  const double v = it->get<double>();
  if (!std::isfinite(v)) {
    ++nonFinite;
    return MetricsLine::kMissing;
  }
  return v;
}

bool plottable(const MetricsLine& m) {
  return std::isfinite(m.trainLoss) || std::isfinite(m.testLoss) || std::isfinite(m.trainAcc) ||
         std::isfinite(m.testAcc);
}

}  // namespace

MetricsFile readMetricsFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    COHORT_THROW(IoError) << path << ": cannot read metrics: " << std::strerror(errno);
  }
  // A device or pipe may never end (/dev/zero) and a FIFO blocks the open until a writer comes.
  if (!S_ISREG(st.st_mode)) {
    COHORT_THROW(IoError) << path << ": cannot read metrics: it is " << runtime::data::fileTypeName(st.st_mode)
                          << ", not a regular file";
  }
  std::ifstream in(path);
  if (!in) COHORT_THROW(IoError) << path << ": cannot read metrics: " << std::strerror(errno);

  MetricsFile file;
  file.path = path;
  std::string text;
  int64_t lines = 0, plottableLines = 0;
  for (int64_t lineNumber = 1; std::getline(in, text); ++lineNumber) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++lines;
    const Place at{path, lineNumber};
    const Json object = parseLine(text, at);
    if (!object.is_object()) {
      COHORT_THROW(InvalidArgument) << at << ": expected a JSON object, got " << describeValue(object);
    }
    MetricsLine m;
    m.epoch = position(object, "epoch", at);
    m.step = position(object, "step", at);
    m.trainLoss = figure(object, "train_loss", at, file.nonFinite);
    m.testLoss = figure(object, "test_loss", at, file.nonFinite);
    m.trainAcc = figure(object, "train_acc", at, file.nonFinite);
    m.testAcc = figure(object, "test_acc", at, file.nonFinite);
    if (!plottable(m)) continue;
    ++plottableLines;
    // Only epoch lines carry the run's throughput so far (train/trainer.cc); eval lines say so.
    const auto type = object.find("type");
    const bool eval = type != object.end() && type->is_string() && type->get<std::string>() == "eval";
    (eval ? file.evals : object.contains("run_samples_per_s") ? file.epochs : file.steps).push_back(m);
  }
  if (in.bad()) COHORT_THROW(IoError) << path << ": read failed: " << std::strerror(errno);
  if (lines == 0) COHORT_THROW(InvalidArgument) << path << ": no plottable lines: the file is empty";
  if (plottableLines == 0) {
    COHORT_THROW(InvalidArgument) << path << ": no plottable lines (none has a finite train_loss, test_loss, "
                                  << "train_acc or test_acc); is it a file of cohort train --metrics?";
  }
  return file;
}

}  // namespace cohort::cli
