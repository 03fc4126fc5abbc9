// GPT-2 weights in the files other tools write and read (issue 32): HuggingFace's safetensors and
// llm.c's model file, converted to and from the tensors of nn::Gpt (nanoGPT's names, nn.Linear's
// [out, in] layout; nn/gpt.h).
//
// HuggingFace (transformers' GPT2LMHeadModel, e.g. gpt2's model.safetensors): tensors named
// "wte.weight", "wpe.weight", "h.N.ln_1.weight", "h.N.attn.c_attn.weight", ..., "ln_f.bias", with or
// without the prefix "transformer."; the projections are Conv1D, stored [in, out] (transposed here);
// the head is tied to wte ("lm_head.weight", where present, must equal it); the attention's mask
// buffers ("h.N.attn.bias", "h.N.attn.masked_bias") are ignored; F32, F16 or BF16. The number of
// heads is not in the weights: it comes from config.json beside the file ("n_head", which must divide
// the width, and whose other sizes ("n_embd", "n_layer", "vocab_size", "n_positions", "n_inner":
// null or 4 × n_embd) must agree with the tensors and whose activation must be GPT-2's tanh GELU;
// each refusal names config.json and the field, as does a config.json that is no regular file), else
// from the metadata key "cohort_model" that writeHuggingFaceGpt writes, else it is taken as width /
// 64 (every GPT-2 size has heads of 64) and reported so (headsAssumed; `--model` says otherwise).
//
// llm.c (gpt2_124M.bin, the files train_gpt2.py and train_gpt2.cu write): a header of 256 int32
// (magic 20240326, version 3 for fp32 or 5 for bf16, max T, vocabulary V, layers L, heads NH,
// channels C, padded vocabulary Vp >= V), then the parameters one after the other in llm.c's order:
// wte [Vp, C], wpe [maxT, C], then for each of the sixteen kinds all L layers' tensors (ln_1 weight,
// ln_1 bias, c_attn weight [3C, C], c_attn bias, attn c_proj weight [C, C], its bias, ln_2 weight and
// bias, c_fc weight [4C, C], its bias, mlp c_proj weight [C, 4C], its bias), ln_f weight and bias.
// Weights are [out, in] as here. The file must be exactly that long. wte's Vp − V padding rows are
// kept: a model of vocabulary V takes the first V rows, one of Vp all of them (nn/model_weights.h).
//
// Every refusal is an IoError naming the file and the problem (a bad magic, version, size, header
// sizes whose byte count passes 2^64, a missing or misshapen tensor; text from the file quoted
// printably and cut, runtime/printable.h); no partial result. Thread safety: the functions share no state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/gpt.h"
#include "nn/model.h"
#include "runtime/dtype.h"

namespace cohort::nn {

inline constexpr int32_t kLlmcModelMagic = 20240326;

// A GPT's weights as read from another tool's file.
struct GptFile {
  GptOptions options = {};           // as the file gives them (vocab: the real vocabulary V)
  bool headsAssumed = false;         // HuggingFace without config.json or metadata: heads = width / 64
  std::vector<NamedTensor> tensors = {};  // nn::Gpt's names and layouts (an llm.c wte keeps its padding)
  std::string format = {};                // "HuggingFace safetensors", "llm.c (fp32)", "llm.c (bf16)"
};

// The model spec of a GPT: "gpt:layers=L,heads=H,dim=D,ctx=T,vocab=V" (nn/model_spec.h).
std::string gptSpec(const GptOptions& options);

// True when `path` starts with llm.c's model magic (a short or unreadable file: false).
bool isLlmcModelFile(const std::string& path);

// The model `spec` builds, `spec` being the metadata `key` of `file`; IoError "FILE: its metadata
// "KEY" is 'SPEC', not a model spec Cohort builds" otherwise, the spec quoted printably and cut to 120
// bytes (runtime/printable.h: text from a file never reaches the terminal raw).
std::unique_ptr<Model> modelOfMetadata(const std::string& spec, const std::string& file, const std::string& key);

// A HuggingFace GPT-2: `path` is model.safetensors or a directory holding it (and config.json).
GptFile readHuggingFaceGpt(const std::string& path);
// The same from a safetensors file already read (readSafetensors) from `file`.
GptFile huggingFaceGpt(const Checkpoint& contents, const std::string& file);
GptFile readLlmcGpt(const std::string& path);

// Writes `tensors` (nn::Gpt's, e.g. a checkpoint's) as HuggingFace's GPT2LMHeadModel saves them:
// into the directory `out` (created if missing; its parent must exist) model.safetensors (F32, names
// "transformer.…", Conv1D layouts, metadata {"format": "pt", "cohort_model": spec} and `extra`'s keys,
// e.g. "cohort_tokenizer_digest") and config.json; or, where `out` ends in ".safetensors", that file
// alone. Each file is written atomically. InvalidArgument for a model without biases
// (GptOptions::bias false; also writeLlmcGpt): GPT-2's layouts hold them.
void writeHuggingFaceGpt(const std::string& out, const GptOptions& options, const std::vector<NamedTensor>& tensors,
                         const Metadata& extra = {});

// Writes llm.c's model file: version 3 (fp32) or, for dtype kBF16, 5 (bf16, rounded to nearest
// even); V = the model's real vocabulary (GptOptions::predictedVocab), Vp = its table rounded up to
// a multiple of 128 with zero rows. Atomic.
void writeLlmcGpt(const std::string& path, const GptOptions& options, const std::vector<NamedTensor>& tensors,
                  runtime::DType dtype = runtime::DType::kF32);

}  // namespace cohort::nn
