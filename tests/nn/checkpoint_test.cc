#include "nn/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/error.h"

namespace cohort::nn {
namespace {

using runtime::Shape;
using runtime::Tensor;
using Json = nlohmann::ordered_json;

// Distinct bit patterns per element, including NaNs with payloads, infinities, -0 and denormals:
// only a byte-exact round trip preserves them all.
Tensor patterned(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, runtime::cpuAllocator());
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint32_t bits = (seed + 1) * 0x9E3779B9u ^ static_cast<uint32_t>(i) * 0x85EBCA6Bu;
    bits ^= bits >> 13;
    std::memcpy(&t.at(i), &bits, sizeof bits);
  }
  return t;
}

std::vector<NamedTensor> sampleTensors(uint32_t seed = 0) {
  return {{"fc1.weight", patterned(Shape{3, 4}, seed + 1)},
          {"fc1.bias", patterned(Shape{4}, seed + 2)},
          {"empty", patterned(Shape{0}, seed + 3)},
          {"scalar", patterned(Shape{}, seed + 4)},
          {"one", patterned(Shape{1}, seed + 5)},
          {"empty2", patterned(Shape{2, 0, 3}, seed + 6)},
          {"conv.w", patterned(Shape{2, 3, 2, 2}, seed + 7)}};
}

void expectSameTensors(const std::vector<NamedTensor>& got, const std::vector<NamedTensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    ASSERT_EQ(got[i].tensor.shape(), want[i].tensor.shape()) << want[i].name;
    if (want[i].tensor.bytes() > 0) {
      EXPECT_EQ(std::memcmp(got[i].tensor.data(), want[i].tensor.data(), want[i].tensor.bytes()), 0)
          << want[i].name;
    }
  }
}

std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string lengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out;
}

uint64_t headerLength(const std::string& file) {
  uint64_t n = 0;
  for (size_t i = 8; i-- > 0;) n = (n << 8) | static_cast<unsigned char>(file[i]);
  return n;
}

// A file with `headerText` as its header (padded to 8 bytes) and `data` as its byte buffer.
void writeRaw(const std::string& path, std::string headerText, const std::string& data) {
  headerText.append((8 - headerText.size() % 8) % 8, ' ');
  writeBytes(path, lengthPrefix(headerText.size()) + headerText + data);
}

// Reads a valid file, lets `edit` change its parsed header and/or data, and writes it back.
void rewrite(const std::string& path, const std::function<void(Json&, std::string&)>& edit) {
  std::string file = readBytes(path);
  uint64_t n = headerLength(file);
  Json header = Json::parse(file.substr(8, n));
  std::string data = file.substr(8 + n);
  edit(header, data);
  writeRaw(path, header.dump(), data);
}

// Expects readCheckpoint to refuse with a one-line IoError naming the file and containing `phrase`.
std::string expectRefused(const std::string& path, const std::string& phrase) {
  try {
    readCheckpoint(path);
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(phrase), std::string::npos) << "wanted '" << phrase << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "readCheckpoint(" << path << ") did not refuse; wanted '" << phrase << "'";
  return "";
}

std::vector<std::string> listDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/checkpoint_test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
    path_ = dir_ + "/model.safetensors";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A valid checkpoint of sampleTensors() at path_.
  void writeSample() { writeCheckpoint(path_, sampleTensors(), {{"step", "7"}}); }

  std::string dir_;
  std::string path_;
};

