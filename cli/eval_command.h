// `cohort eval` and `cohort predict`: a trained checkpoint applied to data, without training again.
//
//   cohort eval    --checkpoint F --data SPEC [--split test|train]
//     prints "RESULT eval model=… data=… samples=N test_loss=… [test_acc=…]": for the data a training
//     run evaluated (its --data's test split, or --test-data / a CSV file), exactly the test figures of
//     that run's RESULT line;
//   cohort predict --checkpoint F --data SPEC --output FILE.csv [--split test|train] [--top-k K]
//     writes one CSV row per sample: the class probabilities (softmax of the outputs) and the
//     predicted class, or the regression outputs; written to a temporary file and renamed. A
//     language model's sample is a window, and its row is the distribution of the token after the
//     window (the last position's). --top-k K writes the K most likely classes instead, best first
//     (id1,p1,...,idK,pK), and with --tokenizer a gpt's tokens' text too (id1,p1,text1,...).
// The model spec and the task (classification or regression) are read from the checkpoint (or it is
// another tool's GPT-2, as --init-from reads them: nn/model_weights.h; a language model); data of
// another shape than the model takes, or a checkpoint of another model, is exit 2 naming both.
// --model SPEC (as cohort train's) applies the weights with that model instead, which must fit them;
// a HuggingFace GPT-2 without config.json has its heads taken as width / 64, said on stderr
// ("cohort eval: PATH (HuggingFace safetensors, gpt:…): heads taken as width / 64, …; give --model
// to say otherwise").
//   cohort eval --checkpoint F --task hellaswag FILE.jsonl [--tokenizer T]
//     scores HellaSwag's jsonl as llm.c does (cli/hellaswag.h) and prints "RESULT hellaswag model=…
//     items=N acc=… acc_norm=… correct=… correct_norm=…"; the text is encoded by --tokenizer (a byte
//     model: its bytes). Under cohortrun each rank scores a contiguous share of the items and the
//     counts are summed (an all-reduce), so the figures are one worker's exactly; rank 0 prints them,
//     and with --metrics FILE writes them as one JSON line {"task":"hellaswag","items":N,"acc":…,
//     "acc_norm":…,"correct":…,"correct_norm":…} (a fresh temporary renamed over FILE).
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace cohort::cli {

struct EvalFlags {
  std::string checkpoint;
  std::string model;  // --model: the spec the weights are applied with (empty: the checkpoint's own)
  std::string data = "synthetic";
  std::string split = "test";  // test | train (a CSV file has only one: train)
  std::string output;          // predict: the CSV file to write
  int64_t batchSize = 1000;
  int threads = 1;
  int64_t topK = 0;       // predict: > 0 writes the K most likely classes (tokens) and their probabilities
  std::string task;       // eval: "hellaswag" scores taskFile (cli/hellaswag.h) instead of --data
  std::string taskFile;   // eval: the task's file (HellaSwag's jsonl)
  // GPT-2's tokenizer (file or folder): eval --task encodes the task's text with it, predict --top-k
  // writes each token's text beside its id
  std::string tokenizer;
  std::string metrics;    // eval --task: a JSON line of the figures written here (rank 0)
};

void addEvalFlags(CLI::App& app, EvalFlags& flags, bool predict);
int runEval(const EvalFlags& flags);
int runPredict(const EvalFlags& flags);

}  // namespace cohort::cli
