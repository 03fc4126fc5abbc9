#include "nn/model_spec.h"

#include <algorithm>
#include <charconv>
#include <vector>

#include "nn/activation.h"
#include "nn/batchnorm.h"
#include "nn/conv2d.h"
#include "nn/dropout.h"
#include "nn/gpt.h"
#include "nn/gpu_dispatch.h"
#include "nn/linear.h"
#include "nn/pool.h"
#include "nn/reshape.h"
#include "runtime/error.h"

namespace cohort::nn {
namespace {

constexpr const char* kAccepted =
    "accepted: mlp:IN,HIDDEN...,OUT (e.g. mlp:784,512,256,10), cnn:lenet, cnn:lenet-bn, cnn:rosetta, "
    "gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V][,padded_vocab=P][,dropout=P][,bias=false] (e.g. "
    "gpt:layers=4,heads=4,dim=128,ctx=64)";

std::vector<int64_t> parseSizes(const std::string& spec, const std::string& list) {
  std::vector<int64_t> sizes;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(list.data() + pos, list.data() + comma, v);
    if (ec != std::errc() || end != list.data() + comma || v <= 0 || v > (int64_t{1} << 30)) {
      COHORT_THROW(InvalidArgument) << "bad model spec '" << spec << "': '" << list.substr(pos, comma - pos)
                                    << "' is not a positive layer size; " << kAccepted;
    }
    sizes.push_back(v);
    pos = comma + 1;
  }
  return sizes;
}

// Appends layers to a CNN under the mlp's naming scheme: each kind numbered from 0 in forward order
// (conv0, bn0, relu0, pool0, drop0, fc0, ...).
class CnnBuilder {
 public:
  explicit CnnBuilder(Sequential& net) : net_(net) {}

  CnnBuilder& view(const Shape& sampleShape) { return add(std::make_unique<Unflatten>(sampleShape), "view", nullptr); }
  CnnBuilder& conv(const Conv2dOptions& options) { return add(std::make_unique<Conv2d>(options), "conv", &convs_); }
  CnnBuilder& batchNorm(int64_t channels) { return add(std::make_unique<BatchNorm2d>(channels), "bn", &bns_); }
  CnnBuilder& relu() { return add(nn::relu(), "relu", &relus_); }
  CnnBuilder& maxPool(int64_t kernel) { return add(std::make_unique<MaxPool2d>(kernel), "pool", &pools_); }
  CnnBuilder& dropout(float p) { return add(std::make_unique<Dropout>(p), "drop", &drops_); }
  CnnBuilder& flatten() { return add(std::make_unique<Flatten>(), "flatten", nullptr); }
  CnnBuilder& linear(int64_t in, int64_t out) { return add(std::make_unique<Linear>(in, out), "fc", &fcs_); }

 private:
  CnnBuilder& add(ModulePtr m, const std::string& kind, int* counter) {
    net_.add(std::move(m), counter ? kind + std::to_string((*counter)++) : kind);
    return *this;
  }

  Sequential& net_;
  int convs_ = 0, bns_ = 0, relus_ = 0, pools_ = 0, drops_ = 0, fcs_ = 0;
};

// LeNet-5 with ReLU and max-pooling, for [1, 28, 28] images (flat [784] rows are viewed as such);
// with `batchNorm`, a BatchNorm2d follows each convolution.
void buildLenet(Sequential& net, ModelInfo& info, bool batchNorm) {
  CnnBuilder b(net);
  b.view(Shape{1, 28, 28}).conv({.in = 1, .out = 6, .kernel = 5, .padding = 2});
  if (batchNorm) b.batchNorm(6);
  b.relu().maxPool(2).conv({.in = 6, .out = 16, .kernel = 5});
  if (batchNorm) b.batchNorm(16);
  b.relu().maxPool(2).flatten().linear(16 * 5 * 5, 120).relu().linear(120, 84).relu().linear(84, 10);
  info.sampleShape = Shape{1, 28, 28};
  info.outputs = 10;
}

// The CIFAR-10 CNN of the 'rosetta' framework comparison (Keras' cifar10_cnn layout with 50 and 100
// filters) for [3, 32, 32] images (flat [3072] rows are viewed as such).
void buildRosetta(Sequential& net, ModelInfo& info) {
  CnnBuilder b(net);
  b.view(Shape{3, 32, 32});
  b.conv({.in = 3, .out = 50, .kernel = 3, .padding = 1}).relu().conv({.in = 50, .out = 50, .kernel = 3}).relu();
  b.maxPool(2).dropout(0.25f);
  b.conv({.in = 50, .out = 100, .kernel = 3, .padding = 1}).relu().conv({.in = 100, .out = 100, .kernel = 3}).relu();
  b.maxPool(2).dropout(0.25f);
  b.flatten().linear(100 * 6 * 6, 512).relu().dropout(0.5f).linear(512, 10);
  info.sampleShape = Shape{3, 32, 32};
  info.outputs = 10;
}

}  // namespace

