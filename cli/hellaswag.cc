#include "cli/hellaswag.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "nn/gpt.h"
#include "runtime/data/regular_file.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

namespace cohort::cli {

namespace {

using Json = nlohmann::json;

// One line of the file as an item: "FILE:LINE: <problem>" for anything that is not one.
HellaSwagItem parseItem(const std::string& text, const std::string& path, int64_t line, const Encode& encode) {
  const std::string where = path + ":" + std::to_string(line) + ": ";
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) COHORT_THROW(InvalidArgument) << where << "not a JSON object (invalid JSON)";
  if (!j.is_object()) COHORT_THROW(InvalidArgument) << where << "not a JSON object";
  auto ctx = j.find("ctx"), endings = j.find("endings"), label = j.find("label");
  if (ctx == j.end() || !ctx->is_string()) COHORT_THROW(InvalidArgument) << where << "no \"ctx\" string";
  if (endings == j.end() || !endings->is_array() || endings->size() != kHellaSwagEndings ||
      !std::all_of(endings->begin(), endings->end(), [](const Json& e) { return e.is_string(); })) {
    COHORT_THROW(InvalidArgument) << where << "no \"endings\" array of " << kHellaSwagEndings << " strings";
  }
  if (label == j.end() || !label->is_number_integer()) {
    COHORT_THROW(InvalidArgument) << where << "no \"label\" (a whole number 0.." << kHellaSwagEndings - 1 << ")";
  }
  const int64_t l = label->get<int64_t>();
  if (l < 0 || l >= kHellaSwagEndings) {
    COHORT_THROW(InvalidArgument) << where << "label " << l << " is outside 0.." << kHellaSwagEndings - 1;
  }
  HellaSwagItem item{
      .line = line, .label = static_cast<int>(l), .context = encode(ctx->get<std::string>()), .endings = {}};
  for (const Json& e : *endings) item.endings.push_back(encode(" " + e.get<std::string>()));
  return item;
}

// ln Σ exp(logits[0..n)) - logits[target], in double.
double crossEntropy(const float* logits, int64_t n, int64_t target) {
  const float top = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int64_t v = 0; v < n; ++v) sum += std::exp(static_cast<double>(logits[v]) - top);
  return std::log(sum) + top - logits[target];
}

// The rows of one item: context + ending, each cropped to its last `context + 1` tokens.
struct Rows {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int64_t> scoredFrom;  // the first position of each row whose token is scored (>= 1)
};

Rows rowsOf(const HellaSwagItem& item, int64_t context, const std::string& path, const std::string& model) {
  Rows r;
  for (size_t k = 0; k < item.endings.size(); ++k) {
    const std::vector<int32_t>& ending = item.endings[k];
    if (static_cast<int64_t>(ending.size()) > context) {
      COHORT_THROW(InvalidArgument) << path << ":" << item.line << ": ending " << k << " is " << ending.size()
                                    << " tokens, more than the context of model " << model << " (" << context
                                    << " tokens)";
    }
    std::vector<int32_t> row = item.context;
    row.insert(row.end(), ending.begin(), ending.end());
    const int64_t drop = std::max<int64_t>(0, static_cast<int64_t>(row.size()) - (context + 1));
    row.erase(row.begin(), row.begin() + drop);
    // The ending's first token is scored when a token precedes it (an empty ctx leaves it unscored,
    // as llm.c's shifted mask does).
    r.scoredFrom.push_back(std::max<int64_t>(1, static_cast<int64_t>(row.size() - ending.size())));
    r.tokens.push_back(std::move(row));
  }
  return r;
}

