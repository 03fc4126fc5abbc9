#include "train/checkpoint/checkpointer.h"

#include <sys/stat.h>

#include <cstdlib>

#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::train {

namespace {

const char* const kIdentityKeys[] = {"model", "optimizer", "param_count", "world_size", "mode"};

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
      mode_(c.mode) {}

nn::Metadata Checkpointer::identity() const {
  return {{"model", model_.name},
          {"optimizer", optimizer_.name()},
          {"param_count", std::to_string(model_.params.numel())},
          {"world_size", std::to_string(world_.worldSize)},
          {"mode", mode_}};
}

void Checkpointer::save(const std::string& path, const nn::Metadata& extra) {
  for (const char* key : kIdentityKeys) {
    if (extra.count(key))
      COHORT_THROW(InvalidArgument) << "checkpoint metadata '" << key << "' is written by the job itself";
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

void Checkpointer::validate(const nn::Checkpoint& ckpt, const std::string& path, const nn::Metadata& mustMatch) const {
  auto expectSame = [&](const std::string& key, const std::string& now) {
    const std::string& was = metadataText(ckpt.metadata, key, path);
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
  auto mode = ckpt.metadata.find("mode");
  if (mode == ckpt.metadata.end()) {
    expectSame("world_size", worldSize);
  } else if ((mode->second == "hogwild") != (mode_ == "hogwild")) {
    const std::string& was = metadataText(ckpt.metadata, "world_size", path);
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
    const runtime::Tensor* t = ckpt.find(e.name);
    if (!t)
      COHORT_THROW(InvalidArgument) << path << ": checkpoint of another model: it has no parameter '" << e.name << "'";
    if (t->shape() != e.shape) {
      COHORT_THROW(InvalidArgument) << path << ": checkpoint of another model: parameter '" << e.name << "' is "
                                    << t->shape().str() << " there and " << e.shape.str() << " here";
    }
  }
  expectSame("param_count", std::to_string(params.numel()));
}

std::optional<nn::Metadata> Checkpointer::load(const std::string& path, const nn::Metadata& mustMatch) {
  struct stat st;
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return std::nullopt;
  const nn::Checkpoint ckpt = nn::readCheckpoint(path);
  validate(ckpt, path, mustMatch);
  CheckpointReader reader(ckpt, path);
  placement_.loadState(reader);
  // Model buffers are private to each rank (never shared), so every rank loads its own.
  const nn::ParamBuffer& params = model_.params;
  for (size_t i = 0; i < params.bufferEntries().size(); ++i)
    reader.load(params.bufferEntries()[i].name, params.buffer(i));
  return ckpt.metadata;
}

}  // namespace cohort::train
