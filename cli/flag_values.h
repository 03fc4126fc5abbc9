// Flag values that the cohort subcommands share and that CLI11 does not check or word the way our
// users need: a seed is a whole number 0..2^64-1, said so in one short line (CLI11's own range check
// prints 309 digits and wraps 2^64 to 0), and a flag given twice is named as such.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace cohort::cli {

// Every form --data (and --test-data) takes, for the --help of train, eval and predict
// (runtime::data::openDataset reads them; docs/data.md).
inline constexpr char kDataForms[] =
    "synthetic | synthetic-cifar[:N] | mnist:DIR | cifar10:DIR | csv:FILE | text:FILE (bytes as tokens) | "
    "tokens:PATTERN (llm.c's token shards, a file or a glob; cohort tokenize writes them) | tokens:raw:PATTERN "
    "(headerless uint16 shards, nanoGPT's)";

// What --tokenizer takes, wherever a command takes one (nn::Tokenizer::read).
inline constexpr char kTokenizerForms[] =
    "GPT-2's tokenizer, FILE or DIR (llm.c's gpt2_tokenizer.bin, HuggingFace's tokenizer.json or vocab.json + "
    "merges.txt, tiktoken's .tiktoken)";

// "--seed" on `command`, stored in `seed` (whose value is the default shown by --help).
CLI::Option* addSeedOption(CLI::App& command, uint64_t& seed, const std::string& help);

// `text` as a seed; InvalidArgument "--seed must be a whole number 0..18446744073709551615, got '-1'".
uint64_t parseSeed(const std::string& text);

// CLI11's message for a parse error, in our words where CLI11's are cryptic: "--lr: At Most 1 required
// but received 2" becomes "--lr is given 2 times; give it once".
std::string describeParseError(const std::string& message);

}  // namespace cohort::cli