// Which ending has the least summed loss, and which the least mean loss: {pred, predNorm}.
std::pair<int, int> predict(nn::Model& model, const Rows& rows, int64_t vocab, int64_t scoredVocab) {
  const int64_t n = static_cast<int64_t>(rows.tokens.size());
  int64_t width = 1;
  for (const auto& row : rows.tokens) width = std::max<int64_t>(width, static_cast<int64_t>(row.size()) - 1);
  // All rows in one batch, each padded after its end with token 0: the attention is causal, so the
  // padding changes no position before it.
  runtime::Tensor input = runtime::Tensor::zeros(runtime::Shape{n, width});
  for (int64_t k = 0; k < n; ++k) {
    const auto& row = rows.tokens[k];
    for (size_t t = 0; t + 1 < row.size(); ++t) input.data()[k * width + t] = static_cast<float>(row[t]);
  }
  nn::Pass pass;
  pass.training = false;
  pass.needInputGrad = false;
  const runtime::Tensor& logits = model.forward(input, pass);
  double best = std::numeric_limits<double>::infinity(), bestNorm = best;
  int pred = 0, predNorm = 0;
  for (int64_t k = 0; k < n; ++k) {
    const auto& row = rows.tokens[k];
    double sum = 0;
    const int64_t count = static_cast<int64_t>(row.size()) - rows.scoredFrom[k];
    for (int64_t p = rows.scoredFrom[k]; p < static_cast<int64_t>(row.size()); ++p) {
      sum += crossEntropy(logits.data() + (k * width + p - 1) * vocab, scoredVocab, row[p]);
    }
    const double mean = sum / static_cast<double>(count);
    if (sum < best) best = sum, pred = static_cast<int>(k);
    if (mean < bestNorm) bestNorm = mean, predNorm = static_cast<int>(k);
  }
  return {pred, predNorm};
}

}  // namespace

std::vector<HellaSwagItem> readHellaSwag(const std::string& path, const Encode& encode) {
  const std::string file = runtime::data::readRegularFile(path);  // IoError naming what is not a file
  std::vector<HellaSwagItem> items;
  int64_t line = 1;
  for (size_t begin = 0; begin < file.size(); ++line) {
    const size_t end = std::min(file.find('\n', begin), file.size());
    const std::string text = file.substr(begin, end - begin);
    if (text.find_first_not_of(" \t\r") != std::string::npos) items.push_back(parseItem(text, path, line, encode));
    begin = end + 1;
  }
  if (items.empty()) COHORT_THROW(InvalidArgument) << path << ": no HellaSwag item (a JSON object a line)";
  return items;
}

namespace {

const nn::GptOptions& gptOptions(const nn::Model& model) {
  const auto* gpt = dynamic_cast<const nn::Gpt*>(model.net.get());
  if (gpt == nullptr) COHORT_THROW(InvalidArgument) << "--task hellaswag needs a gpt: model, not " << model.name;
  return gpt->options();
}

int64_t scoredVocabOf(const nn::Model& model, const HellaSwagOptions& options) {
  const int64_t vocab = gptOptions(model).vocab;
  return options.scoredVocab > 0 ? std::min(options.scoredVocab, vocab) : vocab;
}

}  // namespace

void checkHellaSwag(const nn::Model& model, std::span<const HellaSwagItem> items, const HellaSwagOptions& options) {
  const int64_t context = gptOptions(model).context, scoredVocab = scoredVocabOf(model, options);
  for (const HellaSwagItem& item : items) {
    const std::string where = options.path + ":" + std::to_string(item.line) + ": ";
    auto check = [&](const std::vector<int32_t>& tokens) {
      for (int32_t id : tokens) {
        if (id < 0 || id >= scoredVocab) {
          COHORT_THROW(InvalidArgument) << where << "token " << id << " is outside the vocabulary of model "
                                        << model.name << " (" << scoredVocab << " tokens)";
        }
      }
    };
    check(item.context);
    for (const auto& ending : item.endings) check(ending);
    const Rows rows = rowsOf(item, context, options.path, model.name);
    for (size_t k = 0; k < rows.tokens.size(); ++k) {
      if (static_cast<int64_t>(rows.tokens[k].size()) <= rows.scoredFrom[k]) {
        COHORT_THROW(InvalidArgument) << where << "ending " << k << " has no token to score (\"ctx\" is empty)";
      }
    }
  }
}

HellaSwagCounts scoreHellaSwag(nn::Model& model, std::span<const HellaSwagItem> items,
                               const HellaSwagOptions& options) {
  const nn::GptOptions& o = gptOptions(model);
  const int64_t scoredVocab = scoredVocabOf(model, options);
  HellaSwagCounts c;
  for (const HellaSwagItem& item : items) {
    const auto [pred, predNorm] =
        predict(model, rowsOf(item, o.context, options.path, model.name), o.vocab, scoredVocab);
    ++c.items;
    c.correct += pred == item.label;
    c.correctNorm += predNorm == item.label;
  }
  return c;
}

}  // namespace cohort::cli
