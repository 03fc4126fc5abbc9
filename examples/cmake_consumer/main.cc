// rings: a program of Cohort's user, built with CMake against the installed library
// (CMakeLists.txt says how). Points in the plane belong to one of three rings around the origin
// (radius in [0, 1/3), [1/3, 2/3), [2/3, 1)), which no linear model separates; a small residual
// network learns them in any mode, synchronously averaging the workers' gradients by default:
//
//   cohortrun --nproc-per-node 2 -- ./rings [allreduce | hogwild | local]
//
// Prints `RESULT consumer=cmake ...` on rank 0 and exits 1 below a test accuracy of 0.9.
#include <cohort/cohort.h>  // the public API: train::Job, train::Trainer, nn, data

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

namespace {

using namespace cohort;

std::unique_ptr<runtime::data::Dataset> rings(int n, uint64_t seed) {
  std::vector<float> points, labels;
  runtime::Rng rng(seed);
  for (int i = 0; i < n; ++i) {
    const float radius = rng.uniform(), angle = rng.uniform(0.0f, 6.2831853f);
    points.push_back(radius * std::cos(angle));
    points.push_back(radius * std::sin(angle));
    labels.push_back(std::floor(radius * 3.0f));
  }
  return runtime::data::datasetFromArrays(
      {.name = "rings", .inputs = points, .sampleShape = runtime::Shape{2}, .targets = labels, .numClasses = 3});
}

// fc 2→32, tanh, then x + fc(tanh(fc(x))), tanh, fc 32→3.
std::unique_ptr<nn::Model> residualNet() {
  auto block = std::make_unique<nn::Sequential>();
  block->add(std::make_unique<nn::Linear>(32, 32), "fc0")
      .add(nn::tanhActivation())
      .add(std::make_unique<nn::Linear>(32, 32), "fc1");
  auto net = std::make_unique<nn::Sequential>();
  net->add(std::make_unique<nn::Linear>(2, 32), "fc_in").add(nn::tanhActivation());
  net->add(std::make_unique<nn::Residual>(std::move(block)), "res").add(nn::tanhActivation());
  net->add(std::make_unique<nn::Linear>(32, 3), "fc_out");
  return std::make_unique<nn::Model>(
      std::move(net), nn::ModelInfo{.name = "rings-resnet", .sampleShape = runtime::Shape{2}, .outputs = 3});
}

int run(const std::string& mode) {
  train::Job job({.mode = train::parseMode(mode)});
  auto trainSet = rings(4000, 1), testSet = rings(1000, 2);
  auto model = residualNet();
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdam, .lr = 3e-3f}, model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 5});
  nn::SoftmaxCrossEntropy loss;
  train::Trainer trainer(job, loss, *trainSet, testSet.get(), {.epochs = 10, .batchSize = 32, .seed = 9});
  const train::TrainResult r = trainer.run();
  if (job.world().rank != 0) return 0;
  std::printf("RESULT consumer=cmake mode=%s world_size=%d rank0 test_acc=%.4f cohort=%s\n", mode.c_str(),
              job.world().worldSize, r.testAcc, version());
  if (r.testAcc >= 0.9) return 0;
  std::fprintf(stderr, "rings: test accuracy %.4f is below 0.9\n", r.testAcc);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "allreduce";
  return cohort::runMain("rings: ", [&] { return run(mode); });
}
