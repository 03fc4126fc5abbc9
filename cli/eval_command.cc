#include "cli/eval_command.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <span>
#include <string_view>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/flag_values.h"    // kDataForms
#include "cli/hellaswag.h"      // --task hellaswag
#include "nn/checkpoint.h"      // the checkpoint file
#include "nn/gpt.h"             // --task: the model's vocabulary
#include "nn/tokenizer.h"       // --task: --tokenizer encodes the text
#include "nn/loss.h"            // losses
#include "nn/model_weights.h"   // --checkpoint: Cohort's, HuggingFace's or llm.c's
#include "runtime/cpu/blas.h"   // --threads
#include "runtime/data/dataset.h"
#include "runtime/error.h"
#include "runtime/output_file.h"
#include "runtime/world_info.h"
#include "train/evaluate.h"     // evaluate; sumOverRanks for --task under cohortrun

namespace cohort::cli {

namespace data = runtime::data;

void addEvalFlags(CLI::App& c, EvalFlags& f, bool predict) {
  c.add_option("--checkpoint", f.checkpoint, "a checkpoint written by cohort train (its model spec is read from it)")
      ->required();
  c.add_option("--model", f.model,
               "model spec to apply the weights with, as cohort train's --model; it must fit them (default: the "
               "checkpoint's own)");
  c.add_option("--data", f.data, std::string("data: ") + kDataForms)
      ->capture_default_str();
  c.add_option("--split", f.split, "test | train: which split of --data (a CSV file is one split)")->capture_default_str();
  if (predict) {
    c.add_option("--output", f.output, "the CSV file of predictions to write")->required();
    c.add_option("--top-k", f.topK,
                 "write the K most likely classes (a gpt: next tokens after each window) and their probabilities, "
                 "best first, instead of all; 0: all")
        ->capture_default_str();
    c.add_option("--tokenizer", f.tokenizer,
                 "with --top-k on a gpt: GPT-2's tokenizer, FILE or DIR (as cohort generate's), to write each "
                 "token's text beside its id");
  }
  c.add_option("--batch-size", f.batchSize,
               "samples per forward pass (a gpt's: at most 4096 positions' worth, as training's evaluation)")
      ->capture_default_str();
  c.add_option("--threads", f.threads, "BLAS threads")->capture_default_str();
  if (predict) return;
  c.add_option("--task", f.task,
               "hellaswag: score FILE (HellaSwag's jsonl: ctx, endings, label a line) as llm.c does, acc and "
               "acc_norm, instead of --data");
  c.add_option("file", f.taskFile, "--task's file (FILE.jsonl)");
  c.add_option("--metrics", f.metrics, "--task: also write the figures to this file, one JSON line");
  c.add_option("--tokenizer", f.tokenizer,
               std::string(kTokenizerForms) + ": encodes --task's text (a byte model without one: its bytes)");
}

namespace {

// A trained model, the data it is applied to and the loss it was trained with.
struct Applied {
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<data::Dataset> data;
  std::unique_ptr<nn::Loss> loss;
  bool classification = true;
};

// The seed that placed a text dataset's train windows (the loader's); 0 for checkpoints without one.
uint64_t loaderSeed(const nn::Metadata& metadata) {
  auto seed = metadata.find("loader_seed");
  return seed == metadata.end() ? 0 : std::stoull(seed->second);
}

Applied open(const EvalFlags& f, const char* command) {
  if (f.split != "test" && f.split != "train") {
    COHORT_THROW(InvalidArgument) << "unknown --split '" << f.split << "': expected test or train";
  }
  if (f.batchSize <= 0) COHORT_THROW(InvalidArgument) << "--batch-size must be positive, got " << f.batchSize;
  runtime::cpu::setBlasThreads(f.threads);
  // A Cohort checkpoint, or another tool's GPT-2 (nn/model_weights.h): GPT-2 on your data.
  const nn::ModelWeights weights = nn::readModelWeights(f.checkpoint);
  const nn::Metadata& metadata = weights.metadata;
  Applied a;
  a.model = nn::modelOf(weights, f.model);
  if (weights.headsAssumed && f.model.empty()) {
    std::fprintf(stderr, "cohort %s: %s; give --model to say otherwise\n", command, nn::describeWeights(weights).c_str());
  }
  const bool csv = f.data.rfind("csv:", 0) == 0;
  a.data = data::openDataset(f.data, csv || f.split == "train" ? data::Split::kTrain : data::Split::kTest,
                             train::datasetHints(*a.model, loaderSeed(metadata)));
  // Checkpoints from before the task was recorded: classification when the data has classes.
  auto task = metadata.find("task");
  a.classification = task != metadata.end() ? task->second == "classification" : a.data->numClasses() > 0;
  const nn::Model& m = *a.model;
  if (a.data->sampleShape().numel() != m.sampleShape.numel()) {
    COHORT_THROW(InvalidArgument) << "model " << m.name << " (from " << f.checkpoint << ") takes samples of "
                                  << m.sampleShape.str() << ", but " << a.data->name() << " has "
                                  << a.data->sampleShape().str();
  }
  if (a.classification && (a.data->numClasses() == 0 || a.data->numClasses() > m.outputs)) {
    COHORT_THROW(InvalidArgument) << a.data->name() << " has " << a.data->numClasses() << " classes, but model " << m.name
                                  << " (a classifier, from " << f.checkpoint << ") has " << m.outputs << " outputs";
  }
  if (!a.classification && a.data->targetShape().numel() != m.outputs) {
    COHORT_THROW(InvalidArgument) << a.data->name() << " has " << a.data->targetShape().numel()
                                  << " target values per sample, but model " << m.name << " (from " << f.checkpoint
                                  << ") has " << m.outputs << " outputs";
  }
  a.loss = nn::makeLoss(a.classification ? nn::LossKind::kCrossEntropy : nn::LossKind::kMse);
  return a;
}

// Each rank's share of n items: [n·r/W, n·(r+1)/W).
std::pair<size_t, size_t> shareOf(size_t n, const runtime::WorldInfo& world) {
  const size_t r = static_cast<size_t>(world.rank), w = static_cast<size_t>(world.worldSize);
  return {n * r / w, n * (r + 1) / w};
}

// The ranks' counts summed (each scored its share).
HellaSwagCounts sumOverRanks(const HellaSwagCounts& mine, const runtime::WorldInfo& world) {
  const int64_t counts[3] = {mine.items, mine.correct, mine.correctNorm};
  const std::vector<int64_t> all = train::sumOverRanks(counts, world, std::chrono::seconds(300));
  return {.items = all[0], .correct = all[1], .correctNorm = all[2]};
}

// --metrics: the figures as one JSON line, written as every output is (runtime/output_file.h).
void writeTaskMetrics(const std::string& path, const HellaSwagCounts& c) {
  const double n = static_cast<double>(c.items);
  auto shortest = [](double v) {  // the shortest text that reads back as v
    char text[32];
    return std::string(text, std::to_chars(text, text + sizeof text, v).ptr);
  };
  std::ostringstream line;
  line << "{\"task\":\"hellaswag\",\"items\":" << c.items << ",\"acc\":" << shortest(c.correct / n)
       << ",\"acc_norm\":" << shortest(c.correctNorm / n) << ",\"correct\":" << c.correct
       << ",\"correct_norm\":" << c.correctNorm << "}\n";
  runtime::OutputFile file(path, {.mode = runtime::OutputMode::kUserVisible});
  const std::string text = line.str();
  file.write(text.data(), text.size());
  file.commit();
}

int runHellaSwag(const EvalFlags& f) {
  if (f.task != "hellaswag") COHORT_THROW(InvalidArgument) << "unknown --task '" << f.task << "': expected hellaswag";
  if (f.taskFile.empty())
    COHORT_THROW(InvalidArgument) << "--task hellaswag needs its file: cohort eval --task hellaswag FILE.jsonl";
  const runtime::WorldInfo world = runtime::WorldInfo::detect();
  runtime::cpu::setBlasThreads(f.threads);
  if (!f.metrics.empty() && world.rank == 0) nn::checkOutputFile(f.metrics, "metrics");  // before the scoring
  const nn::ModelWeights weights = nn::readModelWeights(f.checkpoint);
  std::unique_ptr<nn::Model> model = nn::modelOf(weights, f.model);
  if (weights.headsAssumed && f.model.empty() && world.rank == 0) {
    std::fprintf(stderr, "cohort eval: %s; give --model to say otherwise\n", nn::describeWeights(weights).c_str());
  }
  const auto* gpt = dynamic_cast<const nn::Gpt*>(model->net.get());
  if (gpt == nullptr) {
    COHORT_THROW(InvalidArgument) << f.checkpoint << " holds model " << model->name
                                  << ", but --task hellaswag needs a gpt: model (trained with --model gpt:...)";
  }
  HellaSwagOptions options{.path = f.taskFile};
  Encode encode;
  std::optional<nn::Tokenizer> tokenizer;
  if (!f.tokenizer.empty()) {
    tokenizer = nn::Tokenizer::read(f.tokenizer);
    options.scoredVocab = tokenizer->size();
    encode = [&](std::string_view text) { return tokenizer->encode(text); };
  } else if (gpt->options().vocab <= 256) {
    // The bytes, 0..255 (a signed char would make them negative).
    encode = [](std::string_view text) {
      return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                                  reinterpret_cast<const unsigned char*>(text.data()) + text.size());
    };
  } else {
    COHORT_THROW(InvalidArgument) << "model " << model->name << " has a vocabulary of " << gpt->options().vocab
                                  << " tokens, not bytes: give --tokenizer to encode the task's text";
  }
  const std::vector<HellaSwagItem> items = readHellaSwag(f.taskFile, encode);
  checkHellaSwag(*model, items, options);  // every rank refuses a bad file alike, before any collective
  const auto [first, last] = shareOf(items.size(), world);
  const HellaSwagCounts mine = scoreHellaSwag(*model, std::span(items).subspan(first, last - first), options);
  const HellaSwagCounts all = sumOverRanks(mine, world);
  if (all.items != static_cast<int64_t>(items.size())) {
    COHORT_THROW(InvalidArgument) << "the ranks scored " << all.items << " HellaSwag items in all, and " << f.taskFile
                                  << " holds " << items.size() << " here: give every rank the same file";
  }
  if (world.rank == 0) {
    if (!f.metrics.empty()) writeTaskMetrics(f.metrics, all);
    const double n = static_cast<double>(all.items);
    std::printf("RESULT hellaswag model=%s items=%lld acc=%.4f acc_norm=%.4f correct=%lld correct_norm=%lld\n",
                model->name.c_str(), static_cast<long long>(all.items), all.correct / n, all.correctNorm / n,
                static_cast<long long>(all.correct), static_cast<long long>(all.correctNorm));
  }
  return 0;
}

}  // namespace

