#include "train/observe/metrics_sink.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/data/regular_file.h"  // requireRegularFile
#include "runtime/error.h"
#include "runtime/user_name.h"
#include "train/observe/tensorboard_writer.h"

namespace cohort::train {

namespace {

[[noreturn]] void refuseOwner(const std::string& path, const std::string& what, uid_t owner) {
  COHORT_THROW(IoError) << path << ": " << what << " owned by " << runtime::describeUser(owner)
                        << ", not you: refusing to append metrics to it; give --metrics a file of yours";
}

// Opens the metrics file for appending (see the header): created with the umask's mode when absent.
runtime::UniqueFd openMetricsFile(const std::string& path) {
  std::string target = path;
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    if (link.st_uid != ::geteuid()) refuseOwner(path, "is a symbolic link", link.st_uid);
    std::unique_ptr<char, decltype(&std::free)> real(::realpath(path.c_str(), nullptr), &std::free);
    if (!real) COHORT_THROW(IoError) << path << ": cannot follow the symbolic link: " << std::strerror(errno);
    target = real.get();
  }
  runtime::UniqueFd fd(::open(target.c_str(), O_RDWR | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666));
  struct stat st {};
  if (!fd) {
    const int err = errno;
    if (::lstat(target.c_str(), &st) == 0) runtime::data::requireRegularFile(path, st.st_mode);
    COHORT_THROW(IoError) << path << ": cannot open metrics: " << std::strerror(err);
  }
  if (::fstat(fd.get(), &st) != 0) COHORT_THROW(IoError) << path << ": cannot stat: " << std::strerror(errno);
  runtime::data::requireRegularFile(path, st.st_mode);
  if (st.st_uid != ::geteuid()) {
    refuseOwner(path, target == path ? "is" : "is a symbolic link to " + target + ", which is", st.st_uid);
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    COHORT_THROW(IoError) << path << ": cannot set blocking writes: " << std::strerror(errno);
  }
  return fd;
}

// Cuts a torn last line (bytes after the last newline) off the file; returns where, if it did.
std::optional<uint64_t> cutTornLine(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size == 0) return std::nullopt;
  uint64_t end = static_cast<uint64_t>(st.st_size);
  char chunk[4096];
  for (uint64_t pos = end; pos > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(pos, sizeof chunk));
    pos -= n;
    runtime::readFullyAt(fd, chunk, n, pos, path);
    for (size_t i = n; i > 0; --i) {
      if (chunk[i - 1] != '\n') continue;
      const uint64_t whole = pos + i;
      if (whole == end) return std::nullopt;
      if (::ftruncate(fd, static_cast<off_t>(whole)) != 0) {
        COHORT_THROW(IoError) << path << ": cannot cut its torn last line: " << std::strerror(errno);
      }
      return whole;
    }
  }
  if (::ftruncate(fd, 0) != 0) COHORT_THROW(IoError) << path << ": cannot cut its torn line: " << std::strerror(errno);
  return 0;
}

}  // namespace

void MetricsSink::append(const std::string& line) {
  if (!file_ || !failure_.empty()) return;
  struct stat st {};
  const off_t start = ::fstat(file_.get(), &st) == 0 ? st.st_size : -1;
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(file_.get(), line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failure_ = metricsPath_ + ": cannot append metrics: " + std::strerror(n == 0 ? EIO : errno);
      if (start >= 0) (void)!::ftruncate(file_.get(), start);  // no half line stays behind
      return;
    }
    done += static_cast<size_t>(n);
  }
}

// One line to the metrics file and as TensorBoard scalars at its step.
void MetricsSink::publish(const nlohmann::json& j, LineKind kind) {
  append(j.dump() + "\n");
  if (tensorboard_) {
    const int64_t step = j.at("step").get<int64_t>();
    for (const auto& [key, value] : j.items()) {
      if (key != "epoch" && key != "step" && value.is_number()) {
        tensorboard_->scalar(tensorboardTag(key, kind), step, value.get<double>());
      }
    }
    tensorboard_->flush();
  }
}

std::string tensorboardTag(const std::string& key, LineKind kind) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"train_loss", "train/loss"}, {"train_acc", "train/accuracy"}, {"test_loss", "test/loss"}, {"test_acc", "test/accuracy"}};
  if (kind == LineKind::kSteps) return "steps/" + key;
  if (kind == LineKind::kEval)
    return key == "test_loss" ? "eval/loss" : key == "test_acc" ? "eval/accuracy" : "eval/" + key;
  for (const auto& [name, tag] : kNames) {
    if (key == name) return tag;
  }
  for (const auto& [name, value] : metricsOf(StepTimes{})) {
    if (key == name) return "time/" + key;
  }
  return key;
}

MetricsSink::MetricsSink(std::string metricsPath, const std::string& tensorboardDir)
    : metricsPath_(std::move(metricsPath)) {
  if (!metricsPath_.empty()) {
    file_ = openMetricsFile(metricsPath_);
    tornLineCutAt_ = cutTornLine(file_.get(), metricsPath_);
  }
  if (!tensorboardDir.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboardDir);
}

MetricsSink::~MetricsSink() = default;

void MetricsSink::epoch(const EpochReport& r, bool classification) {
  nlohmann::json j = {{"epoch", r.epoch},
                      {"step", r.step},
                      {"train_loss", r.trainLoss},
                      {"samples_per_s", r.epochSamplesPerSec},
                      {"run_samples_per_s", r.samplesPerSec},
                      {"lr", r.lr},
                      {"grad_norm", r.gradNorm},
                      {"grad_norm_max", r.gradNormMax},
                      {"skipped_steps", r.skippedSteps},
                      {"skipped_spikes", r.skippedSpikes}};
  if (classification) j["train_acc"] = r.trainAcc;
  if (r.haveTest) j["test_loss"] = r.testLoss;
  if (r.haveTest && classification) j["test_acc"] = r.testAcc;
  for (const auto& [name, value] : r.metrics) j[name] = value;
  if (r.times) {
    for (const auto& [name, value] : metricsOf(*r.times)) j[name] = value;
  }
  publish(j, LineKind::kEpoch);
}

void MetricsSink::steps(const StepFigures& f) {
  nlohmann::json j = {{"epoch", f.epoch}, {"step", f.step}, {"lr", f.lr}, {"samples_per_s", f.samplesPerSec}};
  if (f.gradNorm) j["grad_norm"] = *f.gradNorm;
  if (f.trainLoss) j["train_loss"] = *f.trainLoss;
  j["ms_per_step"] = f.msPerStep;
  if (f.tokensPerSec) j["tokens_per_s"] = *f.tokensPerSec;
  if (f.mfu) j["mfu"] = *f.mfu;
  publish(j, LineKind::kSteps);
}

void MetricsSink::eval(const EvalFigures& f) {
  nlohmann::json j = {{"type", "eval"}, {"epoch", f.epoch}, {"step", f.step}, {"test_loss", f.testLoss}};
  if (f.testAcc) j["test_acc"] = *f.testAcc;
  j["test_samples"] = f.samples;
  publish(j, LineKind::kEval);
}

}  // namespace cohort::train