TEST(Crc32c, MatchesTheStandardCheckValueAndChains) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(check, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(check + 4, 5, crc32c(check, 4)), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST_F(CheckpointTest, RoundTripIsBitExact) {
  std::vector<NamedTensor> tensors = sampleTensors();
  writeCheckpoint(path_, tensors, {});
  Checkpoint ckpt = readCheckpoint(path_);
  expectSameTensors(ckpt.tensors, tensors);
  EXPECT_TRUE(ckpt.metadata.empty());
  ASSERT_NE(ckpt.find("fc1.bias"), nullptr);
  EXPECT_EQ(ckpt.find("fc1.bias")->shape(), (Shape{4}));
  EXPECT_EQ(ckpt.find("nope"), nullptr);
}

TEST_F(CheckpointTest, LargerTensorsAndNoTensorsRoundTrip) {
  std::vector<NamedTensor> big = {{"a", patterned(Shape{1000, 3001}, 1)},
                                  {"b", patterned(Shape{7}, 2)}};
  writeCheckpoint(path_, big);
  expectSameTensors(readCheckpoint(path_).tensors, big);
  writeCheckpoint(path_, {}, {{"k", "v"}});
  Checkpoint ckpt = readCheckpoint(path_);
  EXPECT_TRUE(ckpt.tensors.empty());
  EXPECT_EQ(ckpt.metadata, (Metadata{{"k", "v"}}));
}

TEST_F(CheckpointTest, MetadataRoundTrips) {
  Metadata meta = {{"step", "1200"},
                   {"epoch", "3"},
                   {"rng", "0123456789abcdef0123456789abcdef"},
                   {"quoted \"key\"", "back\\slash\nnew line\ttab"},
                   {"unicode", "\xc3\xa9t\xc3\xa9 \xe2\x88\x87"},
                   {"empty", ""},
                   {"", "empty key"}};
  std::vector<NamedTensor> tensors = {{"\xe5\xb1\x82.weight", patterned(Shape{2, 2}, 9)}};
  writeCheckpoint(path_, tensors, meta);
  Checkpoint ckpt = readCheckpoint(path_);
  EXPECT_EQ(ckpt.metadata, meta);  // reserved keys are not handed back
  expectSameTensors(ckpt.tensors, tensors);
}

TEST_F(CheckpointTest, LayoutIsPlainSafetensors) {
  std::vector<NamedTensor> tensors = sampleTensors();
  writeCheckpoint(path_, tensors, {{"step", "7"}});
  std::string file = readBytes(path_);
  uint64_t n = headerLength(file);
  ASSERT_LE(8 + n, file.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "byte buffer must start 8-byte aligned";
  std::string text = file.substr(8, n);
  EXPECT_EQ(text.front(), '{');
  size_t last = text.find_last_not_of(' ');
  EXPECT_EQ(text[last], '}');
  EXPECT_LT(text.size() - last - 1, 8u) << "padding is spaces only, fewer than 8";
  // Parsed independently of the reader: the layout safetensors and PyTorch expect.
  Json header = Json::parse(text);
  const std::string data = file.substr(8 + n);
  const Json& meta = header["__metadata__"];
  EXPECT_EQ(meta["format"], "cohort-checkpoint-v1");
  EXPECT_EQ(meta["step"], "7");
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const Json& e = header[t.name];
    EXPECT_EQ(e["dtype"], "F32");
    std::vector<int64_t> dims(t.tensor.shape().rank());
    for (int i = 0; i < t.tensor.rank(); ++i) dims[static_cast<size_t>(i)] = t.tensor.dim(i);
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), dims) << t.name;
    EXPECT_EQ(e["data_offsets"], Json::array({offset, offset + t.tensor.bytes()})) << t.name;
    EXPECT_EQ(data.compare(offset, t.tensor.bytes(),
                           reinterpret_cast<const char*>(t.tensor.data()), t.tensor.bytes()),
              0);
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", crc32c(t.tensor.data(), t.tensor.bytes()));
    EXPECT_EQ(meta["crc32c." + t.name], crc) << t.name;
    offset += t.tensor.bytes();
  }
  EXPECT_EQ(offset, data.size()) << "tensors cover the byte buffer exactly";
  EXPECT_EQ(header.size(), tensors.size() + 1);
  for (const auto& [key, value] : meta.items()) EXPECT_TRUE(value.is_string()) << key;
}

