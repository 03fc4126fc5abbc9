// cohort: the worker program. Subcommands:
//   train    train a model (cli/train_command.h)
//   eval     a checkpoint's loss and accuracy on data; predict: its predictions (cli/eval_command.h)
//   generate text from a gpt checkpoint (cli/generate_command.h)
//   export   a gpt's weights for HuggingFace or llm.c (cli/export_command.h)
//   devices  list the CPU and CUDA devices of this machine
//   tokenize text corpora into llm.c's token shards (cli/tokenize_command.h)
//   plot     draw loss and accuracy curves from metrics files (cli/plot_command.h)
//   bench    benchmarks (bench/)
// and --version ("cohort MAJOR.MINOR.PATCH", from VERSION: runtime/version.h).
// The one place (with launcher/'s main) where errors become exit codes (docs/errors.md).
#include <CLI/CLI.hpp>  // CLI11: flags and subcommands
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

#include "bench/allreduce_bench.h"    // cohort bench allreduce
#include "bench/recompute_bench.h"    // cohort bench recompute
#include "bench/train_bench.h"        // cohort bench train
#include "bench/zero_memory_bench.h"  // cohort bench memory
#include "cli/eval_command.h"         // cohort eval, cohort predict
#include "cli/export_command.h"       // cohort export
#include "cli/flag_values.h"          // describeParseError
#include "cli/generate_command.h"     // cohort generate
#include "cli/plot_command.h"         // cohort plot
#include "cli/tokenize_command.h"     // cohort tokenize
#include "cli/train_command.h"        // cohort train
#include "runtime/device_query.h"     // cohort devices
#include "runtime/error.h"            // exit codes
#include "runtime/version.h"          // cohort --version
#include "runtime/world_info.h"       // rank for error messages

namespace {

int run(int argc, char** argv) {
  using namespace cohort;
  CLI::App app{"cohort: multi-process neural-network training"};
  app.set_version_flag("--version", std::string("cohort ") + version());
  app.require_subcommand(1);
  cli::TrainFlags trainFlags;
  CLI::App* train = app.add_subcommand("train", "train a model");
  cli::addTrainFlags(*train, trainFlags);
  cli::EvalFlags evalFlags, predictFlags;
  CLI::App* eval = app.add_subcommand("eval", "a checkpoint's loss and accuracy on data");
  cli::addEvalFlags(*eval, evalFlags, false);
  CLI::App* predict = app.add_subcommand("predict", "a checkpoint's predictions for data, as CSV");
  cli::addEvalFlags(*predict, predictFlags, true);
  cli::GenerateFlags generateFlags;
  CLI::App* generate = app.add_subcommand("generate", "text from a gpt checkpoint, continuing a prompt");
  cli::addGenerateFlags(*generate, generateFlags);
  cli::ExportFlags exportFlags;
  CLI::App* exportCommand =
      app.add_subcommand("export", "a gpt's weights as HuggingFace's GPT-2 or llm.c's model file");
  cli::addExportFlags(*exportCommand, exportFlags);
  cli::TokenizeFlags tokenizeFlags;
  CLI::App* tokenize = app.add_subcommand("tokenize", "text corpora into llm.c's token shards (train and val)");
  cli::addTokenizeFlags(*tokenize, tokenizeFlags);
  CLI::App* devices = app.add_subcommand("devices", "list CPU and CUDA devices");
  cli::PlotFlags plotFlags;
  CLI::App* plot = app.add_subcommand("plot", "draw loss and accuracy curves from metrics files");
  cli::addPlotFlags(*plot, plotFlags);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  bench::TrainBenchOptions benchOptions;
  CLI::App* benchTrain = bench->add_subcommand("train", "MLP training throughput (samples/s) and SGEMM rate");
  bench::addTrainBenchFlags(*benchTrain, benchOptions);
  bench::AllReduceBenchOptions allReduceOptions;
  CLI::App* benchAllReduce = bench->add_subcommand("allreduce", "all-reduce time and bandwidth per message size");
  bench::addAllReduceBenchFlags(*benchAllReduce, allReduceOptions);
  bench::RecomputeBenchOptions recomputeOptions;
  CLI::App* benchRecompute =
      bench->add_subcommand("recompute", "a GPT's activation bytes and step time at each --recompute mode (CPU)");
  bench::addRecomputeBenchFlags(*benchRecompute, recomputeOptions);
  bench::ZeroMemoryBenchOptions memoryOptions;
  CLI::App* benchMemory = bench->add_subcommand(
      "memory", "what a rank of a ZeRO job holds at one stage, measured against the formula (under cohortrun)");
  bench::addZeroMemoryBenchFlags(*benchMemory, memoryOptions);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help: usage on stdout, exit 0
    // Bad flags are bad usage like any other: one line, exit code 2.
    throw InvalidArgument(cli::describeParseError(e.what()) + " (run with --help for usage)");
  }
  if (train->parsed()) return cli::runTrain(trainFlags);
  if (eval->parsed()) return cli::runEval(evalFlags);
  if (predict->parsed()) return cli::runPredict(predictFlags);
  if (generate->parsed()) return cli::runGenerate(generateFlags);
  if (plot->parsed()) return cli::runPlot(plotFlags);
  if (exportCommand->parsed()) return cli::runExport(exportFlags);
  if (tokenize->parsed()) return cli::runTokenize(tokenizeFlags);
  if (devices->parsed()) {
    std::string whyNone;
    auto cuda = runtime::cudaDevices(&whyNone);
    std::printf("%s", runtime::formatDevices(runtime::hostInfo(), cuda, whyNone).c_str());
    return 0;
  }
  if (benchTrain->parsed()) return bench::runTrainBench(benchOptions);
  if (benchAllReduce->parsed()) return bench::runAllReduceBench(allReduceOptions);
  if (benchRecompute->parsed()) return bench::runRecomputeBench(recomputeOptions);
  if (benchMemory->parsed()) return bench::runZeroMemoryBench(memoryOptions);
  return static_cast<int>(ExitCode::kUsage);
}

}  // namespace

int main(int argc, char** argv) {
  // cohortrun prefixes its workers' lines with the rank itself.
  const bool underCohortrun = std::getenv("COHORT_JOB_ID") && std::getenv("RANK");
  const std::string prefix = underCohortrun ? "cohort: " : "[rank " + cohort::runtime::rankForMessages() + "] cohort: ";
  return cohort::runMain(prefix, [&] { return run(argc, argv); });
}
