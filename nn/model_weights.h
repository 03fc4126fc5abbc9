// The weights a model starts from (`cohort train --init-from FILE`, issue 32): a Cohort checkpoint of
// any model (its weights only), a HuggingFace GPT-2 (model.safetensors, or a directory holding it and
// config.json) or an llm.c model file (gpt2_124M.bin) (nn/gpt_files.h). They are told apart by llm.c's
// magic (a file named *.bin is taken for llm.c's whatever it holds, so that a bad magic is named as
// such); everything else is read as safetensors: a Cohort checkpoint where its metadata says so.
//
//   nn::ModelWeights w = nn::readModelWeights("gpt2/model.safetensors");
//   auto model = nn::buildModel(w.spec);            // or the user's spec: checkWeightsFit says if it fits
//   nn::checkWeightsFit(*model, w);
//   model->params.allocate(runtime::cpuAllocator());
//   nn::copyWeights(*model, w);
//
// A model fits weights when every parameter and buffer it has is there with its shape, by name
// (tensors the model lacks, e.g. a checkpoint's optimizer state, are ignored), with two exceptions
// for a GPT: a shorter context takes the leading rows of wpe (llm.c trains GPT-2 at T < 1024 the
// same way), and wte may have more rows than the model's vocabulary where they are an llm.c file's
// padding (V = 50257 or Vp = 50304 both load). A GPT must also agree on its heads, which the shapes
// do not show (unless the file could only assume them: headsAssumed). Thread safety: no shared state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/model.h"

namespace cohort::nn {

struct ModelWeights {
  std::string path = {};
  std::string format = {};    // "Cohort checkpoint", "HuggingFace safetensors", "llm.c (fp32)", "llm.c (bf16)"
  std::string spec = {};      // the model they are of; empty where a HuggingFace GPT's heads are unknown
  bool headsAssumed = false;  // a HuggingFace GPT without config.json: heads = width / 64
  int64_t vocabulary = 0;     // a GPT's: the rows of wte that are tokens (an llm.c file may pad past them)
  std::vector<NamedTensor> tensors = {};
  // A Cohort checkpoint's (its "format" removed); a Cohort HuggingFace export's "tokenizer_digest"
  // (from its "cohort_tokenizer_digest"); other files': none.
  Metadata metadata = {};
};

// IoError naming the file and the problem for anything unreadable, malformed or of an unknown kind,
// and for a NaN or infinite value (naming the tensor and the element; issue 44). Text from the file
// that reaches a message (tensor names, a model spec in its metadata) is quoted printably and cut
// (runtime/printable.h); a spec in the metadata must be one buildModel builds.
ModelWeights readModelWeights(const std::string& path);

// InvalidArgument naming the first parameter (or buffer) whose shape differs, or that is missing,
// or the heads where a GPT's differ, or a bias for a GPT without biases (GptOptions::bias false).
void checkWeightsFit(const Model& model, const ModelWeights& weights);

// Copies the weights into `model`'s parameters and buffers (bound on the CPU), after checkWeightsFit.
void copyWeights(Model& model, const ModelWeights& weights);

// The model of `spec` (a --model flag: cohort eval, predict and generate, as train's), which must fit
// the weights (checkWeightsFit), or where it is empty the one they are of (weights.spec); bound on
// the CPU and holding them. InvalidArgument where neither says (a HuggingFace GPT whose heads are
// not given and whose width is no multiple of 64).
std::unique_ptr<Model> modelOf(const ModelWeights& weights, const std::string& spec = "");

// "PATH (FORMAT, SPEC)" for a log line, and where the heads were guessed (headsAssumed) ": heads
// taken as width / 64, as in every GPT-2 size (no config.json beside it)".
std::string describeWeights(const ModelWeights& weights);

}  // namespace cohort::nn