TEST_F(CheckpointTest, WriteRefusesBadInputBeforeTouchingDisk) {
  Tensor t = patterned(Shape{2}, 1);
  using Tensors = std::vector<NamedTensor>;
  EXPECT_THROW(writeCheckpoint(path_, Tensors{{"a", t}, {"a", t}}), InvalidArgument);
  EXPECT_THROW(writeCheckpoint(path_, Tensors{{"", t}}), InvalidArgument);
  EXPECT_THROW(writeCheckpoint(path_, Tensors{{"__metadata__", t}}), InvalidArgument);
  EXPECT_THROW(writeCheckpoint(path_, Tensors{{"a", Tensor()}}), InvalidArgument);
  EXPECT_THROW(writeCheckpoint(path_, Tensors{{"a", t}}, {{"format", "x"}}), InvalidArgument);
  EXPECT_THROW(writeCheckpoint(path_, Tensors{{"a", t}}, {{"crc32c.a", "0"}}), InvalidArgument);
  EXPECT_THROW(writeCheckpoint(path_, Tensors{{"a", t}}, {{"header_crc32c", "0"}}),
               InvalidArgument);
  EXPECT_THROW(writeCheckpoint(path_, Tensors{{"a", t}}, {{"k", "\xff"}}), InvalidArgument);
  EXPECT_TRUE(listDir(dir_).empty());
}

// ---- Corrupt and malformed files -------------------------------------------------------------

TEST_F(CheckpointTest, RefusesMissingShortAndNonRegularFiles) {
  expectRefused(path_, "No such file or directory");
  expectRefused(dir_, "not a regular file");
  for (size_t n : {0, 1, 7}) {
    writeBytes(path_, std::string(n, '\0'));
    expectRefused(path_, "shorter than the 8-byte header length");
  }
}

TEST_F(CheckpointTest, RefusesBadHeaderLength) {
  writeSample();
  std::string file = readBytes(path_);
  writeBytes(path_, lengthPrefix(file.size() - 7) + file.substr(8));
  expectRefused(path_, "runs past the end of the file");
  writeBytes(path_, lengthPrefix(100'000'001) + file.substr(8));
  expectRefused(path_, "is absurd");
  writeBytes(path_, lengthPrefix(~uint64_t{0}) + file.substr(8));
  expectRefused(path_, "is absurd");
}

TEST_F(CheckpointTest, RefusesHeadersThatAreNotAJsonObject) {
  writeRaw(path_, "{\"a\": garbage}", "");
  expectRefused(path_, "header is not valid JSON (near byte ");
  writeRaw(path_, "", "");
  expectRefused(path_, "header is not valid JSON");
  writeRaw(path_, "{\"__metadata__\": {\"format\": \"\xff\xfe\"}}", "");
  expectRefused(path_, "header is not valid JSON");
  writeRaw(path_, "{\"" + std::string(100000, 'x'), "");
  EXPECT_LT(expectRefused(path_, "header is not valid JSON").size(), 1100u);
  writeRaw(path_, "[1, 2, 3]", "");
  expectRefused(path_, "header is not a JSON object");
  writeRaw(path_, "{}", "");
  expectRefused(path_, "no \"__metadata__\"");
}

