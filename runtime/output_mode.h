// OutputMode: the permissions a file Cohort writes ends with (runtime/output_file.h writes it). A
// header of its own, with no system includes, so that the installed headers (nn/checkpoint.h) can
// name it without reaching the POSIX ones.
#pragma once

namespace cohort::runtime {

enum class OutputMode {
  kPrivate,      // 0600: only the user reads it (checkpoints: the state a resume loads)
  kUserVisible,  // 0666 & ~umask, as the user's other tools create files
};

}  // namespace cohort::runtime
