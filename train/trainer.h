// Trainer: the training loop every worker runs (docs/architecture.md, "One training step"),
// readable on one screen, for any model placed by a train::Job and any Dataset.
//
//   (evaluate at step 0: evalEverySteps)
//   for epoch: loader.startEpochAfter(epoch, samplesSeen)   (0, or where a resumed epoch stopped)
//     for batch (up to stepsPerEpoch steps' worth, if set):
//                forward -> loss -> backward -> (every accumulateSteps batches) job.step() -> onStepEnd
//                -> (step line, evaluation, sample every N steps; trainer_eval.cc) -> (checkpoint every N steps)
//                a non-finite loss or gradient (train/step.h): stop with Diverged, or skip the step
//                (skipNonFinite)
//     the job's mean loss and throughput; evaluate on the test set (shared by the ranks that hold
//     it, rank 0's figures); onEpochEnd; log the epoch's line (rank 0's unless
//     TrainerOptions::logRanks says every rank); append one metrics line; checkpoint
//
// Every rank runs it with the same options and the same full training set: the loader takes this
// rank's part of it (Job::dataSplit). A rank given other data (its own part, or data seeded by rank) is
// refused at construction on every rank, naming the setting that differs (the data's name, size,
// sample shape or digest) and this fix. All ranks meet at a barrier at the start and at each
// epoch's end, where they evaluate (each a share of the test set when every rank holds it, else
// rank 0 alone) and rank 0 checkpoints while the others wait, so nothing changes the parameters
// meanwhile.
//
// Checkpoints (train/checkpoint/checkpointer.h) hold the job's state plus the loop's position: the epoch, the
// samples of its order the job has seen and the next batch of the loader, the step, the dropout Rng
// state and the running epoch sums, so a run resumed from any checkpoint continues bit for bit like
// the uninterrupted run (on the CPU). They are written every `checkpointEvery` steps (if > 0) and at
// the end of every epoch. A checkpoint of W ranks resumes on W' ranks too (an elastic resume,
// docs/checkpoints.md): the rest of the epoch is split over the W' ranks, no sample repeated or
// skipped; refused (InvalidArgument) with a cosine schedule that spans the run's steps, whose
// number changes with the ranks.
//
// A resume checks what the checkpoint records of its run against this one: other training data is
// refused (TrainerOptions::resumeOnNewData), a checkpoint of a Cohort that did not record it resumes
// with a warning that the data cannot be checked; another learning rate, weight decay, momentum,
// betas, schedule or clipping is taken, each change logged ("resuming with lr 0.001 (the
// checkpoint's run had 0.003)"). A checkpoint already at maxSteps (or at the end of the last epoch)
// trains nothing and is left as it is.
//
// Stopping early: a stop request (`stopRequested`, e.g. set by a SIGUSR1 handler, or a callback
// returning Next::kStop) is agreed by all ranks — every 16 steps where they step together, and among
// Hogwild workers of one node (the run checkpoints at that step and returns), and at the end of each
// epoch in every mode.
// Callbacks run on every rank, on the training thread; onEpochEnd may add its own figures to the
// report, which are logged and written to the metrics file with the others.
// Ownership: borrows the job (placed), the loss and the datasets, which must outlive run().
// Thread safety: run() is called from one thread.
//
//   train::Trainer trainer(job, loss, *train, test.get(), {.epochs = 5, .batchSize = 64});
//   train::TrainResult result = trainer.run();
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/loss.h"
#include "nn/lr_schedule.h"
#include "runtime/data/data_loader.h"
#include "runtime/data/dataset.h"
#include "runtime/logging.h"
#include "runtime/random.h"
#include "train/evaluate.h"
#include "train/job.h"
#include "train/observe/step_times.h"
#include "train/step_graph.h"

