// `cohort train`: the job its flags (cli/train_flags.h; README.md, "`cohort train`") describe.
//
// runTrain() validates the flags, turns them into the public API's options (train::Job,
// train::Trainer), builds the data, model, optimizer and loss from their specs, runs the Trainer and
// prints the RESULT line on rank 0. Everything that makes the run multi-process is the Job's: cli/
// includes no header of the strategies, segments or communicators (tests/cli/cli_layering_test).
// Errors are thrown as cohort::Error (the main maps them to exit codes).
#pragma once

#include "cli/train_flags.h"

namespace cohort::cli {

// Returns the exit code: 0, or 128 + the signal after a stop on SIGTERM or SIGHUP (cli/stop_signal.h).
int runTrain(const TrainFlags& flags);

}  // namespace cohort::cli
