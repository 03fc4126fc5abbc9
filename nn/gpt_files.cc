#include "nn/gpt_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <system_error>

#include "nn/model_spec.h"
#include "runtime/error.h"
#include "runtime/printable.h"
#include "runtime/unique_fd.h"

namespace cohort::nn {

namespace {

using runtime::Shape;
using runtime::Tensor;

// A tensor of a transformer block, sized in multiples of the width C: [out·C, in·C], or [out·C]
// where in is 0. conv1d: stored [in, out] by HuggingFace. In llm.c's order (that of nn::Gpt too).
struct BlockTensor {
  const char* name;
  int64_t out, in;
  bool conv1d;
};
constexpr BlockTensor kBlock[] = {
    {"ln_1.weight", 1, 0, false},       {"ln_1.bias", 1, 0, false},        {"attn.c_attn.weight", 3, 1, true},
    {"attn.c_attn.bias", 3, 0, false},  {"attn.c_proj.weight", 1, 1, true}, {"attn.c_proj.bias", 1, 0, false},
    {"ln_2.weight", 1, 0, false},       {"ln_2.bias", 1, 0, false},        {"mlp.c_fc.weight", 4, 1, true},
    {"mlp.c_fc.bias", 4, 0, false},     {"mlp.c_proj.weight", 1, 4, true}, {"mlp.c_proj.bias", 1, 0, false},
};
constexpr int64_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

Shape blockShape(const BlockTensor& b, int64_t c) { return b.in ? Shape{b.out * c, b.in * c} : Shape{b.out * c}; }
std::string blockName(int64_t layer, const BlockTensor& b) { return "transformer.h." + std::to_string(layer) + "." + b.name; }

// A one-line IoError "<path>: <problem>".
#define REFUSE(path) COHORT_THROW(IoError) << (path) << ": "

// Text from a file (a tensor name, a config value) as a message may quote it: escapes and invalid
// UTF-8 written as \xNN, cut to 120 bytes (issue 44: escape codes cleared the screen, and one
// message was 200 KB).
std::string shown(const std::string& text) { return runtime::printable(text, 120); }

Tensor transposed(const Tensor& t) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  Tensor out = Tensor::empty(Shape{cols, rows}, runtime::cpuAllocator());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out.at(c * rows + r) = t.at(r * cols + c);
  }
  return out;
}

// nn::Gpt's tensor `name`, which must have `shape` (InvalidArgument otherwise: a caller's mistake).
const Tensor& gptTensor(const std::vector<NamedTensor>& tensors, const std::string& name, const Shape& shape) {
  for (const NamedTensor& t : tensors) {
    if (t.name != name) continue;
    if (t.tensor.shape() != shape) {
      COHORT_THROW(InvalidArgument) << "tensor '" << name << "' is " << t.tensor.shape().str() << ", the GPT needs " << shape.str();
    }
    return t.tensor;
  }
  COHORT_THROW(InvalidArgument) << "the weights have no tensor '" << name << "': not those of a gpt: model";
}

bool isDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string directoryOf(const std::string& file) {
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? "." : file.substr(0, slash == 0 ? 1 : slash);
}

// ---------------------------------------------------------------------------------------------
// HuggingFace

// The tensors by their names without "transformer.", the attention's mask buffers dropped.
std::map<std::string, const Tensor*> huggingFaceNames(const Checkpoint& file, const std::string& path) {
  std::map<std::string, const Tensor*> out;
  for (const NamedTensor& t : file.tensors) {
    const std::string name = t.name.starts_with("transformer.") ? t.name.substr(12) : t.name;
    if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) continue;
    if (!out.emplace(name, &t.tensor).second) {
      REFUSE(path) << "holds '" << shown(name) << "' twice (with and without 'transformer.')";
    }
  }
  return out;
}

