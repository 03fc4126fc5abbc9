#include "runtime/data/dataset.h"

#include <charconv>
#include <system_error>
#include <utility>

#include "runtime/data/cifar10.h"
#include "runtime/data/csv.h"
#include "runtime/data/mnist.h"
#include "runtime/data/synthetic.h"
#include "runtime/error.h"

namespace cohort::runtime::data {
namespace {

constexpr const char* kAcceptedSpecs =
    "accepted forms: 'synthetic', 'synthetic-cifar', 'synthetic-cifar:N', 'mnist:DIR', "
    "'cifar10:DIR', 'csv:FILE'";
// Bounds N in synthetic-cifar:N well below where N x 3072 floats could overflow a size.
constexpr int64_t kMaxSyntheticCifarSize = int64_t{1} << 32;

bool startsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

Shape dropFirst(const Shape& s) {
  Shape out;
  for (int i = 1; i < s.rank(); ++i) out.push(s[i]);
  return out;
}

// The part after "kind:", refused when empty.
std::string specArgument(const std::string& spec, const std::string& prefix) {
  std::string arg = spec.substr(prefix.size());
  if (arg.empty()) {
    COHORT_THROW(InvalidArgument) << "dataset spec '" << spec << "' needs a path after '" << prefix
                                  << "'; " << kAcceptedSpecs;
  }
  return arg;
}

// N of "synthetic-cifar:N": a decimal integer in [1, kMaxSyntheticCifarSize].
int64_t syntheticCifarSize(const std::string& spec, const std::string& prefix) {
  std::string arg = spec.substr(prefix.size());
  int64_t n = 0;
  const char* end = arg.data() + arg.size();
  auto [ptr, ec] = std::from_chars(arg.data(), end, n);
  if (arg.empty() || ec != std::errc() || ptr != end || n < 1 || n > kMaxSyntheticCifarSize) {
    COHORT_THROW(InvalidArgument) << "dataset spec '" << spec << "': the sample count after '"
                                  << prefix << "' must be an integer in [1, "
                                  << kMaxSyntheticCifarSize << "]; " << kAcceptedSpecs;
  }
  return n;
}

}  // namespace

Dataset::Dataset(DatasetContents contents) : contents_(std::move(contents)) {
  const Tensor& x = contents_.inputs;
  const Tensor& y = contents_.targets;
  COHORT_CHECK(x.rank() >= 1 && y.rank() >= 1)
      << contents_.name << ": inputs " << x.shape().str() << ", targets " << y.shape().str();
  COHORT_CHECK(x.dim(0) == y.dim(0))
      << contents_.name << ": inputs " << x.shape().str() << " vs targets " << y.shape().str();
  COHORT_CHECK(x.device().isCpu() && y.device().isCpu()) << contents_.name << ": not on the CPU";
  COHORT_CHECK(contents_.numClasses >= 0) << contents_.numClasses;
}

Shape Dataset::sampleShape() const { return dropFirst(contents_.inputs.shape()); }

Shape Dataset::targetShape() const { return dropFirst(contents_.targets.shape()); }

std::unique_ptr<Dataset> openDataset(const std::string& spec, Split split) {
  if (spec == "synthetic") return syntheticMnist(split);
  if (spec == "synthetic-cifar") return syntheticCifar(kSyntheticCifarTrainSize, split);
  if (startsWith(spec, "synthetic-cifar:")) {
    return syntheticCifar(syntheticCifarSize(spec, "synthetic-cifar:"), split);
  }
  if (startsWith(spec, "cifar10:")) return readCifar10(specArgument(spec, "cifar10:"), split);
  if (startsWith(spec, "mnist:")) return readMnist(specArgument(spec, "mnist:"), split);
  if (startsWith(spec, "csv:")) {
    std::string path = specArgument(spec, "csv:");
    if (split == Split::kTest) {
      COHORT_THROW(InvalidArgument) << "dataset '" << spec
                                    << "' has no separate test split; pass the test set explicitly "
                                       "with --test-data csv:FILE";
    }
    return readCsv(path);
  }
  COHORT_THROW(InvalidArgument) << "unknown dataset spec '" << spec << "'; " << kAcceptedSpecs;
}

}  // namespace cohort::runtime::data
