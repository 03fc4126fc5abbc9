#include "nn/corpus_tokenizer.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "runtime/error.h"
#include "runtime/printable.h"

namespace cohort::nn {
namespace {

// A megabyte of text encodes in milliseconds; a batch still not done after this is a bug.
constexpr auto kBatchTimeout = std::chrono::minutes(10);

// The offset of the first byte of `text` that is not part of well-formed UTF-8, or npos.
size_t firstInvalidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {
      ++i;
      continue;
    }
    size_t length = runtime::printable_detail::utf8SequenceLength(text, i);
    const bool c1 = byte == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9f;  // U+0080..U+009F: well-formed too
    if (length == 0 && c1) length = 2;
    if (length == 0) return i;
    i += length;
  }
  return std::string_view::npos;
}

// The "text" string of one JSON line; InvalidArgument (without the line's place) when there is none.
std::string jsonText(std::string_view line) {
  if (const size_t bad = firstInvalidUtf8(line); bad != std::string_view::npos) {
    COHORT_THROW(InvalidArgument) << "invalid UTF-8 at byte " << bad + 1 << " of the line";
  }
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at ..."
    if (const size_t at = what.find("] "); at != std::string::npos) what.erase(0, at + 2);
    COHORT_THROW(InvalidArgument) << "bad JSON: " << runtime::printable(what, 200);
  }
  if (!value.is_object()) {
    COHORT_THROW(InvalidArgument) << "a JSON line must be an object with a \"text\" string, not " << value.type_name();
  }
  const auto text = value.find("text");
  if (text == value.end() || !text->is_string()) {
    COHORT_THROW(InvalidArgument) << "no \"text\" string in the JSON object"
                                  << (text == value.end() ? "" : std::string(" (\"text\" is ") + text->type_name() + ")");
  }
  return std::move(text->get_ref<std::string&>());
}

struct Job {
  CorpusBatch input;
  EncodedBatch output;
  std::exception_ptr error;
  bool done = false;
};

// One batch's documents into job.output (see the header for what is written).
void encodeBatch(Job& job, Tokenizer::Encoder& encoder, std::vector<int32_t>& ids, const std::vector<std::string>& paths,
                 uint16_t eot) {
  EncodedBatch& out = job.output;
  out.inputEnd = job.input.inputEnd;
  std::string json;
  for (const CorpusSegment& segment : job.input.segments) {
    std::string_view text(job.input.bytes.data() + segment.offset, segment.size);
    if (segment.json) {
      try {
        json = jsonText(text);
      } catch (const InvalidArgument& e) {
        COHORT_THROW(InvalidArgument) << paths[segment.file] << ":" << segment.line << ": " << e.what();
      }
      text = json;
    }
    if (segment.startsDocument) {
      out.documents.push_back({.token = out.tokens.size(), .inputOffset = segment.inputOffset});
      out.tokens.push_back(eot);
    }
    ids.clear();
    encoder.encode(text, ids);
    // Every id is below the tokenizer's size, checked to be at most 65536 before any batch.
    out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
  }
}

// The threads that encode batches; each job's done is set under the mutex, and waited for with a
// deadline.
class EncodePool {
 public:
  EncodePool(const Tokenizer& tokenizer, const std::vector<std::string>& paths, int threads)
      : paths_(paths), eot_(static_cast<uint16_t>(tokenizer.eotId())) {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this, encoder = tokenizer.encoder()]() mutable { work(encoder); });
  }
  ~EncodePool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  EncodePool(const EncodePool&) = delete;
  EncodePool& operator=(const EncodePool&) = delete;

  void submit(std::shared_ptr<Job> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(job));
    }
    queued_.notify_one();
  }

  void wait(const Job& job) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!finished_.wait_for(lock, kBatchTimeout, [&] { return job.done; })) {
      COHORT_THROW(TimeoutError) << "tokenize: a batch of " << job.input.bytes.size() << " bytes was not encoded within "
                                 << std::chrono::duration_cast<std::chrono::seconds>(kBatchTimeout).count() << " s";
    }
  }

 private:
  void work(Tokenizer::Encoder& encoder) {
    std::vector<int32_t> ids;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        encodeBatch(*job, encoder, ids, paths_, eot_);
      } catch (...) {
        job->error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        job->done = true;
      }
      finished_.notify_all();
    }
  }

  const std::vector<std::string>& paths_;
  const uint16_t eot_;
  std::mutex mutex_;
  std::condition_variable queued_, finished_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

void checkTokenizer(const Tokenizer& tokenizer) {
  const std::string& path = tokenizer.vocabulary().path;
  if (tokenizer.size() > 65536) {
    COHORT_THROW(InvalidArgument) << path << ": a tokenizer of " << tokenizer.size()
                                  << " tokens: llm.c's shards hold ids as uint16, below 65536";
  }
  if (tokenizer.eotId() < 0) {
    COHORT_THROW(InvalidArgument) << path << ": the tokenizer has no " << kEndOfText
                                  << " token to put before each document";
  }
  (void)tokenizer.encoder();  // InvalidArgument now for a vocabulary that cannot encode
}

}  // namespace

int64_t tokenizeCorpus(CorpusReader& reader, const Tokenizer& tokenizer, const CorpusTokenizerOptions& options,
                       const std::function<void(const EncodedBatch&)>& sink) {
  COHORT_CHECK(options.threads >= 1) << options.threads;
  checkTokenizer(tokenizer);
  EncodePool pool(tokenizer, reader.paths(), options.threads);
  const size_t maxHeld = 2 * static_cast<size_t>(options.threads) + 1;
  std::deque<std::shared_ptr<Job>> held;  // queued or done, in input order
  std::exception_ptr readError;           // thrown after the batches read before it
  int64_t tokens = 0;
  auto handOldest = [&] {
    const std::shared_ptr<Job> job = std::move(held.front());
    held.pop_front();
    pool.wait(*job);
    if (job->error) std::rethrow_exception(job->error);
    tokens += static_cast<int64_t>(job->output.tokens.size());
    sink(job->output);
  };
  for (;;) {
    auto job = std::make_shared<Job>();
    bool more = false;
    try {
      more = reader.next(job->input);
    } catch (...) {
      readError = std::current_exception();
    }
    if (!more) break;
    pool.submit(job);
    held.push_back(std::move(job));
    if (held.size() >= maxHeld) handOldest();
  }
  while (!held.empty()) handOldest();
  if (readError) std::rethrow_exception(readError);
  return tokens;
}

}  // namespace cohort::nn