const Tensor& need(const std::map<std::string, const Tensor*>& named, const std::string& name, const Shape& shape,
                   const std::string& path) {
  auto it = named.find(name);
  if (it == named.end()) REFUSE(path) << "has no tensor '" << name << "' (a HuggingFace GPT-2 has one)";
  if (it->second->shape() != shape) {
    REFUSE(path) << "tensor '" << name << "' is " << it->second->shape().str() << ", a GPT-2 of these sizes needs " << shape.str();
  }
  return *it->second;
}

// config.json's number of heads, after checking that its other sizes and choices are those of the
// weights and of nn::Gpt. 0 where there is no config.json. Every refusal names config.json and the
// field (issue 44: a directory was exit 1, n_head 0 and a wrong n_inner were ignored).
int64_t headsFromConfig(const std::string& dir, const GptOptions& o) {
  const std::string path = dir + "/config.json";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return 0;
    REFUSE(path) << "cannot open: " << std::strerror(errno);
  }
  if (!S_ISREG(st.st_mode)) REFUSE(path) << (S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file") << ", not HuggingFace's config";
  std::ifstream in(path);
  if (!in) REFUSE(path) << "cannot open: " << std::strerror(errno);
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    REFUSE(path) << "not valid JSON: " << shown(e.what());
  }
  if (!config.is_object() || !config.contains("n_head") || !config["n_head"].is_number_integer()) {
    REFUSE(path) << "has no integer \"n_head\"";
  }
  auto agree = [&](const char* key, int64_t value) {
    if (config.contains(key) && (!config[key].is_number_integer() || config[key].get<int64_t>() != value)) {
      REFUSE(path) << "\"" << key << "\" is " << shown(config[key].dump()) << ", but the weights say " << value;
    }
  };
  agree("n_embd", o.dim);
  agree("n_layer", o.layers);
  agree("vocab_size", o.vocab);
  agree("n_positions", o.context);
  if (config.contains("n_inner") && !config["n_inner"].is_null()) agree("n_inner", 4 * o.dim);  // null: 4 × n_embd
  const int64_t heads = config["n_head"].get<int64_t>();
  if (heads < 1 || o.dim % heads != 0) {
    REFUSE(path) << "\"n_head\" is " << heads << ", which does not divide the width " << o.dim << " of the weights";
  }
  const std::string activation = config.value("activation_function", std::string("gelu_new"));
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh" && activation != "gelu_fast") {
    REFUSE(path) << "\"activation_function\" is \"" << shown(activation) << "\"; Cohort's GPT uses GPT-2's tanh GELU (gelu_new)";
  }
  if (std::abs(config.value("layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12) {
    REFUSE(path) << "\"layer_norm_epsilon\" is " << shown(config["layer_norm_epsilon"].dump()) << "; Cohort's GPT uses 1e-05";
  }
  if (!config.value("scale_attn_weights", true) || config.value("scale_attn_by_inverse_layer_idx", false)) {
    REFUSE(path) << "scales the attention otherwise than GPT-2 (scale_attn_weights, scale_attn_by_inverse_layer_idx)";
  }
  return heads;
}

// The heads: config.json's, else the spec writeHuggingFaceGpt left in the metadata, else width / 64.
void setHeads(GptFile& out, const std::string& file, const Metadata& metadata) {
  out.options.heads = headsFromConfig(directoryOf(file), out.options);
  if (out.options.heads > 0) return;
  auto spec = metadata.find("cohort_model");
  if (spec != metadata.end()) {
    auto model = modelOfMetadata(spec->second, file, "cohort_model");
    if (const auto* gpt = dynamic_cast<const Gpt*>(model->net.get())) out.options.heads = gpt->options().heads;
  }
  if (out.options.heads > 0) return;
  out.headsAssumed = true;
  out.options.heads = out.options.dim % 64 == 0 ? out.options.dim / 64 : 0;
}

}  // namespace

std::unique_ptr<Model> modelOfMetadata(const std::string& spec, const std::string& file, const std::string& key) {
  try {
    return buildModel(spec);
  } catch (const InvalidArgument&) {
    REFUSE(file) << "its metadata \"" << key << "\" is '" << shown(spec) << "', not a model spec Cohort builds";
  }
}