namespace cohort::train {

// Which ranks write the Trainer's log lines (the start-up line, the epoch lines, resume and stop
// notices); warnings are each rank's own (a skipped step: rank 0's where ranks step together).
enum class LogRanks {
  kRankZero,   // rank 0 alone: its figures are the job's (the default)
  kEveryRank,  // every rank: the same figures, each line with that rank's own samples/s
};

struct TrainerOptions {
  // 0: as many as maxSteps takes (maxSteps > 0 needed; nanoGPT's max_iters), and a schedule's default
  // length is then maxSteps rather than the epochs' steps.
  int64_t epochs = 1;
  int64_t batchSize = 64;        // samples per micro-batch and rank
  // K >= 1 micro-batches per optimizer step: their gradients summed and scaled by 1/K (PyTorch's
  // loss / K), and in allreduce only the last one synchronised (DDP's no_sync). The epoch's samples
  // and their order are unchanged; its last step takes what is left when K does not divide it.
  int64_t accumulateSteps = 1;
  uint64_t seed = 0;             // shuffling and dropout masks (initialisation is PlaceOptions::seed)
  int prefetch = 2;              // batches the loader's thread gathers ahead
  runtime::data::Augment augment = {};
  // Report accuracy (train_acc, test_acc). Unset: inferred, yes for nn::SoftmaxCrossEntropy, no for
  // nn::MeanSquaredError, and for a loss of one's own yes when the training set has classes
  // (Dataset::numClasses() > 0). Set true with nn::MeanSquaredError, which counts no correct
  // predictions: InvalidArgument (the accuracy would read 0).
  std::optional<bool> classification = std::nullopt;
  std::string checkpointPath = {};  // empty: no checkpoints
  int64_t checkpointEvery = 0;   // steps; 0: at the end of each epoch only (not in Hogwild)
  bool resume = false;           // continue from checkpointPath if it exists
  // A checkpoint records the training data it was trained on (its name, size and digest, as the
  // ranks' settings agreement compares them). A resume on other data is refused (InvalidArgument
  // naming both) unless this is set: then the weights, the optimizer state and the step count are
  // kept and the checkpoint's epoch starts afresh (its order from the first sample) on the new data.
  bool resumeOnNewData = false;
  // The tokenizer the data was made with (nn::Tokenizer::digest), recorded in every checkpoint's
  // metadata as "tokenizer_digest" (`cohort generate` warns when given another); empty: none recorded.
  std::string tokenizerDigest = {};
  // Sharded jobs (JobOptions::zero >= 1; InvalidArgument otherwise): each checkpoint only stages the
  // shards (Job::save's SaveOptions::async) and is committed at a later step boundary, once every
  // rank's file is durable (Job::settleCheckpoint; the run's end waits for it). Rank 0 logs each
  // commit: how long training waited, the staging memory per rank, how long the write took.
  bool asyncCheckpoints = false;
  // > 0: stop after this many optimizer steps in all (checkpointed). In Hogwild each worker counts its
  // own steps (every worker of a run takes as many batches an epoch), so all stop at the same count.
  int64_t maxSteps = 0;
  // > 0: an epoch is this many optimizer steps (or the data's steps per epoch, if fewer): it ends
  // there (evaluation, epoch line, checkpoint) and the next epoch starts a new order of the data, as
  // the loader's next epoch: over a corpus larger than the run, every epoch is a fresh random draw
  // of windows, as nanoGPT samples them. 0: an epoch is the whole training set. Not with an elastic
  // resume (another number of ranks), whose batches are numbered otherwise.
  int64_t stepsPerEpoch = 0;
  // Set asynchronously (e.g. by a SIGUSR1 handler): stop after the current step (agreed by all
  // ranks), write the checkpoint and return.
  const std::atomic<bool>* stopRequested = nullptr;
  // The signal that set stopRequested (SIGUSR1, SIGTERM, SIGHUP), named in the log; unset or 0: "a
  // stop request".
  const std::atomic<int>* stopSignal = nullptr;
  std::string metricsPath = {};  // JSON lines, one per epoch (rank 0); empty: none
  // Rank 0 writes the metrics as TensorBoard scalars into a new event file there (docs/observing.md
  // names the tags); empty: none.
  std::string tensorboardDir = {};
  // > 0: every N optimizer steps rank 0 logs a step line as nanoGPT and llm.c print it (step, loss,
  // lr, gradient norm, ms per step, tokens/s or samples/s, MFU: train/observe/mfu.h) and writes the
  // same figures as a metrics line (rank 0's figures over the last N steps).
  int64_t logEverySteps = 0;
  int64_t evalBatchSize = 1000;  // samples per forward pass of the evaluation (train::evaluationChunk)
  // Evaluation while training (nanoGPT's eval_interval, llm.c's val_loss_every): > 0, the test set is
  // evaluated after every evalEverySteps optimizer steps and before the first (step 0), every rank
  // taking part as at an epoch's end; rank 0 logs "eval step S: test_loss ..." and writes an "eval"
  // metrics line (docs/observing.md). In Hogwild each worker's own step count decides, as for maxSteps.
  int64_t evalEverySteps = 0;
  // > 0: every evaluation (the epochs' too) covers the first evalBatches x evalBatchSize samples of
  // the test set (in passes of train::evaluationChunk): the same samples every time, so the figures
  // compare (nanoGPT's eval_iters, llm.c's val_max_steps). 0: the whole test set.
  int64_t evalBatches = 0;
  // Samples while training (llm.c's sample_every), GPT models only: > 0, after every sampleEverySteps
  // optimizer steps rank 0 continues samplePrompt (token ids) by sampleTokens tokens with
  // nn::GptSampler on a CPU copy of the current parameters (gathered where ZeRO 3 shards them:
  // collective), drawn with a runtime::Rng of its own seeded by sampleSeed (the training's Rng and
  // data order are untouched: a run ends on the same parameters with and without samples), and logs
  // them as text through sampleDecode (id -> text; unset: the ids, comma-separated).
  int64_t sampleEverySteps = 0;
  int64_t sampleTokens = 32;
  std::vector<int64_t> samplePrompt = {};  // at least one id below the vocabulary
  uint64_t sampleSeed = 1337;
  std::function<std::string(int64_t)> sampleDecode = {};
  // The model's peak FLOP/s for the MFU of the step lines (train/observe/mfu.h); 0: found out, from
  // the GPU's compute capability, or on the CPU measured by a short sgemm probe at start-up.
  double peakFlops = 0;
  // The learning rate of each optimizer step (nn/lr_schedule.h), set on the optimizer before the
  // step; baseLr 0 takes the optimizer's own. totalSteps 0 means the run's: epochs x steps per epoch
  // (maxSteps only stops the run early). Unset: the optimizer's learning rate throughout.
  std::optional<nn::LrScheduleOptions> lrSchedule = std::nullopt;
  // > 0: clip each step's gradient to this global L2 norm (StepOptions::clipGradNorm).
  float clipGradNorm = 0;
  // A step whose loss or gradient is non-finite is never applied. 0: the run stops there with
  // Diverged (every rank that steps together at the same step; no checkpoint is written after the
  // last good step). N > 0: up to N such steps in the run are skipped (logged, counted in the
  // reports, kept across resumes), and the one after them stops it. A skipped step's samples count
  // in no figure; its optimizer step does not happen (the schedule does not advance).
  int64_t skipNonFinite = 0;
  // > 0: skip a step whose loss (CPU) or gradient norm lies more than this many standard deviations
  // above the recent applied steps' (StepOptions::skipSpikes; train/step.h, "Spikes"): logged by rank
  // 0 (each Hogwild worker for itself), counted in the reports and kept across resumes. More than
  // maxSpikesInARow such steps in a row stop the run with Diverged. 0: off.
  double skipSpikes = 0;
  int64_t maxSpikesInARow = 10;
  // Seeing the run (docs/api.md, "Seeing a run"):
  // live progress on rank 0 within an epoch (train/observe/progress.h): a line rewritten in place on a
  // terminal, else a plain line every progressEverySeconds; 0: none.
  double progressEverySeconds = 10;
  // The job's trace (train/observe/trace_file.h): every rank's spans, merged by rank 0 into this Chrome trace
  // / Perfetto JSON file at the end of the run; empty: none. traceSpans: the ring of each rank
  // (24 bytes a span; the newest are kept).
  std::string tracePath = {};
  size_t traceSpans = size_t{1} << 16;
  // The time report at each epoch's end (train/observe/step_times.h): logged by rank 0, in the metrics and
  // EpochReport::times. On with tracePath.
  bool stepReport = false;
  // GPU: wait inside each step for its decision (the finite check, the clip coefficient), as before
  // issue 31. Off (the default), a step's outcome is handled after the next step is queued (train/step.h,
  // "When results arrive"), with the same parameters bit for bit; onStepEnd then runs for step n
  // after step n + 1 was queued, so a stop it asks for in a one-rank run comes a step later.
  bool synchronousSteps = false;
  // GPU: capture a whole step (forward, backward, and the deferred step's norm, guard and optimizer;
  // with synchronous steps the forward and backward only) once as a CUDA graph and replay it for
  // every later step of the same shapes (train/step_graph.h; `cohort train --cuda-graphs`): in local mode with one
  // micro-batch per step; elsewhere, and where a capture fails, steps run uncaptured and one line says
  // why. The parameters and optimizer state are the same bit for bit. Has run on the emulated device only.
  bool cudaGraphs = true;
  // Who logs (see LogRanks), and whether they log a start-up line when run() begins: the model and
  // its parameter count, the data, the mode and world size, the batch per rank and the effective
  // batch of a step, steps per epoch, epochs and whether accuracy is reported (off for a program
  // that logs its own, as `cohort train` does).
  LogRanks logRanks = LogRanks::kRankZero;
  bool logStartLine = true;
};

enum class Next { kContinue, kStop };

struct StepReport {
  int64_t epoch = 0;      // from 0
  int64_t batch = 0;      // within the epoch, from 0
  int64_t step = 0;       // optimizer steps so far, this one included
  int64_t samples = 0;    // in this step's micro-batches
  double loss = 0;        // their mean loss on this rank; NaN on a GPU (read once per epoch there)
  double gradNorm = 0;    // the gradient's global norm before clipping (StepResult::gradNorm)
  bool applied = true;    // false: skipped, non-finite (TrainerOptions::skipNonFinite) or a spike (skipSpikes)
};

struct EpochReport {
  int64_t epoch = 0;  // from 1
  int64_t step = 0;
  double trainLoss = 0;  // the job's mean over the epoch
  double trainAcc = 0;
  double testLoss = 0;   // rank 0 only (haveTest)
  double testAcc = 0;
  bool haveTest = false;
  double samplesPerSec = 0;       // the job's training throughput so far
  double epochSamplesPerSec = 0;  // the job's throughput in this epoch (all ranks' samples / the slowest rank's time)
  double lr = 0;                  // the learning rate of the epoch's last step
  double gradNorm = 0;            // the gradient's global norm before clipping: mean over the epoch's applied steps
  double gradNormMax = 0;         // and the largest (Hogwild: the mean and the largest over the workers)
  int64_t skippedSteps = 0;       // non-finite steps skipped in this epoch (Hogwild: all workers')
  int64_t skippedSpikes = 0;      // and spikes skipped (TrainerOptions::skipSpikes)
  // The callback's own figures ("val_f1", ...): logged and written to the metrics file.
  std::vector<std::pair<std::string, double>> metrics = {};
  // Where the epoch's steps spent their time (TrainerOptions::stepReport or tracePath).
  std::optional<StepTimes> times = std::nullopt;
};

struct TrainerCallbacks {
  std::function<Next(const StepReport&)> onStepEnd = {};
  std::function<Next(EpochReport&)> onEpochEnd = {};
};

// Why a run ended before its last epoch.
enum class StopReason {
  kNone,      // it trained every epoch
  kMaxSteps,  // TrainerOptions::maxSteps
  kRequest,   // TrainerOptions::stopRequested (e.g. SIGUSR1) on some rank
  kCallback,  // a callback returned Next::kStop on some rank
};
// "none", "max_steps", "signal", "callback" (the RESULT line's stopped=).
const char* toString(StopReason reason);

struct TrainResult {
  int64_t epochs = 0;         // completed epochs (a stopped run's partial epoch does not count)
  int64_t steps = 0;
  bool stoppedEarly = false;  // maxSteps reached (or a stop requested) before the last epoch ended
  bool stoppedByRequest = false;
  StopReason stopReason = StopReason::kNone;
  double trainLoss = 0;  // mean over the last epoch
  double trainAcc = 0;
  double testLoss = 0;
  double testAcc = 0;
  bool haveTest = false;
  // Throughput, the job's: all ranks' training samples over the slowest rank's training time
  // (evaluation, checkpoints and the barriers between epochs excluded), in this run() (a resumed
  // run's from where it resumed). samplesPerSec covers every epoch, the first one's warm-up
  // included (threads and buffers made, caches cold: it reads well below the epoch lines' job
  // figures on short runs); samplesPerSecSteady covers the epochs after the first, the rate a longer
  // run settles at (samplesPerSec itself when the run trained only one epoch).
  double samplesPerSec = 0;
  double samplesPerSecSteady = 0;
  double wallSeconds = 0;
  double inputWaitMs = 0;    // GPU: how long the compute stream waited for input batches
  int64_t skippedSteps = 0;  // non-finite steps skipped over the whole run (resumes included; this rank's)
  int64_t skippedSpikes = 0;  // spikes skipped over the whole run (resumes included; this rank's)
  // TrainerOptions::cudaGraphs: the steps that ran as the CUDA graph (the captured one included),
  // the captured graph's nodes (kernels and copies; 0: none captured) and why graphs were off
  // (empty: they were on, or not asked for).
  int64_t cudaGraphSteps = 0;
  int64_t cudaGraphNodes = 0;
  std::string cudaGraphsOff = {};
};

class MetricsSink;
class Progress;
struct StepFigures;

class Trainer {
 public:
  // InvalidArgument for a job that is not placed, for checkpointEvery where ranks do not step together
  // (Hogwild), for samples of a model that is not a GPT or a prompt outside its vocabulary, for
  // `classification` with a loss that counts no correct predictions, and for data the model cannot take,
  // found before any step: a sample shape other than ModelInfo::sampleShape (its element count, where
  // known; flat rows of 784 for a [1, 28, 28] model are fine), a batch the network refuses
  // (Module::outputShape, naming the layer as nn::LayerError does), or targets its output cannot match
  // (fewer outputs than classes; another count of regression values). Both sets are checked, each named
  // with its shape and the model's. Collective (the settings' agreement), after which ranks given
  // different data fail alike.
  Trainer(Job& job, nn::Loss& loss, const runtime::data::Dataset& train, const runtime::data::Dataset* test,
          TrainerOptions options, TrainerCallbacks callbacks = {});
  ~Trainer();

