// tokenizeCorpus: the documents of a CorpusReader (nn/corpus_reader.h) encoded by GPT-2's tokenizer on
// a pool of threads, handed back in input order as uint16 ids, each document preceded by the
// tokenizer's "<|endoftext|>" id (as llm.c's FineWeb script writes its shards). The text of a
// document is encoded as ordinary text (Tokenizer::encode: "<|endoftext|>" inside it is seven tokens).
//
// How the work flows: the calling thread reads a batch (about a megabyte of text) and queues it; each
// of options.threads threads takes the next queued batch, parses its JSON lines, and encodes it with
// its own Encoder; once 2 x threads + 1 batches are held, the calling thread waits for the oldest and
// hands it to `sink` (the rest at the end), so the ids come out in input order whatever the number of
// threads, and memory does not grow with the input.
//
// A JSON line's document is its "text" string (nlohmann's parser: escapes, \uXXXX and surrogate
// pairs decoded; a lone surrogate refused). Errors, one line, thrown on the calling thread in input
// order (the first bad line of the input is the one named): InvalidArgument "FILE:LINE: invalid UTF-8
// at byte N of the line", "FILE:LINE: bad JSON: ...", "FILE:LINE: no \"text\" string in the JSON
// object" (or "a JSON line must be an object"); a tokenizer without "<|endoftext|>", or with ids past
// 65535 (llm.c's shards hold uint16); the reader's IoError; TimeoutError when a batch is not encoded
// within 10 minutes (a bug: a megabyte takes tens of milliseconds); whatever `sink` throws. The
// threads are joined before the call returns or throws.
// Thread safety: one call per reader; `sink` runs on the calling thread.
//
//   tokenizeCorpus(reader, tokenizer, {.threads = 2}, [&](const EncodedBatch& b) { write(b.tokens); });
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "nn/corpus_reader.h"
#include "nn/tokenizer.h"

namespace cohort::nn {

struct EncodedBatch {
  std::vector<uint16_t> tokens;
  struct DocumentStart {
    size_t token = 0;          // its "<|endoftext|>" is tokens[token]
    int64_t inputOffset = 0;   // where its text starts in the input (CorpusSegment::inputOffset)
  };
  std::vector<DocumentStart> documents;  // the documents that start in this batch, in order
  int64_t inputEnd = 0;                  // input bytes read up to the end of this batch
};

struct CorpusTokenizerOptions {
  int threads = 1;  // encoding threads, >= 1
};

// Returns the number of tokens handed to `sink`.
int64_t tokenizeCorpus(CorpusReader& reader, const Tokenizer& tokenizer, const CorpusTokenizerOptions& options,
                       const std::function<void(const EncodedBatch&)>& sink);

}  // namespace cohort::nn
