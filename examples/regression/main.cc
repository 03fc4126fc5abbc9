// regression: the Boston-housing example of the material Cohort started from, in C++: 506 houses,
// 13 features, the median value (MEDV, in $1000s) to predict; features standardised, a small MLP
// trained with Adam on the mean squared error, the test RMSE reported.
//
//   regression --csv ~/.cache/cohort/data/boston_house_prices.csv    # scripts/setup puts it there
//   cohortrun --nproc-per-node 2 -- regression --csv ... --mode allreduce
//
// The CSV (Harrison and Rubinfeld's data, as Debian's python3-sklearn ships it; scripts/setup
// copies it without the package) is read with Cohort's CSV reader; the program then does what a
// user would: a seeded 80/20 split, z-scores from the training part, and its own arrays turned into
// datasets. It reaches a test RMSE below 4.0 (the program exits with 1 otherwise; a linear model
// gets about 4.9) and prints one RESULT line on rank 0.
#include <CLI/CLI.hpp>  // flags

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "cohort/cohort.h"  // the public API: train::Job, train::Trainer, nn, data

namespace {

using namespace cohort;
using runtime::Shape;

struct Split {
  std::vector<float> trainX, trainY, testX, testY;
};

// A seeded 80/20 split of the rows, with every feature standardised by the training rows' mean and
// standard deviation.
Split splitAndStandardise(const runtime::data::Dataset& all, uint64_t seed) {
  const int64_t n = all.size(), features = all.sampleShape().numel();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  runtime::Rng rng(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[static_cast<size_t>(i)], order[rng.below(static_cast<uint64_t>(i + 1))]);
  const int64_t trainRows = n * 4 / 5;
  std::vector<double> mean(static_cast<size_t>(features)), sd(static_cast<size_t>(features));
  for (int64_t f = 0; f < features; ++f) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < trainRows; ++i) {
      const double v = all.inputs().at(order[static_cast<size_t>(i)] * features + f);
      s += v;
      s2 += v * v;
    }
    mean[static_cast<size_t>(f)] = s / trainRows;
    sd[static_cast<size_t>(f)] = std::sqrt(std::max(1e-12, s2 / trainRows - mean[static_cast<size_t>(f)] * mean[static_cast<size_t>(f)]));
  }
  Split split;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = order[static_cast<size_t>(i)];
    std::vector<float>& x = i < trainRows ? split.trainX : split.testX;
    for (int64_t f = 0; f < features; ++f) {
      x.push_back(static_cast<float>((all.inputs().at(row * features + f) - mean[static_cast<size_t>(f)]) / sd[static_cast<size_t>(f)]));
    }
    (i < trainRows ? split.trainY : split.testY).push_back(all.targets().at(row));
  }
  return split;
}

int run(int argc, char** argv) {
  std::string csv, mode = "local";
  int64_t epochs = 300;
  CLI::App app{"regression: Boston housing with an MLP and Adam"};
  app.add_option("--csv", csv, "the Boston housing CSV (13 features, MEDV last)")->required();
  app.add_option("--mode", mode, "local | hogwild | allreduce")->capture_default_str();
  app.add_option("--epochs", epochs, "epochs")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  train::Job job({.mode = train::parseMode(mode)});
  auto all = runtime::data::openDataset("csv:" + csv, runtime::data::Split::kTrain);
  if (all->sampleShape().numel() != 13) {
    COHORT_THROW(InvalidArgument) << csv << " has " << all->sampleShape().numel() << " features, Boston housing has 13";
  }
  const Split s = splitAndStandardise(*all, 2024);
  auto trainSet = runtime::data::datasetFromArrays({.name = "boston/train", .inputs = s.trainX, .sampleShape = Shape{13},
                                                    .targets = s.trainY, .targetShape = Shape{1}});
  auto testSet = runtime::data::datasetFromArrays({.name = "boston/test", .inputs = s.testX, .sampleShape = Shape{13},
                                                   .targets = s.testY, .targetShape = Shape{1}});
  auto model = nn::buildModel("mlp:13,64,64,1");
  auto optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kAdam, .lr = 1e-3f}, model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 5});
  nn::MeanSquaredError loss;
  train::Trainer trainer(job, loss, *trainSet, testSet.get(),
                         {.epochs = epochs, .batchSize = 16, .seed = 5, .classification = false});
  train::TrainResult r = trainer.run();
  if (job.world().rank != 0) return 0;
  const double rmse = std::sqrt(r.testLoss);
  std::printf("RESULT example=regression mode=%s world_size=%d epochs=%lld train_mse=%.3f test_rmse=%.3f\n", mode.c_str(),
              job.world().worldSize, static_cast<long long>(r.epochs), r.trainLoss, rmse);
  if (!(rmse < 4.0)) {
    std::fprintf(stderr, "regression: test RMSE %.3f is not below 4.0\n", rmse);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cohort::runMain("regression: ", [&] { return run(argc, argv); });
}