TEST_F(CheckpointTest, RefusesEntriesWithMissingOrMistypedFields) {
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases = {
      {[](Json& h) { h["fc1.bias"].erase("dtype"); }, "tensor 'fc1.bias' has no \"dtype\""},
      {[](Json& h) { h["fc1.bias"].erase("shape"); }, "has no \"shape\""},
      {[](Json& h) { h["fc1.bias"].erase("data_offsets"); }, "has no \"data_offsets\""},
      {[](Json& h) { h["fc1.bias"] = 5; }, "entry for tensor 'fc1.bias' is not an object"},
      {[](Json& h) { h["fc1.bias"]["dtype"] = 32; }, "dtype is not a string"},
      {[](Json& h) { h["fc1.bias"]["dtype"] = "F16"; }, "unsupported dtype 'F16'"},
      {[](Json& h) { h["fc1.bias"]["dtype"] = "F64"; }, "unsupported dtype 'F64'"},
      {[](Json& h) { h["fc1.bias"]["shape"] = "4"; }, "shape is not an array"},
      {[](Json& h) { h["fc1.bias"]["shape"] = {-4}; }, "negative dimension -4"},
      {[](Json& h) { h["fc1.bias"]["shape"] = {4.0}; }, "is not an integer"},
      {[](Json& h) { h["fc1.bias"]["shape"] = {1, 1, 1, 1, 1, 1, 4}; }, "rank 7 above"},
      {[](Json& h) { h["fc1.bias"]["shape"] = {5}; }, "needs 5 x 4 bytes"},
      {[](Json& h) { h["fc1.bias"]["data_offsets"] = {48}; }, "not a pair"},
      {[](Json& h) { h["fc1.bias"]["data_offsets"] = {48, -64}; }, "not a pair"},
      {[](Json& h) { h["fc1.bias"]["data_offsets"] = {64, 48}; }, "end before they begin"},
      {[](Json& h) { h["__metadata__"] = Json::array(); }, "\"__metadata__\" is not a JSON object"},
      {[](Json& h) { h["__metadata__"]["step"] = 7; }, "metadata value for 'step' is not a string"},
      {[](Json& h) { h["__metadata__"].erase("format"); }, "metadata has no \"format\""},
      {[](Json& h) { h["__metadata__"]["format"] = "pt"; }, "unsupported checkpoint format 'pt'"},
  };
  for (const auto& [edit, phrase] : cases) {
    writeSample();
    rewrite(path_, [&](Json& h, std::string&) { edit(h); });
    expectRefused(path_, phrase);
  }
}

TEST_F(CheckpointTest, RefusesOffsetsThatDoNotTileTheBuffer) {
  writeSample();
  uint64_t dataStart = 8 + headerLength(readBytes(path_));
  // fc1.weight is bytes [0, 48) of the buffer and fc1.bias [48, 64).
  rewrite(path_, [](Json& h, std::string&) { h["fc1.bias"]["data_offsets"] = {40, 56}; });
  expectRefused(path_, "tensor 'fc1.bias' (bytes " + std::to_string(dataStart + 40) + ".." +
                           std::to_string(dataStart + 56) + ") overlaps tensor 'fc1.weight'");
  writeSample();
  rewrite(path_, [](Json& h, std::string& data) {
    h["fc1.bias"]["data_offsets"] = {52, 68};
    data.append(4, '\0');
  });
  expectRefused(path_, "are not covered by any tensor");
  writeSample();
  rewrite(path_, [](Json& h, std::string& data) { data.append(4, '\0'); });
  expectRefused(path_, "at the end are not covered by any tensor");
  writeSample();
  rewrite(path_, [](Json& h, std::string& data) {
    h["conv.w"]["data_offsets"][0] = data.size() - 4;
    h["conv.w"]["data_offsets"][1] = data.size() + 92;
  });
  expectRefused(path_, "tensor 'conv.w'");
  expectRefused(path_, "runs past the end of the file");
}

TEST_F(CheckpointTest, RefusesDuplicateNames) {
  writeSample();
  std::string file = readBytes(path_);
  std::string text = file.substr(8, headerLength(file));
  std::string data = file.substr(8 + headerLength(file));
  // Give tensor "one" the key of fc1.bias, so the header names fc1.bias twice.
  size_t at = text.find("\"one\":");
  ASSERT_NE(at, std::string::npos);
  std::string dup = text;
  dup.replace(at, 6, "\"fc1.bias\":");
  writeRaw(path_, dup, data);
  expectRefused(path_, "duplicate tensor name 'fc1.bias'");
  std::string dupMeta = text;
  dupMeta.replace(dupMeta.find("\"step\""), 6, "\"format\"");
  writeRaw(path_, dupMeta, data);
  expectRefused(path_, "duplicate key 'format'");
}

