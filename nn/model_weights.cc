#include "nn/model_weights.h"

#include <sys/stat.h>

#include <cmath>
#include <cstring>

#include "nn/gpt.h"
#include "nn/gpt_files.h"
#include "nn/model_spec.h"
#include "nn/sharded_checkpoint.h"
#include "runtime/error.h"

namespace cohort::nn {

namespace {

using runtime::Shape;
using runtime::Tensor;

ModelWeights fromGptFile(GptFile file, const std::string& path) {
  return {.path = path,
          .format = file.format,
          .spec = file.options.heads > 0 ? gptSpec(file.options) : std::string(),
          .headsAssumed = file.headsAssumed,
          .vocabulary = file.options.vocab,
          .tensors = std::move(file.tensors)};
}

const Gpt* gptOf(const Model& model) { return dynamic_cast<const Gpt*>(model.net.get()); }

// Issue 44: a NaN or infinite weight made eval print loss nan (exit 0), generate print 0xff bytes
// and train blame the learning rate; one pass over what was read names the tensor instead.
void requireFinite(const ModelWeights& w) {
  for (const NamedTensor& t : w.tensors) {
    const float* v = t.tensor.data();
    for (int64_t i = 0; i < t.tensor.numel(); ++i) {
      if (!std::isfinite(v[i])) {
        COHORT_THROW(IoError) << w.path << ": tensor '" << t.name << "' holds " << v[i] << " at element " << i
                              << " (" << w.format << "): damaged weights, or those of a run that diverged";
      }
    }
  }
}

const Tensor* find(const ModelWeights& w, const std::string& name) {
  for (const NamedTensor& t : w.tensors) {
    if (t.name == name) return &t.tensor;
  }
  return nullptr;
}

// Whether `model` may take the leading rows of `have` as its `want`-shaped `name` (see the header).
bool takesLeadingRows(const ModelWeights& w, const std::string& name, const Shape& want, const Shape& have, bool gpt) {
  if (!gpt || want.rank() != 2 || have.rank() != 2 || want[1] != have[1] || want[0] > have[0]) return false;
  if (name == "transformer.wpe.weight") return true;
  return name == "transformer.wte.weight" && want[0] >= w.vocabulary;
}

// The weights' tensor for each of the model's, by name (nullptr: a mistake checkWeightsFit names).
template <class Visit>
void forEachEntry(const Model& model, Visit&& visit) {
  const ParamBuffer& p = model.params;
  for (size_t i = 0; i < p.entries().size(); ++i) visit(p.entries()[i], [&] { return p.value(i); });
  for (size_t i = 0; i < p.bufferEntries().size(); ++i) visit(p.bufferEntries()[i], [&] { return p.buffer(i); });
}

}  // namespace

ModelWeights readModelWeights(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) COHORT_THROW(IoError) << path << ": cannot open: " << std::strerror(errno);
  // llm.c's files by their magic, or by their name (then a bad magic is named as such).
  if (S_ISREG(st.st_mode) && (isLlmcModelFile(path) || path.ends_with(".bin"))) {
    ModelWeights w = fromGptFile(readLlmcGpt(path), path);
    requireFinite(w);
    return w;
  }
  const std::string file = S_ISDIR(st.st_mode) ? path + "/model.safetensors" : path;
  Checkpoint contents = readSafetensors(file);
  auto format = contents.metadata.find("format");
  if (format == contents.metadata.end() || format->second != kCheckpointFormat) {
    ModelWeights w = fromGptFile(huggingFaceGpt(contents, file), path);
    // A Cohort export's record of its tokenizer (cohort export --format hf), as a checkpoint's.
    auto digest = contents.metadata.find("cohort_tokenizer_digest");
    if (digest != contents.metadata.end()) w.metadata["tokenizer_digest"] = digest->second;
    requireFinite(w);
    return w;
  }
  const auto spec = contents.metadata.find("model");
  if (spec == contents.metadata.end()) COHORT_THROW(IoError) << path << ": checkpoint metadata lacks 'model'";
  auto model = modelOfMetadata(spec->second, path, "model");  // the spec is printed from here on: one Cohort builds
  if (isShardedManifest(contents)) {
    // A sharded checkpoint (ZeRO): its shard files assembled into the whole model, cut into its
    // parameters as a whole-model checkpoint holds them (nn/sharded_checkpoint.h).
    Checkpoint whole = readShardedCheckpoint(file, {.split = model->params.entries()});
    whole.metadata["format"] = format->second;
    contents = std::move(whole);
    format = contents.metadata.find("format");
  }
  ModelWeights w{.path = path,
                 .format = "Cohort checkpoint",
                 .spec = contents.metadata.at("model"),
                 .tensors = std::move(contents.tensors)};
  contents.metadata.erase(format);
  w.metadata = std::move(contents.metadata);
  if (const Gpt* gpt = gptOf(*model)) w.vocabulary = gpt->options().vocab;
  requireFinite(w);
  return w;
}

