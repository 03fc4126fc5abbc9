// `cohort tokenize`: text corpora into llm.c's token shards (issue 47), the files `--data tokens:`
// trains on (runtime/data/token_shards.h).
//
//   cohort tokenize --tokenizer gpt2.tiktoken corpus.jsonl --out-dir data/corpus --val-tokens 1000000
//   cohort tokenize --tokenizer DIR --split lines a.txt b.txt --out-dir data/lines --shard-tokens 10000000
//
// Each document (a file, a line with --split lines, the "text" of each JSON line of a .jsonl:
// nn/corpus_reader.h) is encoded as ordinary text by GPT-2's tokenizer and preceded by its
// "<|endoftext|>" id, as llm.c's FineWeb script writes its shards (nn/corpus_tokenizer.h). The stream
// is cut into shards of --shard-tokens tokens (runtime/data/token_shard_writer.h): val first, then
// train, numbered over both: NAME_val_000000.bin, NAME_train_000001.bin, ... NAME is --name, by
// default the last component of --out-dir.
// The validation split is the start of the input: with --val-tokens N, exactly its first N tokens,
// as llm.c's scripts cut theirs (the first shard of FineWeb, the first 32768 tokens of
// tinyshakespeare), the document they end in going on in train; with --val-fraction F, the whole
// documents that start within the first F of the input's bytes. Without either, there is no val split.
//
// --threads N threads encode (default: the CPUs this process may use); the shards are the same bytes
// whatever N. Memory stays bounded however large the input (a few megabytes a thread). Progress: on a
// terminal one line rewritten in place, otherwise a plain line every --progress-every seconds (0: none).
// --out-dir is created (mode 0755, parents too) and must not be a symbolic link; shards of NAME already
// in it are refused unless --force, which replaces them and removes those of NAME the run did not
// write. A run that fails removes the shards it wrote. stdout ends with one line per split and
// "tokenized D documents, X MB, in T s with N threads: R MB/s, K tokens; CPU C s, peak RSS M MB"
// (bench/tokenize_bench.sh reads it).
// Exit 2 with one line (InvalidArgument, IoError): a bad flag, an unreadable input or tokenizer, a
// tokenizer of more than 65536 tokens or without "<|endoftext|>", a bad JSON line (FILE:LINE: invalid
// UTF-8, bad JSON, no "text" string), existing shards without --force, a write that fails.
// Thread safety: runTokenize runs on the calling thread (and its own encoding threads).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cohort::cli {

struct TokenizeFlags {
  std::string tokenizer;
  std::vector<std::string> inputs;
  std::string outDir;
  std::string name;                   // empty: the last component of outDir
  std::string split = "auto";         // auto, file, lines, jsonl
  std::optional<int64_t> valTokens;   // --val-tokens
  std::optional<double> valFraction;  // --val-fraction
  int64_t shardTokens = 100'000'000;  // llm.c's scripts' shard size
  int threads = 0;                    // 0: the CPUs allowed
  bool force = false;
  double progressEvery = 5;           // seconds between plain progress lines; 0: none
};

void addTokenizeFlags(CLI::App& app, TokenizeFlags& flags);
int runTokenize(const TokenizeFlags& flags);

}  // namespace cohort::cli