TEST_F(CheckpointTest, RefusesMissingMalformedOrStrayCrcs) {
  writeSample();
  rewrite(path_, [](Json& h, std::string&) { h["__metadata__"].erase("crc32c.fc1.bias"); });
  expectRefused(path_, "missing crc32c for tensor 'fc1.bias'");
  writeSample();
  rewrite(path_, [](Json& h, std::string&) { h["__metadata__"]["crc32c.one"] = "ABCDEF01"; });
  expectRefused(path_, "crc32c for tensor 'one' is 'ABCDEF01', not 8 lowercase hex digits");
  writeSample();
  rewrite(path_, [](Json& h, std::string&) { h["__metadata__"]["crc32c.ghost"] = "00000000"; });
  expectRefused(path_, "crc32c.ghost but no such tensor");
}

// Edits that no tensor CRC can see are caught by header_crc32c.
TEST_F(CheckpointTest, AlteredNamesShapesOrMetadataAreAHeaderCrcMismatch) {
  const std::vector<std::function<void(Json&)>> edits = {
      [](Json& h) { h["__metadata__"]["step"] = "8"; },
      [](Json& h) { h["__metadata__"]["extra"] = "x"; },
      [](Json& h) { h["one"]["shape"] = Json::array(); },   // [1] -> [], same bytes
      [](Json& h) { h["empty2"]["shape"] = {3, 0, 3}; },   // no bytes to check
      [](Json& h) { h["fc1.weight"]["shape"] = {4, 3}; },  // same element count
  };
  for (const auto& edit : edits) {
    writeSample();
    rewrite(path_, [&](Json& h, std::string&) { edit(h); });
    expectRefused(path_, "header_crc32c mismatch (header bytes 8..");
  }
  writeSample();
  rewrite(path_, [](Json& h, std::string&) { h["__metadata__"].erase("header_crc32c"); });
  expectRefused(path_, "missing header_crc32c");
}

TEST_F(CheckpointTest, FlippedDataByteIsACrcMismatchNamingTensorAndBytes) {
  writeSample();
  std::string file = readBytes(path_);
  uint64_t dataStart = 8 + headerLength(file);
  uint32_t stored = crc32c(file.data() + dataStart, 48);
  file[dataStart + 5] ^= 0x10;
  uint32_t computed = crc32c(file.data() + dataStart, 48);
  writeBytes(path_, file);
  char expected[160];
  std::snprintf(expected, sizeof expected,
                "crc32c mismatch for tensor 'fc1.weight' (bytes %llu..%llu): "
                "stored %08x, computed %08x",
                static_cast<unsigned long long>(dataStart),
                static_cast<unsigned long long>(dataStart + 48), stored, computed);
  expectRefused(path_, expected);
}

TEST_F(CheckpointTest, MessagesStayOnOneLine) {
  writeCheckpoint(path_, {{"two\nlines", patterned(Shape{2}, 1)}});
  rewrite(path_, [](Json& h, std::string&) { h["__metadata__"].erase("crc32c.two\nlines"); });
  expectRefused(path_, "missing crc32c for tensor 'two\\x0alines'");
}

TEST_F(CheckpointTest, EveryTruncationIsRefused) {
  writeSample();
  const std::string file = readBytes(path_);
  const std::string cut = dir_ + "/cut.safetensors";
  for (size_t n = 0; n < file.size(); ++n) {
    writeBytes(cut, file.substr(0, n));
    EXPECT_THROW(readCheckpoint(cut), IoError) << "truncated to " << n << " bytes";
  }
  uint64_t dataStart = 8 + headerLength(file);
  writeBytes(cut, file.substr(0, 4));
  expectRefused(cut, "shorter than the 8-byte header length");
  writeBytes(cut, file.substr(0, dataStart / 2));
  expectRefused(cut, "runs past the end of the file");
  writeBytes(cut, file.substr(0, dataStart + 50));
  expectRefused(cut, "runs past the end of the file");
  writeBytes(cut, file.substr(0, file.size() - 1));
  expectRefused(cut, "tensor 'conv.w'");
}

