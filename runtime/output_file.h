// OutputFile: how every output of Cohort is written (checkpoints, llm.c and HuggingFace exports,
// traces, plots, predictions): into a fresh temporary file beside the target, renamed over it only
// when every byte is on the disk. A reader sees the old complete file or the new one, never a part.
//
// On a shared machine the directory may be writable by others (/tmp) and the temporary's name is
// no secret, so the temporary is created the way mkostemp creates one: its name is
// "<dir>/.<base>.tmp.<pid>.<12 random hex digits>", opened O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC with
// mode 0600. A file or symbolic link that another user planted under any name is never opened,
// written through or adopted (O_EXCL fails and another random name is drawn). Only at commit() does
// the file get its final mode: kPrivate keeps 0600 (checkpoints: the state a resume loads);
// kUserVisible gives 0666 minus the process's umask, as any tool the user runs would (plots,
// predictions, exports, traces). commit() checks every write, the fsync and the close, renames the
// temporary over the target (a symbolic link at the target is replaced, never followed) and fsyncs
// the directory.
//
// Killed writers leave their temporaries behind; removeStaleTemporaries(path) removes them: a
// writer holds an exclusive flock on its temporary until the rename, so one that nobody holds and
// whose pid is gone is an orphan. It never removes a file that is not a regular file of this user
// (lstat: a symbolic link or another user's file under such a name stays where it is), nor one a
// live process is writing. The OutputFile constructor sweeps the target's orphans first.
//
// Errors: IoError "<path>: cannot create temporary file <tmp>: <errno text>" (likewise "cannot
// write", "cannot fsync", "cannot close", "cannot rename temporary file <tmp> over it", "written,
// but cannot fsync directory <dir>"); InvalidArgument for a path ending in '/'. On any error, and
// when an OutputFile is destroyed uncommitted, the temporary is removed and the target untouched.
// Ownership: owns the descriptor and the temporary. Thread safety: one thread per OutputFile;
// separate OutputFiles, even of one path in one process, never share a temporary.
//
//   runtime::OutputFile out(path, {.mode = runtime::OutputMode::kUserVisible});
//   out.write(text.data(), text.size());
//   out.commit();
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "runtime/output_mode.h"
#include "runtime/unique_fd.h"

namespace cohort::runtime {

struct OutputFileOptions {
  OutputMode mode = OutputMode::kUserVisible;
};

class OutputFile {
 public:
  explicit OutputFile(std::string path, OutputFileOptions options = {});
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& temporaryPath() const { return temporary_; }
  // The temporary's descriptor, for writers that want it (e.g. a stream); empty after commit().
  int fd() const { return fd_.get(); }

  // Writes all of `bytes` (short writes and EINTR retried) or throws IoError.
  void write(const void* data, size_t bytes);
  // Sets the final mode, fsyncs, closes, renames over path() and fsyncs the directory.
  void commit();

 private:
  std::string path_;
  std::string directory_;
  std::string temporary_;
  OutputFileOptions options_;
  UniqueFd fd_;
  UniqueFd lock_;  // the same open file (dup): keeps the flock after fd_ is closed, until the rename
  bool committed_ = false;
};

// The directory ("." when none is given) and the file name of `path`; InvalidArgument naming it
// when `path` ends in '/'.
std::pair<std::string, std::string> splitOutputPath(const std::string& path);

// Removes the temporaries of `path` that killed writers left (above). Returns how many; failures
// to look are not errors.
size_t removeStaleTemporaries(const std::string& path);

// Creates the directory `dir` and its missing parents as `mkdir -p` does (mode 0777 minus the
// umask): for the outputs whose directory a run makes, as nanoGPT makes its out_dir. A component
// that exists is used as it is (the user's path, symbolic links included). One that appears
// between the look and the mkdir (another rank making the same path) is taken only when it is a
// directory of this user and no symbolic link: one another user planted there is refused. Returns
// how many directories it created. IoError "<dir>: cannot create directory <component>: <why>".
int createDirectories(const std::string& dir);
// The directory `path` is in (splitOutputPath), created by createDirectories; messages name `path`.
int createParentDirectories(const std::string& path);

// 12 random hex digits from the kernel's generator, for names another user must not predict.
std::string unpredictableSuffix();

}  // namespace cohort::runtime
