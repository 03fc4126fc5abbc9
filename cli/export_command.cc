#include "cli/export_command.h"

#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "nn/checkpoint.h"  // checkpointLockHolder
#include "nn/gpt.h"
#include "nn/gpt_files.h"
#include "nn/model_weights.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/output_file.h"  // createParentDirectories

namespace cohort::cli {

namespace {

// The files an export writes (nn/gpt_files.h): one, or a directory's model.safetensors and config.json.
std::vector<std::string> exportTargets(const ExportFlags& f) {
  if (f.format == "llmc" || f.out.ends_with(".safetensors")) return {f.out};
  return {f.out + "/model.safetensors", f.out + "/config.json"};
}

// An export never replaces a training run's state: not the checkpoint it reads (the state --resume
// loads, the same file under any name), not a checkpoint a running job holds (its CheckpointLock).
void refuseTrainingCheckpoints(const ExportFlags& f) {
  struct stat in {};
  if (::stat(f.checkpoint.c_str(), &in) != 0) return;  // readModelWeights names what is missing
  for (const std::string& target : exportTargets(f)) {
    struct stat out {};
    if (::stat(target.c_str(), &out) == 0 && out.st_dev == in.st_dev && out.st_ino == in.st_ino) {
      COHORT_THROW(InvalidArgument) << target << " is the checkpoint being exported (" << f.checkpoint
                                    << "): the export would replace the training state that --resume loads; write "
                                       "it elsewhere";
    }
    if (const std::optional<std::string> holder = nn::checkpointLockHolder(target)) {
      COHORT_THROW(InvalidArgument) << target << " is the checkpoint of a running job (" << *holder
                                    << "): the export would replace it; stop that job first, or write the export "
                                       "elsewhere";
    }
  }
}

}  // namespace

void addExportFlags(CLI::App& c, ExportFlags& f) {
  c.add_option("--format", f.format, "hf (HuggingFace GPT-2: a directory, or a .safetensors file) | llmc (llm.c's model file)")
      ->required();
  c.add_option("--dtype", f.dtype, "llmc: fp32 (version 3) | bf16 (version 5)")->capture_default_str();
  c.add_option("checkpoint", f.checkpoint, "the weights: a Cohort checkpoint of a gpt: model, or a HuggingFace or llm.c file")
      ->required();
  c.add_option("out", f.out, "where to write them")->required();
}

int runExport(const ExportFlags& f) {
  if (f.format != "hf" && f.format != "llmc") {
    COHORT_THROW(InvalidArgument) << "--format must be hf or llmc, got '" << f.format << "'";
  }
  const runtime::DType dtype = runtime::parseDType(f.dtype, "--dtype");
  if (dtype != runtime::DType::kF32 && f.format != "llmc") {
    COHORT_THROW(InvalidArgument) << "--dtype " << f.dtype << " is for --format llmc; HuggingFace files are written in fp32";
  }
  refuseTrainingCheckpoints(f);
  const nn::ModelWeights weights = nn::readModelWeights(f.checkpoint);
  const std::unique_ptr<nn::Model> model = nn::modelOf(weights);
  const auto* gpt = dynamic_cast<const nn::Gpt*>(model->net.get());
  if (!gpt) {
    COHORT_THROW(InvalidArgument) << f.checkpoint << " holds model " << model->name
                                  << ", but export writes GPTs (models trained with --model gpt:...)";
  }
  std::vector<nn::NamedTensor> tensors;
  for (size_t i = 0; i < model->params.entries().size(); ++i) {
    tensors.push_back({model->params.entries()[i].name, model->params.value(i)});
  }
  runtime::createParentDirectories(f.out);  // as nanoGPT makes its out_dir
  if (f.format == "hf") {
    // The tokenizer the checkpoint records travels in the safetensors metadata (generate reads it back).
    nn::Metadata extra;
    auto digest = weights.metadata.find("tokenizer_digest");
    if (digest != weights.metadata.end()) extra["cohort_tokenizer_digest"] = digest->second;
    nn::writeHuggingFaceGpt(f.out, gpt->options(), tensors, extra);
  } else {
    nn::writeLlmcGpt(f.out, gpt->options(), tensors, dtype);
  }
  std::printf("exported %s (%s, %s) to %s as %s\n", f.checkpoint.c_str(), weights.format.c_str(), model->name.c_str(),
              f.out.c_str(),
              f.format == "hf" ? (f.out.ends_with(".safetensors") ? "HuggingFace safetensors"
                                                                  : "HuggingFace model.safetensors and config.json")
                               : (dtype == runtime::DType::kBF16 ? "an llm.c bf16 model file" : "an llm.c fp32 model file"));
  return 0;
}

}  // namespace cohort::cli