TEST_F(CheckpointTest, EveryHeaderByteFlipIsRefusedOrHarmless) {
  writeSample();
  const std::string file = readBytes(path_);
  const Checkpoint original = readCheckpoint(path_);
  const size_t dataStart = 8 + headerLength(file);
  const std::string mutant = dir_ + "/mutant.safetensors";
  int loaded = 0;
  for (size_t i = 0; i < dataStart; ++i) {
    for (int variant = 0; variant < 6; ++variant) {
      std::string bytes = file;
      static const unsigned char kMasks[] = {0x01, 0x20, 0x80, 0xff};
      if (variant < 4) bytes[i] = static_cast<char>(bytes[i] ^ kMasks[variant]);
      if (variant == 4) bytes[i] = ' ';
      if (variant == 5) bytes[i] = '\n';
      writeBytes(mutant, bytes);
      try {
        Checkpoint got = readCheckpoint(mutant);
        // Only a change that leaves the header's meaning intact (whitespace) may load.
        ++loaded;
        SCOPED_TRACE("byte " + std::to_string(i) + " variant " + std::to_string(variant));
        expectSameTensors(got.tensors, original.tensors);
        EXPECT_EQ(got.metadata, original.metadata);
      } catch (const IoError&) {
      }
    }
  }
  // Padding spaces rewritten as ' ' or '\n' keep the meaning, so those loads must have happened.
  if (file[dataStart - 1] == ' ') {
    EXPECT_GE(loaded, 2);
  }
}

// ---- Atomic replacement ----------------------------------------------------------------------

TEST_F(CheckpointTest, OverwriteReplacesTheFileAndLeavesNoTemporary) {
  writeCheckpoint(path_, sampleTensors(0), {{"v", "old"}});
  std::vector<NamedTensor> next = sampleTensors(100);
  writeCheckpoint(path_, next, {{"v", "new"}});
  Checkpoint ckpt = readCheckpoint(path_);
  expectSameTensors(ckpt.tensors, next);
  EXPECT_EQ(ckpt.metadata.at("v"), "new");
  EXPECT_EQ(listDir(dir_), std::vector<std::string>{"model.safetensors"});
}

TEST_F(CheckpointTest, WriteIntoMissingDirectoryThrowsIoError) {
  std::string path = dir_ + "/no/such/dir/model.safetensors";
  try {
    writeCheckpoint(path, sampleTensors());
    ADD_FAILURE() << "no throw";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos);
  }
  EXPECT_TRUE(listDir(dir_).empty());
}

TEST_F(CheckpointTest, WriteOverADirectoryThrowsAndRemovesTheTemporary) {
  ASSERT_EQ(::mkdir(path_.c_str(), 0755), 0);
  EXPECT_THROW(writeCheckpoint(path_, sampleTensors()), IoError);
  EXPECT_EQ(listDir(dir_), std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(std::filesystem::is_directory(path_));
}

// The temporary's name was predictable (".model.safetensors.tmp.<pid>"): something planted there
// made the write fail or, as a regular file, become the checkpoint. Now the name is drawn at random
// and what was planted is neither used nor removed.
TEST_F(CheckpointTest, SomethingPlantedUnderTheOldTemporaryNameNeitherBlocksNorBecomesTheCheckpoint) {
  writeCheckpoint(path_, sampleTensors(0), {{"v", "old"}});
  const std::string planted = dir_ + "/.model.safetensors.tmp." + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(planted.c_str(), 0755), 0);
  std::vector<NamedTensor> next = sampleTensors(1);
  writeCheckpoint(path_, next, {{"v", "new"}});
  Checkpoint ckpt = readCheckpoint(path_);
  expectSameTensors(ckpt.tensors, next);
  EXPECT_TRUE(std::filesystem::is_directory(planted));
}

