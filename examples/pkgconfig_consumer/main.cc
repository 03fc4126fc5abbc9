// quadrants: a program of Cohort's user with a layer of its own, built with plain g++ and
// pkg-config against the installed library (scripts/install PREFIX):
//
//   export PKG_CONFIG_PATH=PREFIX/lib/pkgconfig
//   g++ -O2 examples/pkgconfig_consumer/main.cc $(pkg-config --cflags --libs cohort) -o quadrants
//   PREFIX/bin/cohortrun --nproc-per-node 2 -- ./quadrants     # or ./quadrants alone; [mode] optional
//
// A point of the plane is of class 1 when its coordinates have the same sign (XOR of the signs):
// no linear model learns that from (x, y), but after the user's layer Products appends x·y, one
// Linear layer does, in any mode (allreduce by default). Prints `RESULT consumer=pkgconfig ...` on
// rank 0 and exits 1 below a test accuracy of 0.95.
#include <cohort/cohort.h>  // the public API: train::Job, train::Trainer, nn::Module, data

#include <cstdio>
#include <memory>
#include <vector>

namespace {

using namespace cohort;
using runtime::Shape;
using runtime::Tensor;

// Products: [batch, 2] -> [batch, 3] = (x, y, x·y). No parameters; CPU only (nn/module.h's contract).
class Products final : public nn::Module {
 public:
  std::string name() const override { return "Products"; }
  Shape outputShape(const Shape& in) const override {
    if (in.rank() != 2 || in[1] != 2) COHORT_THROW(InvalidArgument) << "Products takes [batch, 2], got " << in.str();
    return Shape{in[0], 3};
  }
  const Tensor& forward(const Tensor& x, const nn::Pass&) override {
    if (x.device().isCuda()) COHORT_THROW(InvalidArgument) << "Products runs on the CPU only";
    runtime::ensureShape(y_, outputShape(x.shape()));
    x_ = x;  // a handle: backward needs x for d(xy)
    for (int64_t r = 0; r < x.dim(0); ++r) {
      y_.at(3 * r) = x.at(2 * r), y_.at(3 * r + 1) = x.at(2 * r + 1), y_.at(3 * r + 2) = x.at(2 * r) * x.at(2 * r + 1);
    }
    return y_;
  }
  const Tensor& backward(const Tensor& dy, const nn::Pass& pass) override {
    if (!pass.needInputGrad) return dx_ = Tensor();
    runtime::ensureShape(dx_, x_.shape());
    for (int64_t r = 0; r < x_.dim(0); ++r) {  // d(xy)/dx = y, d(xy)/dy = x
      dx_.at(2 * r) = dy.at(3 * r) + dy.at(3 * r + 2) * x_.at(2 * r + 1);
      dx_.at(2 * r + 1) = dy.at(3 * r + 1) + dy.at(3 * r + 2) * x_.at(2 * r);
    }
    return dx_;
  }

 private:
  Tensor x_, y_, dx_;
};

std::unique_ptr<runtime::data::Dataset> quadrants(int n, uint64_t seed) {
  std::vector<float> points, labels;
  runtime::Rng rng(seed);
  for (int i = 0; i < n; ++i) {
    const float x = rng.uniform(-1.0f, 1.0f), y = rng.uniform(-1.0f, 1.0f);
    points.insert(points.end(), {x, y});
    labels.push_back(x * y > 0 ? 1.0f : 0.0f);
  }
  return runtime::data::datasetFromArrays(
      {.name = "quadrants", .inputs = points, .sampleShape = Shape{2}, .targets = labels, .numClasses = 2});
}

int run(const std::string& mode) {
  train::Job job({.mode = train::parseMode(mode)});
  auto trainSet = quadrants(4000, 3), testSet = quadrants(1000, 4);
  auto net = std::make_unique<nn::Sequential>();
  net->add(std::make_unique<Products>(), "products").add(std::make_unique<nn::Linear>(3, 2), "fc");
  nn::Model model(std::move(net), {.name = "quadrants", .sampleShape = Shape{2}, .outputs = 2});
  auto optimizer = nn::makeOptimizer({.lr = 0.05f, .momentum = 0.9f}, model.params.numel(), job.gpu());
  job.place(model, *optimizer, {.seed = 2});
  nn::SoftmaxCrossEntropy loss;
  train::Trainer trainer(job, loss, *trainSet, testSet.get(), {.epochs = 8, .batchSize = 32, .seed = 6});
  const train::TrainResult r = trainer.run();
  if (job.world().rank != 0) return 0;
  std::printf("RESULT consumer=pkgconfig mode=%s world_size=%d rank0 test_acc=%.4f cohort=%s\n", mode.c_str(),
              job.world().worldSize, r.testAcc, version());
  if (r.testAcc >= 0.95) return 0;
  std::fprintf(stderr, "quadrants: test accuracy %.4f is below 0.95\n", r.testAcc);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "allreduce";
  return cohort::runMain("quadrants: ", [&] { return run(mode); });
}
