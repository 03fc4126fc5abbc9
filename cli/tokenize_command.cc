#include "cli/tokenize_command.h"

#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>  // CLI11: the flags
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>

#include "cli/flag_values.h"                     // kTokenizerForms
#include "cli/train_flags.h"                     // allowedCpus
#include "nn/corpus_reader.h"                    // documents from files
#include "nn/corpus_tokenizer.h"                 // encoding on a pool of threads, in input order
#include "nn/tokenizer.h"                        // GPT-2's tokenizer
#include "runtime/data/token_shard_writer.h"     // llm.c's shards
#include "runtime/error.h"
#include "runtime/process_memory.h"              // the summary's peak RSS

namespace cohort::cli {

void addTokenizeFlags(CLI::App& c, TokenizeFlags& f) {
  c.add_option("--tokenizer", f.tokenizer,
               kTokenizerForms)
      ->required();
  c.add_option("inputs", f.inputs, "text files: each a document, or with --split lines each line, or for .jsonl "
                                   "the \"text\" of each JSON line")
      ->required();
  c.add_option("--out-dir", f.outDir, "the folder the shards are written to (created)")->required();
  c.add_option("--name", f.name, "the shards' prefix: NAME_val_000000.bin, NAME_train_000001.bin, ... (default: the "
                                 "last component of --out-dir)");
  c.add_option("--split", f.split, "what a document is: auto (.jsonl: jsonl, else file), file, lines, jsonl")
      ->capture_default_str();
  c.add_option("--val-tokens", f.valTokens,
               "the first N tokens are the val split, as llm.c's scripts cut theirs (the document they end in goes on "
               "in train)");
  c.add_option("--val-fraction", f.valFraction, "the documents that start within the first F of the input's bytes are "
                                                "the val split (0 < F < 1)");
  c.add_option("--shard-tokens", f.shardTokens, "tokens per shard (llm.c's scripts: 100M)")->capture_default_str();
  c.add_option("--threads", f.threads, "encoding threads (default: the CPUs this process may use)");
  c.add_flag("--force", f.force, "replace shards of this name already in --out-dir");
  c.add_option("--progress-every", f.progressEvery,
               "seconds between progress lines when stdout is not a terminal; 0: no progress")
      ->capture_default_str();
}

namespace {

nn::DocumentForm documentForm(const std::string& split) {
  for (auto form : {nn::DocumentForm::kAuto, nn::DocumentForm::kFile, nn::DocumentForm::kLine, nn::DocumentForm::kJsonLine}) {
    if (split == nn::documentFormName(form)) return form;
  }
  throw InvalidArgument("--split must be auto, file, lines or jsonl, not '" + split + "'");
}

void checkFlags(const TokenizeFlags& f) {
  if (f.valTokens && f.valFraction) {
    COHORT_THROW(InvalidArgument) << "give the val split as --val-tokens N or as --val-fraction F, not both";
  }
  if (f.valTokens && *f.valTokens < 0) COHORT_THROW(InvalidArgument) << "--val-tokens must be >= 0, got " << *f.valTokens;
  if (f.valFraction && !(*f.valFraction > 0 && *f.valFraction < 1)) {
    COHORT_THROW(InvalidArgument) << "--val-fraction must be between 0 and 1 (exclusive), got " << *f.valFraction;
  }
  if (f.threads < 0 || f.threads > 1024) COHORT_THROW(InvalidArgument) << "--threads must be 1 to 1024, got " << f.threads;
  if (!(f.progressEvery >= 0)) COHORT_THROW(InvalidArgument) << "--progress-every must be >= 0, got " << f.progressEvery;
  if (f.outDir.empty()) COHORT_THROW(InvalidArgument) << "--out-dir is empty";
}

// --name, or the last component of the output folder.
std::string shardName(const TokenizeFlags& f) {
  std::string name = f.name;
  if (name.empty()) {
    std::string dir = f.outDir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    name = dir.substr(dir.find_last_of('/') == std::string::npos ? 0 : dir.find_last_of('/') + 1);
    if (name.empty() || name == "." || name == ".." || name == "/") name = "corpus";
  }
  if (name.find('/') != std::string::npos) COHORT_THROW(InvalidArgument) << "--name '" << name << "' holds a '/'";
  return name;
}

// Creates `dir` and its parents (0755); refuses a symbolic link or a non-directory at `dir`.
void makeOutputDir(const std::string& dir) {
  for (size_t at = dir.find('/', 1); ; at = dir.find('/', at + 1)) {
    const std::string part = dir.substr(0, at);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      COHORT_THROW(IoError) << part << ": cannot create the directory: " << std::strerror(errno);
    }
    if (at == std::string::npos) break;
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) COHORT_THROW(IoError) << dir << ": " << std::strerror(errno);
  if (S_ISLNK(st.st_mode)) {
    COHORT_THROW(InvalidArgument) << "--out-dir " << dir << " is a symbolic link: give the directory it points to";
  }
  if (!S_ISDIR(st.st_mode)) COHORT_THROW(InvalidArgument) << "--out-dir " << dir << " is not a directory";
}

// Whether `file` is a shard of `name`: NAME_val_DIGITS.bin or NAME_train_DIGITS.bin.
bool isShardOf(const std::string& file, const std::string& name) {
  for (const char* split : {"_val_", "_train_"}) {
    const std::string prefix = name + split;
    if (file.size() <= prefix.size() + 4 || file.compare(0, prefix.size(), prefix) != 0 || !file.ends_with(".bin")) continue;
    const std::string digits = file.substr(prefix.size(), file.size() - prefix.size() - 4);
    if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return true;
  }
  return false;
}

std::vector<std::string> shardsIn(const std::string& dir, const std::string& name) {
  std::vector<std::string> found;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) COHORT_THROW(IoError) << dir << ": cannot list: " << std::strerror(errno);
  while (const dirent* entry = ::readdir(d)) {
    if (isShardOf(entry->d_name, name)) found.push_back(dir + "/" + entry->d_name);
  }
  ::closedir(d);
  std::sort(found.begin(), found.end());
  return found;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The progress line: on a terminal rewritten in place ("\r" ... erase to the end of the row) at most
// 10 times a second; otherwise a plain line every `every` seconds.
class ProgressLine {
 public:
  ProgressLine(double every, int64_t totalBytes)
      : totalBytes_(totalBytes), start_(now()) {
    const char* term = std::getenv("TERM");
    terminal_ = every > 0 && ::isatty(1) == 1 && !(term != nullptr && std::strcmp(term, "dumb") == 0);
    interval_ = terminal_ ? 0.1 : every;
    next_ = start_ + interval_;
  }
  ~ProgressLine() { clear(); }