  TrainResult run();
  // The loss and accuracy of the model on `data` (this rank, no collective).
  Evaluation evaluate(const runtime::data::Dataset& data);
  // The test set's figures, on rank 0 (nullopt elsewhere and without a test set). Collective. When
  // every rank holds a test set of one size (the CLI's ranks all open it), each evaluates a 1/W run
  // of its chunks and the chunks' sums are reduced, exactly: rank 0's figures are bit for bit what
  // it computes alone (train::evaluationOf). When only rank 0 holds one, it evaluates alone.
  std::optional<Evaluation> evaluateTest();
  // The learning-rate schedule with the run's defaults filled in; nullptr without one.
  const nn::LrSchedule* lrSchedule() const { return schedule_ ? &*schedule_ : nullptr; }
  // This rank's loader (its shard of the training set).
  const runtime::data::DataLoader& loader() const { return loader_; }

 private:
  struct Position {
    int64_t epoch = 0;
    int64_t batch = 0;  // next batch within the epoch (DataLoader's numbering for this world size)
    // Positions of the epoch's order the job has consumed, all ranks together
    // (DataLoader::samplesSeenAfter): what a resume on any number of ranks continues from.
    int64_t seen = 0;
    int64_t step = 0;   // optimizer steps so far
    double lossSum = 0;  // running sums of the current epoch
    int64_t correct = 0;
    int64_t samples = 0;
    double lastTrainLoss = 0;  // figures of the last completed epoch
    double lastTrainAcc = 0;
    double gradNormSum = 0;  // the current epoch's applied steps
    double gradNormMax = 0;
    int64_t gradNormSteps = 0;
    int64_t skippedInEpoch = 0;
    int64_t skipped = 0;  // over the run
    int64_t spikesInEpoch = 0;  // skipped spikes, the same way
    int64_t spikes = 0;
    int64_t spikesInARow = 0;  // since the last applied step
  };