int runEval(const EvalFlags& f) {
  if (!f.task.empty() || !f.taskFile.empty()) {
    if (f.task.empty()) COHORT_THROW(InvalidArgument) << "a file (" << f.taskFile << ") is for --task hellaswag";
    return runHellaSwag(f);
  }
  Applied a = open(f, "eval");
  const train::Evaluation e = train::evaluate(*a.model, *a.loss, *a.data, train::evaluationChunk(*a.model, f.batchSize));
  // The same figures, formatted as cohort train's RESULT line formats them.
  std::ostringstream os;
  os << "RESULT eval model=" << a.model->name << " data=" << a.data->name() << " samples=" << a.data->size()
     << " test_loss=" << e.loss;
  if (a.loss->positions() > 1) os << " test_ppl=" << std::exp(e.loss);  // a language model's loss is per token
  if (a.classification) os << " test_acc=" << e.accuracy;
  std::printf("%s\n", os.str().c_str());
  return 0;
}

namespace {

// A text field of a CSV row: quoted, its quotes doubled (RFC 4180).
std::string csvText(const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

// predict's rows: each sample's outputs as probabilities (all, or the top K) or as values.
class PredictionRows {
 public:
  PredictionRows(const EvalFlags& f, const Applied& a) : k_(a.model->outputs), classification_(a.classification) {
    if (f.topK < 0) COHORT_THROW(InvalidArgument) << "--top-k must be 0 (all classes) or positive, got " << f.topK;
    if (f.topK > 0 && !classification_) {
      COHORT_THROW(InvalidArgument) << "--top-k needs a classifier or a language model; model " << a.model->name
                                    << " is a regression";
    }
    if (!f.tokenizer.empty() && f.topK == 0) COHORT_THROW(InvalidArgument) << "--tokenizer is for --top-k K";
    topK_ = std::min(f.topK, k_);
    if (!f.tokenizer.empty()) tokenizer_ = nn::Tokenizer::read(f.tokenizer);
  }

  std::string header() const {
    std::ostringstream out;
    if (topK_ > 0) {
      for (int64_t r = 1; r <= topK_; ++r) {
        out << (r > 1 ? "," : "") << "id" << r << ",p" << r << (tokenizer_ ? ",text" + std::to_string(r) : "");
      }
    } else {
      for (int64_t c = 0; c < k_; ++c) out << (c ? "," : "") << (classification_ ? "p" : "y") << c;
      if (classification_) out << ",predicted";
    }
    return out.str() + "\n";
  }

  void write(std::ostream& out, const float* row) {
    if (!classification_) {
      for (int64_t c = 0; c < k_; ++c) out << (c ? "," : "") << row[c];
      out << '\n';
      return;
    }
    // Softmax in double, the row maximum subtracted; the first maximum is the prediction (as the
    // loss counts accuracy).
    int64_t best = 0;
    for (int64_t c = 1; c < k_; ++c) best = row[c] > row[best] ? c : best;
    p_.resize(k_);
    double sum = 0;
    for (int64_t c = 0; c < k_; ++c) sum += p_[c] = std::exp(static_cast<double>(row[c]) - row[best]);
    for (double& p : p_) p /= sum;
    if (topK_ == 0) {
      for (int64_t c = 0; c < k_; ++c) out << (c ? "," : "") << p_[c];
      out << ',' << best << '\n';
      return;
    }
    // The K most likely, best first; ties to the lower id (stable), so the first is the prediction.
    order_.resize(k_);
    for (int64_t c = 0; c < k_; ++c) order_[c] = c;
    std::partial_sort(order_.begin(), order_.begin() + topK_, order_.end(),
                      [&](int64_t x, int64_t y) { return p_[x] > p_[y] || (p_[x] == p_[y] && x < y); });
    for (int64_t r = 0; r < topK_; ++r) {
      const int64_t id = order_[r];
      out << (r ? "," : "") << id << ',' << p_[id];
      if (tokenizer_) out << ',' << csvText(tokenizer_->decode(static_cast<int32_t>(id)));
    }
    out << '\n';
  }

 private:
  int64_t k_;
  bool classification_;
  int64_t topK_ = 0;
  std::optional<nn::Tokenizer> tokenizer_;
  std::vector<double> p_;
  std::vector<int64_t> order_;
};

}  // namespace

int runPredict(const EvalFlags& f) {
  Applied a = open(f, "predict");
  PredictionRows rows(f, a);
  // Written as every output is (runtime/output_file.h): a fresh temporary, renamed over --output.
  runtime::OutputFile file(f.output, {.mode = runtime::OutputMode::kUserVisible});
  {
    std::ostringstream out;
    auto drain = [&] {  // every write checked by OutputFile
      const std::string text = out.str();
      file.write(text.data(), text.size());
      out.str({});
    };
    out << rows.header();
    out.precision(9);
    nn::Pass pass;
    pass.training = false;
    pass.needInputGrad = false;
    const int64_t n = a.data->size(), chunk = train::evaluationChunk(*a.model, f.batchSize), k = a.model->outputs;
    for (int64_t first = 0; first < n; first += chunk) {
      const int64_t count = std::min(chunk, n - first);
      const runtime::Tensor& y = a.model->forward(a.data->rows(first, count).inputs, pass);
      // A language model's outputs are [samples, positions, k]: a window's row is its last position's.
      const int64_t positions = y.rank() == 3 ? y.dim(1) : 1;
      for (int64_t i = 0; i < count; ++i) rows.write(out, y.data() + ((i + 1) * positions - 1) * k);
      drain();
    }
    drain();
  }
  file.commit();
  std::printf("RESULT predict model=%s data=%s samples=%lld output=%s\n", a.model->name.c_str(), a.data->name().c_str(),
              static_cast<long long>(a.data->size()), f.output.c_str());
  return 0;
}

}  // namespace cohort::cli