  void update(int64_t inputBytes, int64_t tokens) {
    const double t = now();
    if (interval_ <= 0 || t < next_) return;
    next_ = t + interval_;
    const double seconds = t - start_, mb = static_cast<double>(inputBytes) / 1e6;
    const double percent = totalBytes_ > 0 ? 100.0 * static_cast<double>(inputBytes) / static_cast<double>(totalBytes_) : 100;
    char text[256];
    std::snprintf(text, sizeof text, "tokenize: %.1f/%.1f MB (%.0f%%) %.1f MB/s %lld tokens", mb,
                  static_cast<double>(totalBytes_) / 1e6, percent, mb / std::max(seconds, 1e-9),
                  static_cast<long long>(tokens));
    std::printf(terminal_ ? "\r%s\x1b[K" : "%s\n", text);
    std::fflush(stdout);
    showing_ = terminal_;
  }
  void clear() {
    if (!showing_) return;
    std::printf("\r\x1b[K");
    std::fflush(stdout);
    showing_ = false;
  }

 private:
  int64_t totalBytes_;
  double start_, interval_ = 0, next_ = 0;
  bool terminal_ = false, showing_ = false;
};

// The val rule (tokenize_command.h) over the encoded stream, into the writer.
class SplitSink {
 public:
  SplitSink(const TokenizeFlags& f, int64_t totalBytes, runtime::data::TokenShardWriter& writer)
      : valTokens_(f.valTokens.value_or(0)),
        valBytes_(static_cast<int64_t>(f.valFraction.value_or(0) * static_cast<double>(totalBytes))),
        writer_(writer) {
    inVal_ = valTokens_ > 0 || valBytes_ > 0;
    writer_.beginSplit(inVal_ ? runtime::data::TokenSplit::kVal : runtime::data::TokenSplit::kTrain);
  }

  void operator()(const nn::EncodedBatch& batch) {
    documents_ += static_cast<int64_t>(batch.documents.size());
    if (valTokens_ > 0) {  // exactly the first N tokens, as llm.c's scripts cut theirs
      const size_t take = inVal_ ? std::min(batch.tokens.size(), static_cast<size_t>(valTokens_ - inValTokens_)) : 0;
      write(batch, 0, take);
      if (inVal_ && inValTokens_ == valTokens_) {
        inVal_ = false;
        writer_.beginSplit(runtime::data::TokenSplit::kTrain);
      }
      write(batch, take, batch.tokens.size());
      return;
    }
    size_t from = 0;
    for (const nn::EncodedBatch::DocumentStart& document : batch.documents) {
      if (!inVal_) break;
      write(batch, from, document.token);
      from = document.token;
      if (document.inputOffset >= valBytes_) {
        inVal_ = false;
        writer_.beginSplit(runtime::data::TokenSplit::kTrain);
      }
    }
    write(batch, from, batch.tokens.size());
  }
  int64_t documents() const { return documents_; }