  using Clock = std::chrono::steady_clock;
  static double secondsSince(Clock::time_point t);
  // Construction (trainer_setup.cc): the options' values, then the data against the model and the loss.
  void checkOptions() const;
  void checkData(const runtime::data::Dataset& data, const char* role) const;
  // Whether this rank writes the Trainer's own lines (TrainerOptions::logRanks), and one such line
  // (trainer_log.cc); warnings go through the job's log directly.
  bool logs() const { return options_.logRanks == LogRanks::kEveryRank || job_.world().rank == 0; }
  runtime::LogLine note() const;
  void logStart() const;
  // The epoch's line: the job's figures, this rank's samples/s and, beside it, the job's.
  void logEpoch(const EpochReport& report, double epochSeconds, int64_t epochSamples) const;
  TrainResult alreadyDone(const Position& pos, Clock::time_point start);
  // Whether to stop now: this rank's request, agreed with the others (see the header comment).
  bool stopAgreed(int64_t step, bool epochEnd);
  // Why the loop stops on request, for the log: "by a callback", "SIGTERM", ...
  std::string stopCause() const;
  void prepareOnRankZero(const std::function<void()>& prepare, const std::string& what);
  void prepareOutputs();
  void saveCheckpoint(const Position& pos);
  // Asynchronous checkpoints: commits the one in flight (waiting for it, or only if every rank's file
  // is durable) and logs the commit on rank 0 (trainer_checkpoint.cc).
  void settleCheckpoint(bool wait);
  bool loadCheckpoint(Position& pos);
  // The training data of the checkpoint's run (metadata `m`) against this run's: the same (false),
  // or, where the checkpoint does not record it, false with a warning; other data is refused
  // (InvalidArgument naming both) or, with resumeOnNewData, true (trainer_checkpoint.cc).
  bool resumesOnNewData(const nn::Metadata& m) const;
  // The settings a resume may change but logs, as a checkpoint records them: "lr" (the base rate),
  // "weight_decay", "momentum", "betas", "lr_schedule", "clip_grad_norm", "weight_decay_groups".
  std::vector<std::pair<std::string, std::string>> runSettings() const;
  // Logs (rank 0) each of them that the checkpoint's run (metadata `m`) had otherwise.
  void noteChangedSettings(const nn::Metadata& m) const;
  // Whether a resumed `pos` leaves nothing to train: past the last epoch, or at maxSteps (said so).
  bool nothingToTrain(const Position& pos) const;
  // The resume's position from the checkpoint's metadata `m` (samples seen, or batch × world size ×
  // batch size in checkpoints from before they were recorded); refuses what a changed world size
  // cannot continue.
  void loadPosition(const nn::Metadata& m, Position& pos);
  // The test hook TestHooks::sampleLogDir (the job's options): each rank appends a line "EPOCH SAMPLE" for every
  // sample of every batch it trains on to DIR/samples.rank<R>, so tests can check that a resume on
  // another number of ranks neither repeats nor skips a sample.
  void openSampleLog();
  void logSamples(int64_t epoch, int64_t batchIndex);
  // Chunks [first, last) of `data` in chunks of `chunk` samples, on the job's device (evaluate.h).
  void evaluateChunks(const runtime::data::Dataset& data, int64_t chunk, int64_t first, int64_t last,
                      std::span<double> sums);
  // The loop of run(), in the order it runs (trainer.cc).
  struct Batches;  // where the batches come from: the host loader, or the device loader on a GPU
  // The figures of the optimizer step being gathered over its micro-batches, added to the epoch's
  // once the step is applied (a skipped step counts in none).
  struct StepGroup {
    int64_t samples = 0, correct = 0;
    double loss = 0;  // summed over the samples (NaN on a GPU, where the losses stay on the device)
  };
  struct StepWindow;
  Batches openBatches();
  // Starts the timeline (with the clock rounds of a trace) and rank 0's progress line.
  void startObserving();
  // One epoch from `pos` (its start, or a resume point): its batches, then finishEpoch. True when
  // the run stops there.
  bool runEpoch(Position& pos, Batches& batches, TrainResult& result);
  // One batch as a micro-batch of its optimizer step, and the step once its group is complete. True
  // when the run stops at it (a stop request or maxSteps, checkpointed).
  bool trainBatch(const runtime::data::Batch& batch, Position& pos, StepGroup& group, StepWindow& window,
                  TrainResult& result);
  // The batch's forward and backward, then `step` (the optimizer step, or nothing before the last
  // micro-batch), through the step's CUDA graph where there is one (train/step_graph.h).
  void forwardBackward(const runtime::data::Batch& batch, const nn::Pass& pass, StepGroup& group,
                       const std::function<void()>& step);
  // The step's CUDA graph (TrainerOptions::cudaGraphs) for this run; nullptr on the CPU.
  std::unique_ptr<StepGraph> makeStepGraph();
  // After a step within an epoch: checkpoints where due, and stops (true) on an agreed stop request
  // or at maxSteps.
  bool stopsMidEpoch(Position& pos, StepWindow& window, TrainResult& result);
  // After an epoch: whether the run ends there (a stop before or at it, maxSteps, a stop request).
  bool stopsAfterEpoch(const Position& pos, TrainResult& result);
  // The trace, the wall time, and the metrics file's failure (thrown).
  void finishRun(TrainResult& result, Clock::time_point start);
  // Every rank calls this at an epoch's end; the ranks evaluate (evaluateTest), rank 0 logs and
  // checkpoints.
  void finishEpoch(Position& pos, TrainResult& result, double epochSeconds, int64_t epochSamples);
  // The epoch's and the run's figures as the job's (collective: summed, the slowest rank's time,
  // averaged), into `result`, with the test set's evaluation: the epoch's report.
  EpochReport jobFigures(const Position& pos, TrainResult& result, double epochSeconds, int64_t epochSamples,
                         const std::optional<StepTimes>& times);
  // Keeps the epoch's loss and accuracy, and zeroes its sums for the next epoch.
  void startEpochFigures(Position& pos, const TrainResult& result);
  // A step queued, whose result (deferred on a GPU) is handled by afterStep.
  struct QueuedStep {
    int64_t epoch = 0;
    int64_t step = 0;       // optimizer steps so far, this one included
    int64_t firstBatch = 0;  // its first micro-batch
    int64_t batch = 0;      // its last batch
    int64_t nextBatch = 0;  // the position after it (Position::batch)
    int64_t samples = 0, correct = 0;
    double groupLoss = 0, loss = 0;  // the sum over its samples and their mean (NaN on a GPU)
  };
  // What follows a step once its result is known: the epoch's figures, skip or Diverged,
  // onStepEnd, the step log and the progress line.
  void afterStep(Position& pos, StepWindow& window, const QueuedStep& queued, const StepResult& result);
  // Takes the deferred results (Job::settleStep) until at most `keep` steps are queued.
  void settleSteps(Position& pos, StepWindow& window, size_t keep);
  // Whether step `step` is one where lockstep ranks vote on stopping (stopAgreed's collective).
  bool stopVoteDue(int64_t step) const;
  // A step that was not applied: counts it against skipNonFinite, or throws Diverged.
  void nonFiniteStep(Position& pos, const QueuedStep& queued, const StepResult& step);
  // A spike: counts it, or throws Diverged after maxSpikesInARow in a row.
  void spikeStep(Position& pos, const QueuedStep& queued, const StepResult& step);
  // "step 5 (epoch 1, batch 5): " and the step's description.
  std::string describeStep(const QueuedStep& queued, const StepResult& step) const;
  // What a Diverged message says of the checkpoint: the one held, or that none was written.
  std::string lastCheckpointNote() const;
  // A skipped step's warning: by rank 0 where ranks step together (they skip alike), else by each.
  void warnSkipped(const std::string& what);
  // GPU: forwards the step's batches again without training, so that input the device could not
  // refuse (an Embedding's ids) is named by the model's checkInputs (InvalidArgument).
  void checkStepInputs(const QueuedStep& queued);
  // GPU: adds the loss sums accumulated on the device to `pos` (waits for the compute stream).
  void collectGpuSums(Position& pos);
  // --log-every-steps: rank 0's loss and throughput over the last N steps.
  struct StepWindow {
    double lossSum = 0;
    int64_t samples = 0;
    double gradNormSum = 0;
    int64_t steps = 0;     // applied
    int64_t allSteps = 0;  // skipped ones too (ms per step)
    Clock::time_point start = Clock::now();
  };
  void logSteps(const QueuedStep& queued, StepWindow& window);
  // The step line on the log (rank 0), as nanoGPT and llm.c print it (trainer_log.cc).
  void logStepLine(const StepFigures& f) const;
  // The figures of a step window: loss, lr, grad norm, ms per step, tokens/s, MFU.
  StepFigures stepFigures(const QueuedStep& queued, const StepWindow& window) const;
  // The MFU's terms (train/observe/mfu.h): found on rank 0 at start when step lines are logged.
  void prepareMfu();
  // Where an epoch's batches end: the loader's end, or stepsPerEpoch steps' worth of them.
  int64_t epochEndBatch() const;
  // Optimizer steps per epoch (stepsPerEpoch where it is set and fewer than the data's).
  int64_t stepsPerEpoch() const;
  // Whether something every `every` steps is due after step `step` (every > 0).
  static bool everyDue(int64_t every, int64_t step) { return every > 0 && step > 0 && step % every == 0; }
  // The test samples an evaluation covers: evalBatches x evalBatchSize, or all (trainer_eval.cc).
  int64_t evalSamples() const;
  // evaluateTest() over the test set's first `samples` samples (0: all of them). Collective.
  std::optional<Evaluation> evaluateTestPrefix(int64_t samples);
  // The evaluation of evalEverySteps at `pos` (every rank; rank 0 logs it and writes the eval line).
  void evaluateAtStep(const Position& pos);
  // The epoch's evaluation: the one just made at this step, else a new one. Collective.
  std::optional<Evaluation> evaluateForEpoch(const Position& pos);
  // The sample of sampleEverySteps at `step` (every rank: gathers the parameters; rank 0 logs it).
  void sampleAtStep(int64_t step);
  void checkSampleOptions() const;
  bool timed() const { return options_.stepReport || !options_.tracePath.empty(); }

