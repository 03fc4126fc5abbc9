#include "train/checkpoint/checkpointer.h"

#include <sys/stat.h>

#include <cstdlib>

#include "nn/sharded_checkpoint.h"
#include "runtime/error.h"
#include "train/checkpoint/sharded_checkpointer.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::train {

namespace {

const char* const kIdentityKeys[] = {"model", "optimizer", "param_count", "world_size", "mode", "param_shapes"};

// A sharded checkpoint's record of the parameters, which its shard files hold as one flat tensor:
// "name<TAB>shape" lines, shape as Shape::str() writes it ("[64, 784]").
constexpr char kParamShapesKey[] = "param_shapes";

std::string paramShapes(const nn::ParamBuffer& params) {
  std::string text;
  for (const nn::ParamBuffer::Entry& e : params.entries()) text += e.name + "\t" + e.shape.str() + "\n";
  return text;
}

std::map<std::string, std::string> parseParamShapes(const nn::Metadata& metadata, const std::string& path) {
  std::map<std::string, std::string> shapes;
  const std::string& text = metadataText(metadata, kParamShapesKey, path);
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at), tab = text.find('\t', at);
    if (end == std::string::npos || tab == std::string::npos || tab > end) {
      COHORT_THROW(IoError) << path << ": checkpoint metadata '" << kParamShapesKey << "' is malformed at byte " << at;
    }
    shapes[text.substr(at, tab - at)] = text.substr(tab + 1, end - tab - 1);
    at = end + 1;
  }
  return shapes;
}

std::map<std::string, std::string> shapesOf(const nn::Checkpoint& ckpt) {
  std::map<std::string, std::string> shapes;
  for (const nn::NamedTensor& t : ckpt.tensors) shapes[t.name] = t.tensor.shape().str();
  return shapes;
}

// "a hogwild job of 2 ranks"
std::string jobDescription(const std::string& mode, const std::string& worldSize) {
  const char* article = !mode.empty() && std::string("aeiou").find(mode[0]) != std::string::npos ? "an " : "a ";
  return article + mode + " job of " + worldSize + (worldSize == "1" ? " rank" : " ranks");
}

}  // namespace

const std::string& metadataText(const nn::Metadata& metadata, const std::string& key, const std::string& path) {
  auto it = metadata.find(key);
  if (it == metadata.end()) COHORT_THROW(IoError) << path << ": checkpoint metadata lacks '" << key << "'";
  return it->second;
}

int64_t metadataCount(const nn::Metadata& metadata, const std::string& key, const std::string& path) {
  const std::string& value = metadataText(metadata, key, path);
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < 0) {
    COHORT_THROW(IoError) << path << ": checkpoint metadata '" << key << "' = '" << value << "' is not a count";
  }
  return v;
}

Checkpointer::Checkpointer(const Context& c)
    : placement_(c.placement),
      collectives_(c.collectives),
      model_(c.model),
      optimizer_(c.optimizer),
      world_(c.world),
      gpu_(c.gpu),
      mode_(c.mode) {
  if (c.sharded) {
    sharded_ = std::make_unique<ShardedCheckpointer>(ShardedCheckpointer::Context{.placement = *c.sharded,
                                                                                 .collectives = c.collectives,
                                                                                 .params = c.model.params,
                                                                                 .optimizer = c.optimizer,
                                                                                 .world = c.world,
                                                                                 .timeout = c.timeout});
  }
}

Checkpointer::~Checkpointer() = default;

bool Checkpointer::inFlight() const { return sharded_ && sharded_->inFlight(); }

std::optional<CheckpointCommit> Checkpointer::settle(const SettleOptions& options) {
  if (!sharded_) return std::nullopt;
  return sharded_->settle(options);
}

nn::Metadata Checkpointer::identity() const {
  return {{"model", model_.name},
          {"optimizer", optimizer_.name()},
          {"param_count", std::to_string(model_.params.numel())},
          {"world_size", std::to_string(world_.worldSize)},
          {"mode", mode_}};
}

void Checkpointer::save(const std::string& path, const nn::Metadata& extra, const SaveOptions& options) {
  for (const char* key : kIdentityKeys) {
    if (extra.count(key))
      COHORT_THROW(InvalidArgument) << "checkpoint metadata '" << key << "' is written by the job itself";
  }
  if (options.async && !sharded_) {
    COHORT_THROW(InvalidArgument) << "an asynchronous checkpoint needs a sharded job (zero >= 1): this job writes one "
                                  << "whole-model file from rank 0";
  }
  if (sharded_) {  // each rank its shard file, nothing gathered (train/checkpoint/sharded_checkpointer.h)
    nn::Metadata metadata = extra;
    for (auto& [key, value] : identity()) metadata[key] = value;
    metadata[kParamShapesKey] = paramShapes(model_.params);
    sharded_->save(path, metadata, options);
    return;
  }
#ifdef COHORT_HAVE_CUDA
  if (gpu_) gpu_->stream().synchronize();  // the blocking copies below do not wait for the compute stream
#endif
  SavedState state = placement_.saveState();
  if (world_.rank == 0) {
    const nn::ParamBuffer& params = model_.params;
    std::vector<nn::NamedTensor> tensors;
    for (size_t i = 0; i < params.entries().size(); ++i) tensors.push_back({params.entries()[i].name, params.value(i)});
    for (size_t i = 0; i < params.bufferEntries().size(); ++i) {
      tensors.push_back({params.bufferEntries()[i].name, params.buffer(i)});
    }
    for (nn::NamedTensor& t : state.tensors) tensors.push_back(std::move(t));
    nn::Metadata metadata = extra;
    for (auto& [key, value] : state.metadata) metadata[key] = value;
    for (auto& [key, value] : identity()) metadata[key] = value;
    writeCheckpoint(path, tensors, metadata);
  }
  // Shared parameters: nobody updates them while rank 0 writes.
  if (placement_.sharedParams()) collectives_.barrier("checkpoint written");
}