GptFile readHuggingFaceGpt(const std::string& path) {
  const std::string file = isDirectory(path) ? path + "/model.safetensors" : path;
  return huggingFaceGpt(readSafetensors(file), file);
}

GptFile huggingFaceGpt(const Checkpoint& st, const std::string& file) {
  auto named = huggingFaceNames(st, file);
  GptFile out;
  out.format = "HuggingFace safetensors";
  auto wte = named.find("wte.weight"), wpe = named.find("wpe.weight");
  if (wte == named.end() || wte->second->rank() != 2) REFUSE(file) << "has no 2-d tensor 'wte.weight': not a HuggingFace GPT-2";
  if (wpe == named.end() || wpe->second->rank() != 2) REFUSE(file) << "has no 2-d tensor 'wpe.weight': not a HuggingFace GPT-2";
  const int64_t c = wte->second->dim(1);
  GptOptions& o = out.options;
  o.vocab = wte->second->dim(0);
  o.dim = c;
  o.context = wpe->second->dim(0);
  o.layers = 0;
  while (named.count("h." + std::to_string(o.layers) + ".ln_1.weight")) ++o.layers;
  if (o.layers == 0) REFUSE(file) << "has no transformer block ('h.0.ln_1.weight')";
  std::set<std::string> used{"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
  out.tensors.push_back({"transformer.wte.weight", need(named, "wte.weight", Shape{o.vocab, c}, file)});
  out.tensors.push_back({"transformer.wpe.weight", need(named, "wpe.weight", Shape{o.context, c}, file)});
  for (int64_t l = 0; l < o.layers; ++l) {
    for (const BlockTensor& b : kBlock) {
      const std::string name = "h." + std::to_string(l) + "." + b.name;
      const Shape shape = blockShape(b, c);
      const Tensor& t = need(named, name, b.conv1d ? Shape{shape[1], shape[0]} : shape, file);
      out.tensors.push_back({blockName(l, b), b.conv1d ? transposed(t) : t});
      used.insert(name);
    }
  }
  out.tensors.push_back({"transformer.ln_f.weight", need(named, "ln_f.weight", Shape{c}, file)});
  out.tensors.push_back({"transformer.ln_f.bias", need(named, "ln_f.bias", Shape{c}, file)});
  if (auto head = named.find("lm_head.weight"); head != named.end()) {
    const Tensor& w = *wte->second;
    if (head->second->shape() != w.shape() || std::memcmp(head->second->data(), w.data(), w.bytes()) != 0) {
      REFUSE(file) << "its head 'lm_head.weight' differs from 'wte.weight': Cohort's GPT ties them, as GPT-2 does";
    }
    used.insert("lm_head.weight");
  }
  for (const auto& [name, tensor] : named) {
    if (!used.count(name)) REFUSE(file) << "tensor '" << shown(name) << "' is not part of a GPT-2 of " << o.layers << " layers";
  }
  setHeads(out, file, st.metadata);
  return out;
}

// ---------------------------------------------------------------------------------------------
// llm.c

namespace {

// Reads llm.c's parameters, one tensor at a time, from a file at `offset`.
class LlmcReader {
 public:
  LlmcReader(const std::string& path, int fd, bool bf16) : path_(path), fd_(fd), bf16_(bf16) {}

  Tensor next(const Shape& shape) {
    Tensor t = Tensor::empty(shape, runtime::cpuAllocator());
    const size_t n = static_cast<size_t>(t.numel());
    if (!bf16_) {
      read(t.data(), n * sizeof(float));
      return t;
    }
    std::vector<uint16_t> bits(n);
    read(bits.data(), n * sizeof(uint16_t));
    for (size_t i = 0; i < n; ++i) t.data()[i] = runtime::toFloat(runtime::Bf16{bits[i]});
    return t;
  }

 private:
  void read(void* into, size_t bytes) {
    runtime::readFullyAt(fd_, into, bytes, offset_, path_);
    offset_ += bytes;
  }

  std::string path_;
  int fd_;
  bool bf16_;
  uint64_t offset_ = kHeaderBytes;
};

// The bytes of the parameters an llm.c file of these sizes holds (Vp rows of wte, `bytesEach` a
// number), or false where that is past 2^64: the header's sizes are up to 2^31 each, so their
// products wrap (issue 44: sizes whose byte count wrapped to exactly the file's passed the length
// check, and the reader then asked for exabytes: exit 5, "out of memory").
bool llmcParameterBytes(const GptOptions& o, int64_t paddedVocab, uint64_t bytesEach, uint64_t* bytes) {
  const auto c = static_cast<uint64_t>(o.dim);
  bool wraps = false;
  auto mul = [&](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    wraps |= __builtin_mul_overflow(a, b, &r);
    return r;
  };
  auto add = [&](uint64_t a, uint64_t b) {
    uint64_t r = 0;
    wraps |= __builtin_add_overflow(a, b, &r);
    return r;
  };
  uint64_t perLayer = 0;  // Σ out·C · in·C (or out·C): 12C² + 13C
  for (const BlockTensor& b : kBlock) perLayer = add(perLayer, b.in ? mul(mul(b.out, c), mul(b.in, c)) : mul(b.out, c));
  uint64_t n = add(mul(static_cast<uint64_t>(paddedVocab), c), mul(static_cast<uint64_t>(o.context), c));
  n = add(add(n, mul(static_cast<uint64_t>(o.layers), perLayer)), mul(2, c));
  *bytes = mul(n, bytesEach);
  return !wraps;
}

}  // namespace

bool isLlmcModelFile(const std::string& path) {
  runtime::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  int32_t magic = 0;
  return fd && ::pread(fd.get(), &magic, sizeof magic, 0) == sizeof magic && magic == kLlmcModelMagic;
}

GptFile readLlmcGpt(const std::string& path) {
  runtime::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) REFUSE(path) << "cannot open: " << std::strerror(errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) REFUSE(path) << "not a regular file";
  const auto size = static_cast<uint64_t>(st.st_size);
  int32_t h[kHeaderInts] = {};
  if (size < kHeaderBytes || ::pread(fd.get(), h, kHeaderBytes, 0) != static_cast<ssize_t>(kHeaderBytes)) {
    REFUSE(path) << "is " << size << " bytes, shorter than llm.c's header of " << kHeaderBytes;
  }
  if (h[0] != kLlmcModelMagic) REFUSE(path) << "not an llm.c model file: magic " << h[0] << " at byte 0 (expected " << kLlmcModelMagic << ")";
  if (h[1] != 3 && h[1] != 5) REFUSE(path) << "llm.c model version " << h[1] << " at byte 4 (3, fp32, and 5, bf16, are read)";
  const char* names[] = {"max T", "vocabulary", "layers", "heads", "channels", "padded vocabulary"};
  for (int i = 2; i < 8; ++i) {
    if (h[i] < 1) REFUSE(path) << "header int " << i << " (" << names[i - 2] << ") is " << h[i] << ", not positive";
  }
  GptFile out;
  out.options = {.vocab = h[3], .layers = h[4], .heads = h[5], .dim = h[6], .context = h[2]};
  const int64_t paddedVocab = h[7], c = h[6];
  if (paddedVocab < h[3]) REFUSE(path) << "padded vocabulary " << paddedVocab << " is below the vocabulary " << h[3];
  if (c % h[5] != 0) REFUSE(path) << h[6] << " channels are not divisible by " << h[5] << " heads";
  const bool bf16 = h[1] == 5;
  out.format = bf16 ? "llm.c (bf16)" : "llm.c (fp32)";
  uint64_t parameterBytes = 0;
  if (!llmcParameterBytes(out.options, paddedVocab, bf16 ? 2 : 4, &parameterBytes) ||
      parameterBytes > UINT64_MAX - kHeaderBytes) {
    REFUSE(path) << "its header's sizes (" << gptSpec(out.options) << ", padded vocabulary " << paddedVocab
                 << ") make a model of more than 2^64 bytes: not an llm.c model file, or a damaged header";
  }
  const uint64_t want = kHeaderBytes + parameterBytes;
  if (size != want) {
    REFUSE(path) << "is " << size << " bytes, but an llm.c " << (bf16 ? "bf16" : "fp32") << " model of these sizes ("
                 << gptSpec(out.options) << ", padded vocabulary " << paddedVocab << ") is " << want;
  }
  LlmcReader reader(path, fd.get(), bf16);
  out.tensors.push_back({"transformer.wte.weight", reader.next(Shape{paddedVocab, c})});
  out.tensors.push_back({"transformer.wpe.weight", reader.next(Shape{out.options.context, c})});
  std::vector<NamedTensor> blocks(static_cast<size_t>(out.options.layers) * std::size(kBlock));
  for (size_t k = 0; k < std::size(kBlock); ++k) {
    for (int64_t l = 0; l < out.options.layers; ++l) {
      blocks[static_cast<size_t>(l) * std::size(kBlock) + k] = {blockName(l, kBlock[k]), reader.next(blockShape(kBlock[k], c))};
    }
  }
  for (NamedTensor& t : blocks) out.tensors.push_back(std::move(t));
  out.tensors.push_back({"transformer.ln_f.weight", reader.next(Shape{c})});
  out.tensors.push_back({"transformer.ln_f.bias", reader.next(Shape{c})});
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writing

std::string gptSpec(const GptOptions& o) {
  std::string spec = "gpt:layers=" + std::to_string(o.layers) + ",heads=" + std::to_string(o.heads) +
                     ",dim=" + std::to_string(o.dim) + ",ctx=" + std::to_string(o.context) +
                     ",vocab=" + std::to_string(o.predictedVocab());
  if (o.predictedVocab() != o.vocab) spec += ",padded_vocab=" + std::to_string(o.vocab);
  if (!o.bias) spec += ",bias=false";
  return spec;
}

namespace {

// GPT-2's files (HuggingFace's, llm.c's) hold every bias: a model without them has none to write.
void requireBiases(const std::string& out, const GptOptions& o, const char* format) {
  if (!o.bias) {
    COHORT_THROW(InvalidArgument) << out << ": " << gptSpec(o) << " has no biases (bias=false), and " << format
                                  << "'s GPT-2 layout needs them; keep its Cohort checkpoint (safetensors, nanoGPT's "
                                     "names) instead";
  }
}

std::string configJson(const GptOptions& o) {
  nlohmann::ordered_json config = {{"architectures", {"GPT2LMHeadModel"}},
                                   {"model_type", "gpt2"},
                                   {"vocab_size", o.vocab},
                                   {"n_positions", o.context},
                                   {"n_ctx", o.context},
                                   {"n_embd", o.dim},
                                   {"n_layer", o.layers},
                                   {"n_head", o.heads},
                                   {"n_inner", nullptr},
                                   {"activation_function", "gelu_new"},
                                   {"layer_norm_epsilon", 1e-5},
                                   {"initializer_range", 0.02},
                                   {"resid_pdrop", 0.0},
                                   {"embd_pdrop", 0.0},
                                   {"attn_pdrop", 0.0},
                                   {"scale_attn_weights", true},
                                   {"tie_word_embeddings", true},
                                   {"torch_dtype", "float32"}};
  if (o.vocab >= 50257) config["bos_token_id"] = config["eos_token_id"] = 50256;  // GPT-2's <|endoftext|>
  return config.dump(2) + "\n";
}

}  // namespace

void writeHuggingFaceGpt(const std::string& out, const GptOptions& o, const std::vector<NamedTensor>& tensors,
                         const Metadata& extra) {
  requireBiases(out, o, "HuggingFace");
  std::vector<NamedTensor> hf;
  const int64_t c = o.dim;
  hf.push_back({"transformer.wte.weight", gptTensor(tensors, "transformer.wte.weight", Shape{o.vocab, c})});
  hf.push_back({"transformer.wpe.weight", gptTensor(tensors, "transformer.wpe.weight", Shape{o.context, c})});
  for (int64_t l = 0; l < o.layers; ++l) {
    for (const BlockTensor& b : kBlock) {
      const Tensor& t = gptTensor(tensors, blockName(l, b), blockShape(b, c));
      hf.push_back({blockName(l, b), b.conv1d ? transposed(t) : t});
    }
  }
  hf.push_back({"transformer.ln_f.weight", gptTensor(tensors, "transformer.ln_f.weight", Shape{c})});
  hf.push_back({"transformer.ln_f.bias", gptTensor(tensors, "transformer.ln_f.bias", Shape{c})});
  Metadata metadata{{"format", "pt"}, {"cohort_model", gptSpec(o)}};
  metadata.insert(extra.begin(), extra.end());
  if (out.ends_with(".safetensors")) return writeSafetensors(out, hf, metadata);
  if (::mkdir(out.c_str(), 0755) != 0 && !(errno == EEXIST && isDirectory(out))) {
    COHORT_THROW(IoError) << out << ": cannot create the directory: " << std::strerror(errno);
  }
  writeSafetensors(out + "/model.safetensors", hf, metadata);
  const std::string config = configJson(o);
  writeFileAtomically(out + "/config.json", {std::as_bytes(std::span(config))});
}

void writeLlmcGpt(const std::string& path, const GptOptions& o, const std::vector<NamedTensor>& tensors,
                  runtime::DType dtype) {
  requireBiases(path, o, "llm.c");
  const int64_t c = o.dim, paddedVocab = (o.vocab + 127) / 128 * 128;
  const bool bf16 = dtype == runtime::DType::kBF16;
  std::vector<int32_t> header(kHeaderInts, 0);
  // A padded model's real vocabulary is llm.c's vocab_size; its table (and zeros to a multiple of
  // 128) the padded one.
  const int64_t sizes[] = {kLlmcModelMagic, bf16 ? 5 : 3, o.context, o.predictedVocab(), o.layers, o.heads, c, paddedVocab};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    if (sizes[i] > INT32_MAX) COHORT_THROW(InvalidArgument) << path << ": " << gptSpec(o) << " is too large for llm.c's header";
    header[i] = static_cast<int32_t>(sizes[i]);
  }
  // In llm.c's order; wte's padding rows are zeros.
  std::vector<const Tensor*> order{&gptTensor(tensors, "transformer.wte.weight", Shape{o.vocab, c})};
  const Tensor padding = Tensor::zeros(Shape{paddedVocab - o.vocab, c});
  order.push_back(&padding);
  order.push_back(&gptTensor(tensors, "transformer.wpe.weight", Shape{o.context, c}));
  for (const BlockTensor& b : kBlock) {
    for (int64_t l = 0; l < o.layers; ++l) order.push_back(&gptTensor(tensors, blockName(l, b), blockShape(b, c)));
  }
  order.push_back(&gptTensor(tensors, "transformer.ln_f.weight", Shape{c}));
  order.push_back(&gptTensor(tensors, "transformer.ln_f.bias", Shape{c}));
  std::vector<std::span<const std::byte>> parts{std::as_bytes(std::span(header))};
  std::vector<uint16_t> bits;
  if (bf16) {
    for (const Tensor* t : order) {
      for (int64_t i = 0; i < t->numel(); ++i) bits.push_back(runtime::toBf16(t->at(i)).bits);
    }
    parts.push_back(std::as_bytes(std::span(bits)));
  } else {
    for (const Tensor* t : order) parts.push_back(std::as_bytes(std::span(t->data(), static_cast<size_t>(t->numel()))));
  }
  writeFileAtomically(path, parts);
}

}  // namespace cohort::nn
