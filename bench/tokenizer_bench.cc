// tokenizer_bench: how fast nn::Tokenizer encodes (tiktoken's encode_ordinary), one thread, for
// bench/tokenizer_bench.sh, which runs tiktoken (npm, Node) on the same text and prints the ratio.
//
//   tokenizer_bench TOKENIZER TEXT SECONDS
// encodes TEXT (read whole) again and again with one Encoder for at least SECONDS after one warm-up
// round, and prints "cohort MB/s <figure> tokens <count>" (MB: 10^6 bytes of TEXT). Exit 2 with one
// line for a bad argument or file.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "nn/tokenizer.h"
#include "runtime/error.h"

int main(int argc, char** argv) {
  return cohort::runMain("tokenizer_bench: ", [&] {
    if (argc != 4 || std::atof(argv[3]) <= 0) {
      COHORT_THROW(InvalidArgument) << "usage: tokenizer_bench TOKENIZER TEXT SECONDS (> 0)";
    }
    const cohort::nn::Tokenizer tokenizer = cohort::nn::Tokenizer::read(argv[1]);
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) COHORT_THROW(IoError) << argv[2] << ": cannot open";
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const double seconds = std::atof(argv[3]);
    cohort::nn::Tokenizer::Encoder encoder = tokenizer.encoder();
    std::vector<int32_t> ids;
    encoder.encode(text, ids);  // warm-up: buffers grown, pages touched
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    double elapsed = 0;
    int64_t rounds = 0;
    do {
      ids.clear();
      encoder.encode(text, ids);
      ++rounds;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < seconds);
    std::printf("cohort MB/s %.2f tokens %zu\n", static_cast<double>(text.size()) * rounds / elapsed / 1e6, ids.size());
    return 0;
  });
}