// A checkpoint is the state a resume loads: only its user may read it. Exports (plain safetensors)
// get the umask's mode, as the user's other files do.
TEST_F(CheckpointTest, ACheckpointIsMode0600AndAnExportFollowsTheUmask) {
  writeSample();
  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  const mode_t old = ::umask(027);
  writeSafetensors(dir_ + "/export.safetensors", sampleTensors());
  ::umask(old);
  ASSERT_EQ(::stat((dir_ + "/export.safetensors").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
}

// A write that fails half way (file size limit: EFBIG) removes its temporary and keeps the old
// file. It runs in a child so that the limit spares the test process; the child reports by exit
// code.
TEST_F(CheckpointTest, WriteFailingMidwayLeavesTheOldFileIntact) {
  std::vector<NamedTensor> old = sampleTensors(0);
  writeCheckpoint(path_, old, {{"v", "old"}});
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(10);
    try {
      writeCheckpoint(path_, {{"big", patterned(Shape{64, 1024}, 3)}});
      ::_exit(11);
    } catch (const IoError& e) {
      ::_exit(std::string(e.what()).find("File too large") == std::string::npos ? 12 : 0);
    } catch (...) {
      ::_exit(13);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(listDir(dir_), std::vector<std::string>{"model.safetensors"});
  Checkpoint ckpt = readCheckpoint(path_);
  expectSameTensors(ckpt.tensors, old);
}

// What a writer killed before its rename leaves behind: a partial temporary file. The checkpoint at
// the path is untouched and the next write proceeds.
TEST_F(CheckpointTest, LeftoverTemporaryFromACrashIsHarmless) {
  std::vector<NamedTensor> old = sampleTensors(0);
  writeCheckpoint(path_, old);
  writeCheckpoint(dir_ + "/scratch", sampleTensors(1));
  std::string partial = readBytes(dir_ + "/scratch");
  writeBytes(dir_ + "/.model.safetensors.tmp.99999", partial.substr(0, partial.size() / 2));
  expectSameTensors(readCheckpoint(path_).tensors, old);
  std::vector<NamedTensor> next = sampleTensors(2);
  writeCheckpoint(path_, next);
  expectSameTensors(readCheckpoint(path_).tensors, next);
}

// A child rewrites the checkpoint in a loop, alternating two versions, while this process reads it;
// every read sees one complete version. Then the child is killed mid-loop (SIGKILL, no cleanup) and
// the file at the path is still one complete version.
TEST_F(CheckpointTest, ReadersAndKilledWritersNeverSeeATornFile) {
  const std::vector<NamedTensor> versions[2] = {
      {{"w", patterned(Shape{256, 1024}, 1)}, {"b", patterned(Shape{1024}, 2)}},
      {{"w", patterned(Shape{256, 1024}, 3)}, {"b", patterned(Shape{1024}, 4)}}};
  writeCheckpoint(path_, versions[0], {{"version", "0"}});
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      for (int i = 1;; ++i) {
        writeCheckpoint(path_, versions[i % 2], {{"version", std::to_string(i % 2)}});
      }
    } catch (...) {
      ::_exit(1);
    }
  }
  auto expectComplete = [&] {
    Checkpoint ckpt = readCheckpoint(path_);
    int v = std::stoi(ckpt.metadata.at("version"));
    expectSameTensors(ckpt.tensors, versions[v]);
    return v;
  };
  int seen[2] = {0, 0};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((seen[0] < 5 || seen[1] < 5) && std::chrono::steady_clock::now() < deadline) {
    ++seen[expectComplete()];
  }
  EXPECT_GE(seen[1], 1) << "the writer never replaced the file";
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status)) << "writer exited early with status " << status;
  expectComplete();
}