namespace {

// The value of one gpt: key: a positive size, dropout's probability in [0, 1), bias's true/false.
struct GptKey {
  const std::string& spec;
  const std::string& item;
  const std::string value;
  [[noreturn]] void bad(const std::string& what) const {
    COHORT_THROW(InvalidArgument) << "bad model spec '" << spec << "': '" << item << "' " << what << "; " << kAccepted;
  }
  int64_t size() const {
    int64_t v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || v <= 0 || v > (int64_t{1} << 24)) {
      bad("is not KEY=N with N a positive size");
    }
    return v;
  }
  float probability() const {
    float v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || !(v >= 0.0f && v < 1.0f)) {
      bad("is not dropout=P with P in [0, 1)");
    }
    return v;
  }
  bool flag() const {
    if (value == "true" || value == "1") return true;
    if (value == "false" || value == "0") return false;
    bad("is not bias=true or bias=false");
  }
};

// gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V][,padded_vocab=P][,dropout=P][,bias=B]: keys in any
// order, each once; vocab 256 (bytes) unless given.
GptOptions parseGpt(const std::string& spec) {
  GptOptions o;
  o.vocab = 256;
  int64_t padded = 0;
  std::vector<std::string> seen;
  const std::string list = spec.substr(4);
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    const std::string item = list.substr(pos, comma - pos);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const GptKey k{spec, item, eq == std::string::npos ? std::string() : item.substr(eq + 1)};
    if (eq == std::string::npos) k.bad("is not KEY=VALUE");
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      COHORT_THROW(InvalidArgument) << "bad model spec '" << spec << "': '" << key << "' given twice";
    }
    seen.push_back(key);
    if (key == "layers") o.layers = k.size();
    else if (key == "heads") o.heads = k.size();
    else if (key == "dim") o.dim = k.size();
    else if (key == "ctx") o.context = k.size();
    else if (key == "vocab") o.vocab = k.size();
    else if (key == "padded_vocab") padded = k.size();
    else if (key == "dropout") o.dropout = k.probability();
    else if (key == "bias") o.bias = k.flag();
    else COHORT_THROW(InvalidArgument) << "bad model spec '" << spec << "': unknown key '" << key << "'; " << kAccepted;
    pos = comma + 1;
  }
  for (const char* key : {"layers", "heads", "dim", "ctx"}) {
    if (std::find(seen.begin(), seen.end(), key) == seen.end()) {
      COHORT_THROW(InvalidArgument) << "bad model spec '" << spec << "': a gpt needs layers, heads, dim and ctx; "
                                    << kAccepted;
    }
  }
  if (padded > 0 && padded < o.vocab) {
    COHORT_THROW(InvalidArgument) << "bad model spec '" << spec << "': padded_vocab=" << padded
                                  << " is below the vocabulary " << o.vocab;
  }
  if (padded > o.vocab) {
    o.realVocab = o.vocab;
    o.vocab = padded;
  }
  return o;
}

}  // namespace

std::unique_ptr<Model> buildModel(const std::string& spec) {
  if (spec.rfind("gpt:", 0) == 0) {
    const GptOptions o = parseGpt(spec);
    // The network is the Gpt itself, so its parameters keep nanoGPT's names ("transformer.wte.weight").
    return std::make_unique<Model>(std::make_unique<Gpt>(o), ModelInfo{.name = spec, .sampleShape = Shape{o.context},
                                                                      .outputs = o.vocab});
  }
  auto net = std::make_unique<Sequential>();
  ModelInfo info{.name = spec};
  if (spec.rfind("mlp:", 0) == 0) {
    std::vector<int64_t> sizes = parseSizes(spec, spec.substr(4));
    if (sizes.size() < 2) {
      COHORT_THROW(InvalidArgument) << "bad model spec '" << spec << "': an mlp needs at least an input and an output size; "
                                    << kAccepted;
    }
    for (size_t i = 0; i + 1 < sizes.size(); ++i) {
      net->add(std::make_unique<Linear>(sizes[i], sizes[i + 1]), "fc" + std::to_string(i));
      if (i + 2 < sizes.size()) net->add(relu(), "relu" + std::to_string(i));
    }
    info.sampleShape = Shape{sizes.front()};
    info.outputs = sizes.back();
  } else if (spec == "cnn:lenet" || spec == "cnn:lenet-bn") {
    buildLenet(*net, info, spec == "cnn:lenet-bn");
  } else if (spec == "cnn:rosetta") {
    buildRosetta(*net, info);
  } else {
    COHORT_THROW(InvalidArgument) << "unknown model spec '" << spec << "'; " << kAccepted;
  }
  return std::make_unique<Model>(std::move(net), std::move(info));
}

void bindOnGpu(Model& model, const Model& initialised, runtime::cuda::GpuContext& gpu) {
#ifdef COHORT_HAVE_CUDA
  if (initialised.name != model.name || !initialised.params.bound()) {
    COHORT_THROW(InvalidArgument) << "bindOnGpu needs a bound " << model.name << " to copy, got " << initialised.name;
  }
  model.params.allocate(gpu.allocator());
  model.params.values().copyFrom(initialised.params.values());
  if (model.params.bufferNumel() > 0) model.params.buffers().copyFrom(initialised.params.buffers());
  runtime::cuda::fill({model.params.grads().data(), model.params.numel()}, 0.0f, gpu.stream());
  gpu.stream().synchronize();
#else
  (void)model, (void)initialised, (void)gpu;
  COHORT_THROW(InvalidArgument) << "bindOnGpu: CUDA support not compiled in";
#endif
}

}  // namespace cohort::nn
