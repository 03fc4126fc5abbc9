// blobs: a program of Cohort's user with a loop of its own, built by Bazel in another workspace
// against @cohort//cohort (BUILD says how to build and run it). Four Gaussian clusters in 8
// dimensions, one class each; an MLP with dropout learns them. Every rank trains on its shard
// (allreduce by default: gradients averaged every step), then the ranks evaluate their shards of
// the test set and add up the counts with a collective. Prints `RESULT consumer=bazel ...` on
// rank 0 and exits 1 below a test accuracy of 0.95.
#include <cstdio>
#include <memory>
#include <vector>

#include "cohort/cohort.h"  // the public API: train::Job, nn, data

namespace {

using namespace cohort;
constexpr int kFeatures = 8, kClasses = 4;

std::unique_ptr<runtime::data::Dataset> blobs(int n, uint64_t seed) {
  std::vector<float> points, labels;
  runtime::Rng centres(17), rng(seed);  // the same centres for the train and the test set
  std::vector<float> centre(kClasses * kFeatures);
  for (float& c : centre) c = centres.uniform(-3.0f, 3.0f);
  for (int i = 0; i < n; ++i) {
    const int label = static_cast<int>(rng.below(kClasses));
    for (int f = 0; f < kFeatures; ++f)
      points.push_back(centre[label * kFeatures + f] + static_cast<float>(rng.normal()));
    labels.push_back(static_cast<float>(label));
  }
  return runtime::data::datasetFromArrays({.name = "blobs",
                                           .inputs = points,
                                           .sampleShape = runtime::Shape{kFeatures},
                                           .targets = labels,
                                           .numClasses = kClasses});
}

int run(const std::string& mode) {
  train::Job job({.mode = train::parseMode(mode)});
  auto trainSet = blobs(4000, 1), testSet = blobs(1000, 2);
  auto net = std::make_unique<nn::Sequential>();
  net->add(std::make_unique<nn::Linear>(kFeatures, 64), "fc0").add(nn::relu()).add(std::make_unique<nn::Dropout>(0.1f));
  net->add(std::make_unique<nn::Linear>(64, kClasses), "fc1");
  nn::Model model(std::move(net), {.name = "blobs-mlp", .sampleShape = runtime::Shape{kFeatures}, .outputs = kClasses});
  auto optimizer = nn::makeOptimizer({.lr = 0.05f, .momentum = 0.9f}, model.params.numel(), job.gpu());
  job.place(model, *optimizer, {.seed = 3});

  nn::SoftmaxCrossEntropy loss;
  runtime::Rng dropout(job.world().rank);  // this rank's dropout masks
  runtime::data::DataLoader loader(*trainSet, job.dataSplit({.batchSize = 32, .seed = 4}));
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    loader.startEpoch(epoch);
    for (runtime::data::Batch b; loader.next(b);) {
      nn::Pass pass = job.pass({.rng = &dropout});
      loss.forward(model.forward(b.inputs, pass), b.targets);
      model.backward(loss.backward(), pass);
      job.step();  // all ranks: gradients averaged, then the optimizer
    }
  }
  // Each rank evaluates its shard of the test set; the job adds up the counts.
  runtime::data::DataLoader test(*testSet, job.dataSplit({.batchSize = 250, .shuffle = false}));
  test.startEpoch(0);
  double counts[2] = {0, 0};  // correct, samples
  for (runtime::data::Batch b; test.next(b);) {
    loss.forward(model.forward(b.inputs, job.evalPass()), b.targets);
    counts[0] += static_cast<double>(loss.correct());
    counts[1] += static_cast<double>(b.size);
  }
  job.reduce(counts, train::Reduce::kSum);
  const double accuracy = counts[0] / counts[1];
  if (job.world().rank != 0) return 0;
  std::printf("RESULT consumer=bazel mode=%s world_size=%d rank0 test_acc=%.4f cohort=%s\n", mode.c_str(),
              job.world().worldSize, accuracy, version());
  if (accuracy >= 0.95) return 0;
  std::fprintf(stderr, "blobs: test accuracy %.4f is below 0.95\n", accuracy);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "allreduce";
  return cohort::runMain("blobs: ", [&] { return run(mode); });
}