// A process that holds a temporary file until it is killed. `lock`: as a writer of this version
// does; without, as an older writer that took no lock.
class TemporaryHolder {
 public:
  TemporaryHolder(const std::string& file, bool lock) {
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || ::write(fd, "partial", 7) != 7 || (lock && ::flock(fd, LOCK_EX) != 0)) ::_exit(1);
      char c = 1;
      if (::write(ready[1], &c, 1) != 1) ::_exit(1);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    char c = 0;
    EXPECT_EQ(::read(ready[0], &c, 1), 1) << "the holder did not start";
    ::close(ready[0]);
  }
  ~TemporaryHolder() { kill(); }
  pid_t pid() const { return pid_; }
  // SIGKILL, as a writer killed mid-write (its lock goes with it), then reaped.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -pid_;
  }

 private:
  pid_t pid_ = -1;
};

TEST_F(CheckpointTest, AWriterRemovesTheTemporaryFilesOfKilledWritersAndNeverALiveOnes) {
  const std::string prefix = dir_ + "/.model.safetensors.tmp.";
  // A writer killed mid-write: its file stays, its process is gone.
  TemporaryHolder killed(prefix + "0", true);
  const pid_t killedPid = killed.pid();
  const std::string orphan = prefix + std::to_string(killedPid);
  ASSERT_EQ(::rename((prefix + "0").c_str(), orphan.c_str()), 0);
  killed.kill();
  // Writers still at work: this version's (holds the lock) and an older one's (no lock, alive).
  TemporaryHolder live(prefix + "live", true);
  const std::string liveFile = prefix + std::to_string(live.pid());
  ASSERT_EQ(::rename((prefix + "live").c_str(), liveFile.c_str()), 0);
  TemporaryHolder old(prefix + "old", false);
  const std::string oldFile = prefix + std::to_string(old.pid());
  ASSERT_EQ(::rename((prefix + "old").c_str(), oldFile.c_str()), 0);
  // Not temporaries of this checkpoint.
  for (const std::string& other : {prefix + "x1", dir_ + "/.other.safetensors.tmp." + std::to_string(killedPid)}) {
    std::ofstream(other) << "keep";
  }
  ASSERT_TRUE(std::filesystem::exists(orphan));
  writeSample();
  EXPECT_FALSE(std::filesystem::exists(orphan)) << "a killed writer's temporary file survived";
  EXPECT_TRUE(std::filesystem::exists(liveFile)) << "a live writer's temporary file was removed";
  EXPECT_TRUE(std::filesystem::exists(oldFile)) << "an older live writer's temporary file was removed";
  EXPECT_TRUE(std::filesystem::exists(prefix + "x1"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/.other.safetensors.tmp." + std::to_string(killedPid)));
  // Once they are gone too, the next run's start-up check clears them.
  live.kill();
  old.kill();
  EXPECT_EQ(prepareCheckpointDestination(path_), 2u);
  EXPECT_FALSE(std::filesystem::exists(liveFile));
  EXPECT_FALSE(std::filesystem::exists(oldFile));
}

TEST_F(CheckpointTest, TheDestinationIsCheckedBeforeAnythingIsWritten) {
  EXPECT_EQ(prepareCheckpointDestination(path_), 0u);
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) left.push_back(e.path().filename());
  EXPECT_TRUE(left.empty()) << "the probe file stayed: " << left.front();
  auto messageFor = [](const std::string& path) {
    try {
      prepareCheckpointDestination(path);
    } catch (const IoError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = messageFor(dir_ + "/missing/c.st");
  EXPECT_NE(m.find(dir_ + "/missing/c.st: cannot write checkpoints into directory " + dir_ + "/missing"), std::string::npos) << m;
  EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
  writeSample();
  m = messageFor(path_ + "/c.st");
  EXPECT_NE(m.find("not a directory"), std::string::npos) << m;
  if (::geteuid() != 0) {  // root writes anywhere
    const std::string ro = dir_ + "/ro";
    ASSERT_EQ(::mkdir(ro.c_str(), 0500), 0);
    m = messageFor(ro + "/c.st");
    EXPECT_NE(m.find("Permission denied"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace cohort::nn