  Job& job_;
  nn::Model& model_;
  nn::Loss& loss_;
  runtime::data::DataLoader loader_;
  const runtime::data::Dataset* test_;
  // What ranks must share to split the test set's evaluation: its size, digest (sampledDigest) and
  // chunk size in one 48-bit number (0 without a test set).
  uint64_t testKey_ = 0;
  TrainerOptions options_;
  // The training data's identity as a checkpoint records it ("train_data", "train_samples",
  // "train_data_digest": what the ranks' settings agreement compares), to check a resume against.
  nn::Metadata trainData_;
  bool newData_ = false;  // resumed on other data (resumeOnNewData): the checkpoint's epoch starts afresh
  bool classification_ = true;  // options_.classification, inferred where unset
  TrainerCallbacks callbacks_;
  runtime::Rng rng_;
  std::optional<nn::LrSchedule> schedule_;
  std::function<float(int64_t)> lrAt_;  // the schedule's rate at a step count (none without a schedule)
  bool userStop_ = false;     // a callback asked to stop
  std::optional<nn::CheckpointLock> checkpointLock_;  // rank 0's, for the run
  bool checkpointHeld_ = false;  // checkpointPath holds this run's state (written, or resumed from)
  double trainSeconds_ = 0;   // this rank's, over the epochs run in this process
  int64_t trainedSamples_ = 0;
  int64_t epochsRun_ = 0;     // epochs (or parts) finished in this process: the first is the warm-up
  double steadySeconds_ = 0;  // trainSeconds_ and trainedSamples_ without the first epoch's
  int64_t steadySamples_ = 0;
  Timeline& timeline_;        // the job's
  std::unique_ptr<MetricsSink> metrics_;  // rank 0's, with a metrics path or a TensorBoard directory
  std::unique_ptr<Progress> progress_;              // rank 0's, unless off
  std::unique_ptr<StepGraph> stepGraph_;            // GPU, during run(): the step's CUDA graph
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> sampleLog_{nullptr, &std::fclose};
  std::deque<QueuedStep> queued_;  // deferred steps whose results are not handled yet, oldest first
  // The last evaluation at a step (evaluateAtStep): its step (-1: none) and rank 0's figures.
  int64_t lastEvalStep_ = -1;
  std::optional<Evaluation> lastEval_;
  bool warnedNoTest_ = false;
  double pausedSeconds_ = 0;  // this epoch's evaluations and samples at steps: not training time
  struct SampleModel;  // a CPU copy of the GPT that samples (trainer_sample.cc)
  std::shared_ptr<SampleModel> sampleModel_;  // shared_ptr: destroyed where the type is incomplete
  double flopsPerSample_ = 0;  // the model's training FLOPs per sample (0: unknown)
  double peakFlops_ = 0;       // the device's peak FLOP/s (0: unknown)
};

}  // namespace cohort::train