 private:
  void write(const nn::EncodedBatch& batch, size_t from, size_t to) {
    writer_.append(std::span<const uint16_t>(batch.tokens.data() + from, to - from));
    if (inVal_) inValTokens_ += static_cast<int64_t>(to - from);
  }

  const int64_t valTokens_;  // > 0: --val-tokens
  const int64_t valBytes_;   // > 0: --val-fraction's share of the input bytes
  runtime::data::TokenShardWriter& writer_;
  bool inVal_ = false;
  int64_t inValTokens_ = 0, documents_ = 0;
};

// "val: 1234 tokens in 1 shard: DIR/NAME_val_000000.bin" (first and last shard named).
void printSplit(const std::vector<runtime::data::WrittenShard>& shards, runtime::data::TokenSplit split) {
  int64_t tokens = 0, count = 0;
  const runtime::data::WrittenShard *first = nullptr, *last = nullptr;
  for (const auto& s : shards) {
    if (s.split != split) continue;
    tokens += s.tokens;
    ++count;
    if (!first) first = &s;
    last = &s;
  }
  if (count == 0 && split == runtime::data::TokenSplit::kVal) {
    std::printf("val: none (--val-tokens N or --val-fraction F makes one)\n");
    return;
  }
  std::printf("%s: %lld tokens in %lld shard%s", runtime::data::tokenSplitName(split), static_cast<long long>(tokens),
              static_cast<long long>(count), count == 1 ? "" : "s");
  if (first) std::printf(": %s%s%s", first->path.c_str(), count > 1 ? " .. " : "", count > 1 ? last->path.c_str() : "");
  std::printf("\n");
}

// Removes `paths` (best effort: on the way out of a failed run, or old shards replaced by --force).
void removeAll(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) (void)::unlink(p.c_str());
}

}  // namespace

int runTokenize(const TokenizeFlags& flags) {
  checkFlags(flags);
  TokenizeFlags f = flags;
  while (f.outDir.size() > 1 && f.outDir.back() == '/') f.outDir.pop_back();  // lstat must not follow a link
  const nn::DocumentForm form = documentForm(f.split);
  const std::string name = shardName(f);
  const nn::Tokenizer tokenizer = nn::Tokenizer::read(f.tokenizer);
  nn::CorpusReader reader({.paths = f.inputs, .form = form});
  makeOutputDir(f.outDir);
  const std::vector<std::string> existing = shardsIn(f.outDir, name);
  if (!existing.empty() && !f.force) {
    COHORT_THROW(InvalidArgument) << f.outDir << " already holds " << existing.size() << " shard"
                                  << (existing.size() == 1 ? "" : "s") << " of " << name << " (" << existing.front()
                                  << "): give --force to replace them, or another --out-dir or --name";
  }
  const int threads = f.threads > 0 ? f.threads : std::max(allowedCpus(), 1);
  runtime::data::TokenShardWriter writer({.dir = f.outDir, .name = name, .shardTokens = f.shardTokens});
  SplitSink split(f, reader.totalBytes(), writer);
  const double start = now();
  int64_t tokens = 0, inputBytes = 0;
  try {
    ProgressLine progress(f.progressEvery, reader.totalBytes());
    nn::tokenizeCorpus(reader, tokenizer, {.threads = threads}, [&](const nn::EncodedBatch& batch) {
      split(batch);
      tokens += static_cast<int64_t>(batch.tokens.size());
      inputBytes = batch.inputEnd;
      progress.update(inputBytes, tokens);
    });
    writer.finish();
  } catch (...) {
    std::vector<std::string> wrote;
    for (const auto& s : writer.written()) wrote.push_back(s.path);
    removeAll(wrote);
    throw;
  }
  const std::vector<runtime::data::WrittenShard>& shards = writer.written();
  std::vector<std::string> stale;  // --force: old shards of this name the run did not write over
  for (const std::string& p : existing) {
    if (std::none_of(shards.begin(), shards.end(), [&](const auto& s) { return s.path == p; })) stale.push_back(p);
  }
  removeAll(stale);
  const double seconds = std::max(now() - start, 1e-9);
  printSplit(shards, runtime::data::TokenSplit::kVal);
  printSplit(shards, runtime::data::TokenSplit::kTrain);
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  const double cpu = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                     static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  std::printf("tokenized %lld documents, %.1f MB, in %.1f s with %d thread%s: %.1f MB/s, %lld tokens; CPU %.2f s, "
              "peak RSS %.1f MB\n",
              static_cast<long long>(split.documents()), static_cast<double>(inputBytes) / 1e6, seconds, threads,
              threads == 1 ? "" : "s", static_cast<double>(inputBytes) / 1e6 / seconds, static_cast<long long>(tokens),
              cpu, static_cast<double>(runtime::processMemory().peakResidentBytes) / 1e6);
  return 0;
}

}  // namespace cohort::cli