void checkWeightsFit(const Model& model, const ModelWeights& w) {
  const Gpt* gpt = gptOf(model);
  if (gpt && !gpt->options().bias) {
    // Dropping a file's biases would make another model than the file's, silently.
    for (const NamedTensor& t : w.tensors) {
      if (t.name.ends_with(".bias")) {
        COHORT_THROW(InvalidArgument) << "model " << model.name << " has no biases (bias=false), but " << w.path << " ("
                                      << w.format << ") holds '" << t.name
                                      << "': its weights need a model with biases (leave bias=false out)";
      }
    }
  }
  forEachEntry(model, [&](const ParamBuffer::Entry& e, auto) {
    const Tensor* t = find(w, e.name);
    if (!t) {
      COHORT_THROW(InvalidArgument) << w.path << " (" << w.format << ") has no tensor '" << e.name << "' for model " << model.name;
    }
    if (t->shape() != e.shape && !takesLeadingRows(w, e.name, e.shape, t->shape(), gpt != nullptr)) {
      COHORT_THROW(InvalidArgument) << "model " << model.name << " does not fit " << w.path << " (" << w.format << ", "
                                    << (w.spec.empty() ? "a GPT" : w.spec) << "): '" << e.name << "' is " << e.shape.str()
                                    << " in the model and " << t->shape().str() << " in the file";
    }
  });
  if (!gpt || w.headsAssumed || w.spec.empty()) return;
  const auto file = buildModel(w.spec);
  const Gpt* theirs = gptOf(*file);
  if (theirs && theirs->options().heads != gpt->options().heads) {
    COHORT_THROW(InvalidArgument) << "model " << model.name << " has " << gpt->options().heads << " heads, but " << w.path
                                  << " (" << w.format << ") is a GPT of " << theirs->options().heads;
  }
}

void copyWeights(Model& model, const ModelWeights& w) {
  checkWeightsFit(model, w);
  forEachEntry(model, [&](const ParamBuffer::Entry& e, auto into) {
    const Tensor& from = *find(w, e.name);
    const Tensor to = into();
    if (from.shape() == e.shape) return to.copyFrom(from);
    std::memcpy(to.data(), from.data(), static_cast<size_t>(to.numel()) * sizeof(float));  // the leading rows
  });
}

std::unique_ptr<Model> modelOf(const ModelWeights& w, const std::string& spec) {
  if (spec.empty() && w.spec.empty()) {
    COHORT_THROW(InvalidArgument) << w.path << " (" << w.format << ") does not say how many heads its GPT has (no "
                                  << "config.json beside it, and its width is no multiple of 64): give --model gpt:...";
  }
  std::unique_ptr<Model> model = buildModel(spec.empty() ? w.spec : spec);
  model->params.allocate(runtime::cpuAllocator());
  copyWeights(*model, w);
  return model;
}

std::string describeWeights(const ModelWeights& w) {
  std::string line = w.path + " (" + w.format + (w.spec.empty() ? "" : ", " + w.spec) + ")";
  if (w.headsAssumed) line += ": heads taken as width / 64, as in every GPT-2 size (no config.json beside it)";
  return line;
}

}  // namespace cohort::nn
