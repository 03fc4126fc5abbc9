// Progress: rank 0's live progress within an epoch (issue 18) — the step, the job's samples/s, the
// loss so far and the ETA of the epoch and of the run, written to standard output as the training
// loop steps:
//
//   epoch 2/5 step 300/938 (31%) 51234 samples/s loss 0.3124 ETA epoch 0:12 run 1:02
//
// Modes (detectProgressMode() picks one for this process):
//  - kTerminal: stdout is a terminal. One line rewritten in place, "\r" + text + "\x1b[K" (erase to
//    the end of the line), at most 10 redraws a second, cut to the terminal's width so that it never
//    wraps (a wrapped line could not be rewritten with "\r"). It never writes a newline: endEpoch()
//    erases the line so that the epoch's summary line takes its place.
//  - kLauncher: under cohortrun whose own stdout is a terminal (it sets COHORT_PROGRESS=live). Each
//    update, at most 4 a second, is one whole line kProgressMarker + text + "\n"; cohortrun shows it
//    as its status line at the bottom of the terminal, below every rank's lines, and keeps it out of
//    log files (docs/launcher.md). endEpoch() sends the marker alone: "clear the status line".
//  - kPlain: a pipe, cohortrun's capture, a log file. "progress: " + text + "\n" every everySeconds
//    (the schedule runs from the first startEpoch() over the whole run, so epochs shorter than the
//    interval still get their lines); never a carriage return or an escape sequence.
//  - kOff: nothing (--progress-every 0, COHORT_PROGRESS=off).
// The figures: samples/s is this epoch's, rank 0's samples x samplesScale over the time since
// startEpoch(); the loss is the running mean over the epoch so far (weighted by samples, the same
// figure as the epoch's summary line on one rank), left out while no step had a known loss (NaN,
// e.g. on a GPU); the ETAs use the epoch's mean step time so far (steps done in this process, so a
// resumed epoch is timed from its resumption): epoch = mean x steps left in it, run = that plus mean
// x stepsPerEpoch for each later epoch, both counting no further than maxSteps when it is set (the
// run's step taken as epoch x stepsPerEpoch + the step in the epoch). Percent is rounded down; times are M:SS, or H:MM:SS from an
// hour on. Rate and ETAs are left out until some time has passed; step totals and ETAs when
// stepsPerEpoch is 0 (unknown).
//
// Every write is one write(2) of a whole line (or of one whole redraw) on options.fd; errors are
// ignored (a closed terminal must not stop training). step() costs a clock read and a compare when
// nothing is due, and never allocates: the text is formatted into a buffer the object owns.
//
// Log lines: in kTerminal a log line written to the same terminal while the live line shows would
// start after it on the same row. endEpoch() covers the epoch's summary line; before any other line
// logged within an epoch (a skipped non-finite step, a stop request, a checkpoint message, a
// warning) call clearLine(): it erases the live line, and the next step() draws it again. The
// destructor erases a line still showing (an exception leaving the loop). In kLauncher cohortrun
// keeps its status line apart from every other line itself, and in kPlain lines never share a row.
//
// Ownership: borrows options.fd (never closes it). Thread safety: none; the training thread only.
//
//   Progress progress({.mode = detectProgressMode(10), .epochs = 5, .stepsPerEpoch = 938});
//   progress.startEpoch(epoch, 0);
//   for (...) progress.step(step, batchSize, loss);
//   progress.endEpoch();
//   log.info() << "epoch ...";
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace cohort::train {

// Starts each kLauncher line; cohortrun's copy (launcher/output_pump.h) must be the same bytes
// (tests/launcher/output_pump_test checks it). An APC escape sequence ("ESC _ ... ESC \"), which
// terminals swallow, so the marker stays invisible should such a line ever reach one unfiltered.
inline constexpr std::string_view kProgressMarker = "\x1b_cohort-progress\x1b\\";

enum class ProgressMode { kOff, kTerminal, kLauncher, kPlain };

// "off", "terminal", "launcher", "plain".
const char* toString(ProgressMode mode);

struct ProgressOptions {
  ProgressMode mode = ProgressMode::kPlain;
  double everySeconds = 10;       // kPlain's interval (> 0; fractions allowed)
  int fd = 1;                     // where it writes (standard output)
  int64_t epochs = 1;             // of the run
  int64_t stepsPerEpoch = 0;      // optimizer steps per epoch; 0: unknown (no totals, no ETA)
  int64_t maxSteps = 0;           // > 0: the run stops after this many steps of the run (--max-steps)
  int64_t samplesScale = 1;       // rank 0's samples x this = the job's (world size where ranks step together)
  std::function<double()> clock;  // seconds, monotonic; empty: steady_clock (tests inject a fake one)
  std::string prefix;             // before kPlain and kTerminal text, e.g. the Logger's "[rank 0] "
};

// The mode for this process: kOff when everySeconds is not > 0; else what COHORT_PROGRESS says
// ("live": kLauncher, "plain": kPlain, "off": kOff; any other value is ignored); else kTerminal when
// `fd` is a terminal (isatty) other than TERM=dumb, and not the pseudo-terminal Open MPI gives every
// rank under mpirun (OMPI_COMM_WORLD_SIZE set); else kPlain.
ProgressMode detectProgressMode(double everySeconds, int fd = 1);

class Progress {
 public:
  explicit Progress(const ProgressOptions& options);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress();  // erases a live line (kTerminal) or status line (kLauncher) still showing

  // epoch: from 0; stepInEpoch: steps already done in it (a resumed run), timed from now.
  void startEpoch(int64_t epoch, int64_t stepInEpoch);
  // After each optimizer step: the epoch's steps so far (from 1), that step's samples on this rank,
  // its mean loss (NaN: unknown, e.g. on a GPU).
  void step(int64_t stepInEpoch, int64_t samples, double loss);
  // Before the epoch's summary line is logged: kTerminal erases the live line, kLauncher clears
  // cohortrun's status line; the next epoch's first step shows it again.
  void endEpoch();
  // Before a line is logged within an epoch (see the header comment): kTerminal erases the live
  // line and redraws it at the next step(); nothing in the other modes.
  void clearLine();

  ProgressMode mode() const { return options_.mode; }

 private:
  // Formats the progress text at time `now` into text_ and returns its length.
  size_t formatText(double now);
  void show(double now);
  void writeLine(std::string_view bytes) const;
  int terminalColumns() const;

  ProgressOptions options_;
  double interval_ = 0;     // between updates in this mode
  double nextDue_ = 0;      // step() writes once the clock reaches this
  bool scheduled_ = false;  // kPlain: nextDue_ set by the first startEpoch()
  bool showing_ = false;    // a live line (kTerminal) or status line (kLauncher) is up
  int64_t epoch_ = 0;
  int64_t stepInEpoch_ = 0;
  int64_t firstStep_ = 0;  // steps done before startEpoch() (resumed)
  double epochStart_ = 0;
  int64_t samples_ = 0;  // rank 0's, since startEpoch()
  double lossSum_ = 0;   // loss x samples over the steps with a known loss
  int64_t lossSamples_ = 0;
  char text_[512];  // the text of the last update
  char line_[640];  // the bytes of one write: prefix, escapes, text, newline
};

}  // namespace cohort::train
