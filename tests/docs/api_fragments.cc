// The fragments of docs/api.md (a loop of your own, micro-batches, clipping, deferred steps, the
// Trainer, TensorBoard, asynchronous sharded checkpoints, the tokenizer, watching a run, parameter
// groups), each compiled in a function whose parameters are the names the doc's fragment uses, so that
// a renamed or retyped API breaks this build instead of the doc's readers. Compiled, not run: the loops
// need a job; tests/train runs the same calls.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "cohort/cohort.h"
#include "train/observe/tensorboard_writer.h"

namespace cohort::docs_fragments {

using runtime::data::Dataset;

void ownLoop(train::Job& job, std::unique_ptr<nn::Model>& model, std::unique_ptr<Dataset>& data, nn::Loss& loss,
             int64_t epochs) {
#include "tests/docs/own_loop.inc"
}

void microBatches(train::Job& job, std::unique_ptr<nn::Model>& model, runtime::data::DataLoader& loader,
                  nn::Loss& loss, int K) {
#include "tests/docs/micro_batches.inc"
}

void clipping(train::Job& job, double stepLoss, int64_t step) {
#include "tests/docs/clipping.inc"
}

template <class Handle>
void deferredSteps(train::Job& job, const nn::LrSchedule& schedule, int64_t skipsLeft, Handle handle) {
#include "tests/docs/deferred_steps.inc"
}
void deferredSteps(train::Job& job, const nn::LrSchedule& schedule) {
  deferredSteps(job, schedule, 3, [](const train::StepResult&) {});
}

train::TrainResult trainer(train::Job& job, nn::Loss& loss, const Dataset& trainSet, const Dataset* testSetOrNull,
                           train::TrainerCallbacks callbacks) {
#include "tests/docs/trainer.inc"
  return r;
}

void tensorboard(int64_t step, double loss, double acc, double t) {
#include "tests/docs/tensorboard.inc"
}

template <class Log>
void asyncCheckpoints(train::Job& job, const std::string& path, int64_t step, Log log) {
#include "tests/docs/async_checkpoints.inc"
}
void asyncCheckpoints(train::Job& job, const std::string& path, int64_t step) {
  asyncCheckpoints(job, path, step, [](const train::CheckpointCommit&) {});
}

void watching(train::Job& job, nn::Loss& loss, const Dataset& trainSet, const Dataset& valSet,
              const nn::Tokenizer& tokenizer) {
#include "tests/docs/watching.inc"
  trainer.run();
}

void tokenizer(const std::string& path, const std::string& text) {
#include "tests/docs/tokenizer.inc"
}

std::unique_ptr<nn::Optimizer> paramGroups(train::Job& job, std::unique_ptr<nn::Model>& model) {
#include "tests/docs/param_groups.inc"
  return optimizer;
}

}  // namespace cohort::docs_fragments
