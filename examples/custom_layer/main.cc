// custom_layer: a user-defined layer (LearnedSwish) inside a residual network, trained by Cohort's
// Trainer on arrays the program makes itself, in any mode:
//
//   bazel build //examples/custom_layer //launcher:cohortrun
//   cohortrun --nproc-per-node 2 -- bazel-bin/examples/custom_layer/custom_layer --mode hogwild
//   cohortrun --nproc-per-node 2 -- bazel-bin/examples/custom_layer/custom_layer --mode allreduce
//
// The task: three interleaved spiral arms in the plane (2 features, 3 classes), which a linear
// model cannot separate (one and a half turns each). The network: fc 2→32, two residual blocks x + fc(swish(x)), swish, fc
// 32→3. It reaches a test accuracy of at least 0.9 in every mode within 30 epochs (the program
// exits with 1 otherwise), and prints one RESULT line on rank 0.
#include <CLI/CLI.hpp>  // flags

#include <cmath>
#include <cstdio>
#include <vector>

#include "cohort/cohort.h"                       // the public API: train::Job, train::Trainer, nn, data
#include "examples/custom_layer/learned_swish.h"  // the user's own layer

namespace {

using namespace cohort;
using runtime::Shape;

// `n` points of the spirals, labels 0..2, as flat arrays (the user's own data).
struct Arrays {
  std::vector<float> points, labels;
};
Arrays spirals(int n, uint64_t seed) {
  Arrays a;
  runtime::Rng rng(seed);
  for (int i = 0; i < n; ++i) {
    const int arm = i % 3;
    const float t = rng.uniform(0.05f, 1.0f);  // how far along the arm
    const float angle = 9.0f * t + 2.0943951f * static_cast<float>(arm) + rng.uniform(-0.15f, 0.15f);
    a.points.push_back(t * std::cos(angle));
    a.points.push_back(t * std::sin(angle));
    a.labels.push_back(static_cast<float>(arm));
  }
  return a;
}

std::unique_ptr<nn::Model> residualNet() {
  auto net = std::make_unique<nn::Sequential>();
  net->add(std::make_unique<nn::Linear>(2, 32), "fc_in");
  for (int b = 0; b < 2; ++b) {
    auto block = std::make_unique<nn::Sequential>();
    block->add(std::make_unique<example::LearnedSwish>(32), "swish").add(std::make_unique<nn::Linear>(32, 32), "fc");
    net->add(std::make_unique<nn::Residual>(std::move(block)), "res" + std::to_string(b));
  }
  net->add(std::make_unique<example::LearnedSwish>(32), "swish").add(std::make_unique<nn::Linear>(32, 3), "fc_out");
  return std::make_unique<nn::Model>(std::move(net), nn::ModelInfo{.name = "spiral-resnet", .sampleShape = Shape{2}, .outputs = 3});
}

int run(int argc, char** argv) {
  std::string mode = "local";
  int64_t epochs = 30;
  CLI::App app{"custom_layer: a user-defined layer in a residual network, trained in any mode"};
  app.add_option("--mode", mode, "local | hogwild | allreduce")->capture_default_str();
  app.add_option("--epochs", epochs, "epochs")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  train::Job job({.mode = train::parseMode(mode)});
  const Arrays trainArrays = spirals(3000, 1), testArrays = spirals(600, 2);
  auto trainSet = runtime::data::datasetFromArrays({.name = "spirals", .inputs = trainArrays.points,
                                                    .sampleShape = Shape{2}, .targets = trainArrays.labels, .numClasses = 3});
  auto testSet = runtime::data::datasetFromArrays({.name = "spirals/test", .inputs = testArrays.points,
                                                   .sampleShape = Shape{2}, .targets = testArrays.labels, .numClasses = 3});
  auto model = residualNet();
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdam, .lr = 3e-3f}, model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 7});
  nn::SoftmaxCrossEntropy loss;

  // A callback adds the user's own figure to every epoch's log line and metrics, and stops early
  // once the job's training accuracy is high enough (all ranks stop at the same epoch).
  train::TrainerCallbacks callbacks;
  callbacks.onEpochEnd = [](train::EpochReport& e) {
    e.metrics.push_back({"train_error", 1.0 - e.trainAcc});
    return e.trainAcc > 0.985 ? train::Next::kStop : train::Next::kContinue;
  };
  train::Trainer trainer(job, loss, *trainSet, testSet.get(), {.epochs = epochs, .batchSize = 32, .seed = 3},
                         std::move(callbacks));
  train::TrainResult r = trainer.run();
  if (job.world().rank != 0) return 0;
  std::printf("RESULT example=custom_layer mode=%s world_size=%d epochs=%lld test_acc=%.4f\n", mode.c_str(),
              job.world().worldSize, static_cast<long long>(r.epochs), r.testAcc);
  if (r.testAcc < 0.9) {
    std::fprintf(stderr, "custom_layer: test accuracy %.4f is below 0.9\n", r.testAcc);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cohort::runMain("custom_layer: ", [&] { return run(argc, argv); });
}
