// What `cohort train --sample-every` samples with: --tokenizer read and checked against the model,
// --sample-prompt as token ids (encoded by the tokenizer, "<|endoftext|>" its special token; without
// one, the prompt's bytes for a byte vocabulary), and the decoder of the sampled ids (the
// tokenizer's pieces; bytes for a byte vocabulary). InvalidArgument for a tokenizer larger than the
// vocabulary (or smaller by 128 or more), a prompt longer than the context, or a vocabulary past
// bytes without a tokenizer; IoError for an unreadable tokenizer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/train_flags.h"
#include "nn/model.h"
#include "nn/tokenizer.h"

namespace cohort::cli {

struct TrainSamples {
  std::vector<int64_t> prompt;                 // empty without --sample-every
  std::function<std::string(int64_t)> decode;  // id -> text
};

// `tokenizer`: --tokenizer's, read once by the caller; null without one.
TrainSamples trainSamples(const TrainFlags& flags, const nn::Model& model,
                          std::shared_ptr<const nn::Tokenizer> tokenizer);

}  // namespace cohort::cli
