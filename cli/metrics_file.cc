#include "cli/metrics_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace cohort::cli {

namespace {

using Json = nlohmann::json;

// Python's json module writes non-finite floats as bare NaN, Infinity and -Infinity, which are not
// JSON. Replaces those tokens outside strings with null; returns false when there were none.
bool nullForNonFiniteLiterals(std::string& line) {
  static const char* const kTokens[] = {"-Infinity", "Infinity", "NaN"};
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
    if (c == '"') inString = true;
    const char* match = nullptr;
    for (const char* token : kTokens) {
      if (line.compare(i, std::strlen(token), token) == 0) {
        match = token;
        break;
      }
    }
    if (match) {
      out += "null";
      i += std::strlen(match);
      replaced = true;
    } else {
      out += c;
      ++i;
    }
  }
  if (replaced) line = out;
  return replaced;
}

// What a value is, for messages; long values are cut short.
std::string describeValue(const Json& v) {
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

Json parseLine(const std::string& text, const Place& at) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& first) {
    std::string lenient = text;
    if (nullForNonFiniteLiterals(lenient)) {
      try {
        return Json::parse(lenient);
      } catch (const Json::parse_error&) {
      }
    }
    // nlohmann's own message quotes the offending token, which may be a whole binary file.
    COHORT_THROW(InvalidArgument) << at << ": not JSON (syntax error at column " << first.byte
                                  << "); a metrics file holds one JSON object per line";
  }
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
  if (S_ISDIR(st.st_mode)) COHORT_THROW(IoError) << path << ": cannot read metrics: it is a directory";
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
    // Only epoch lines carry the run's throughput so far (train/trainer.cc).
    (object.contains("run_samples_per_s") ? file.epochs : file.steps).push_back(m);
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