void Checkpointer::validate(const nn::Metadata& metadata, const std::map<std::string, std::string>& shapes,
                            const std::string& path, const nn::Metadata& mustMatch) const {
  auto expectSame = [&](const std::string& key, const std::string& now) {
    const std::string& was = metadataText(metadata, key, path);
    if (was != now) {
      COHORT_THROW(InvalidArgument) << path << ": checkpoint was written with " << key << " '" << was
                                    << "' but this run uses '" << now << "'";
    }
  };
  expectSame("model", model_.name);
  expectSame("optimizer", optimizer_.name());
  for (const auto& [key, value] : mustMatch) expectSame(key, value);
  // Where the optimizer state lives follows the mode: one state for the job (local, allreduce), which
  // any number of ranks takes over, or one per Hogwild worker, which HogwildPlacement::loadState
  // merges or splits for another number of workers (docs/checkpoints.md). Between the two there is
  // no sound mapping. (Checkpoints written before the mode was recorded resume with their world size.)
  const std::string worldSize = std::to_string(world_.worldSize);
  auto mode = metadata.find("mode");
  if (mode == metadata.end()) {
    expectSame("world_size", worldSize);
  } else if ((mode->second == "hogwild") != (mode_ == "hogwild")) {
    const std::string& was = metadataText(metadata, "world_size", path);
    COHORT_THROW(InvalidArgument) << path << ": checkpoint was written by " << jobDescription(mode->second, was)
                                  << ", and this is " << jobDescription(mode_, worldSize)
                                  << ": Hogwild keeps an optimizer state per worker, the other modes one "
                                  << "for the job, and neither is the other's, so it resumes only in mode "
                                  << (mode->second == "hogwild" ? "hogwild" : "local or allreduce")
                                  << " (with any number of ranks), or start afresh without resuming";
  }
  // The same name can stand for another architecture (a user's model): compare every parameter.
  const nn::ParamBuffer& params = model_.params;
  for (const nn::ParamBuffer::Entry& e : params.entries()) {
    auto t = shapes.find(e.name);
    if (t == shapes.end())
      COHORT_THROW(InvalidArgument) << path << ": checkpoint of another model: it has no parameter '" << e.name << "'";
    if (t->second != e.shape.str()) {
      COHORT_THROW(InvalidArgument) << path << ": checkpoint of another model: parameter '" << e.name << "' is "
                                    << t->second << " there and " << e.shape.str() << " here";
    }
  }
  expectSame("param_count", std::to_string(params.numel()));
}

// The manifest (or the whole file) first: everything is validated before any state changes.
std::optional<nn::Metadata> Checkpointer::load(const std::string& path, const nn::Metadata& mustMatch) {
  struct stat st;
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return std::nullopt;
  if (sharded_) sharded_->settle({.wait = true});  // nothing of this job's is left in flight
  nn::Checkpoint ckpt = nn::readCheckpoint(path);
  if (!nn::isShardedManifest(ckpt)) {
    validate(ckpt.metadata, shapesOf(ckpt), path, mustMatch);
    loadWhole(ckpt, path);
    return ckpt.metadata;
  }
  nn::ShardedManifest manifest = nn::readShardedManifest(path);
  validate(manifest.metadata, parseParamShapes(manifest.metadata, path), path, mustMatch);
  if (sharded_) {
    sharded_->load(path, manifest);  // resharded onto this job's map
  } else {
    loadWhole(nn::readShardedCheckpoint(path, {.split = model_.params.entries()}), path);
  }
  return manifest.metadata;
}

void Checkpointer::loadWhole(const nn::Checkpoint& ckpt, const std::string& path) {
#ifdef COHORT_HAVE_CUDA
  // The blocking copies below do not wait for the compute stream: work it still holds (the fills of
  // a fresh optimizer state, the last step) would land after them, over the loaded values.
  if (gpu_) gpu_->stream().synchronize();
#endif
  CheckpointReader reader(ckpt, path);
  placement_.loadState(reader);
  // Model buffers are private to each rank (never shared), so every rank loads its own.
  const nn::ParamBuffer& params = model_.params;
  for (size_t i = 0; i < params.bufferEntries().size(); ++i)
    reader.load(params.bufferEntries()[i].name, params.buffer(i));
}

}  // namespace cohort::train
