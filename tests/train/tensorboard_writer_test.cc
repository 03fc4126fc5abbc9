// train::TensorBoardWriter, checked by an independent reader: tests/train/tensorboard_reader.py (Python's
// standard library only, its own CRC32C and protobuf decoding) runs as a child process on each file
// and must print exactly the scalars written. The reader in turn must refuse every corruption planted
// here (a flipped byte in a record's length, data or CRCs, a file cut mid-record, bad wire data),
// naming the record, so neither a broken writer nor a broken reader lets the test pass.
#include "train/observe/tensorboard_writer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "nn/checkpoint.h"  // nn::crc32c, to build records of the test's own
#include "runtime/error.h"
#include "tests/support/process.h"
#include "train/observe/tensorboard_event.pb.h"

namespace cohort::train {
namespace {

using cohort::testing::CommandResult;
using cohort::testing::freshTempDir;
using Json = nlohmann::ordered_json;

// python3 from PATH (runCommand execs without a PATH search).
std::string python3() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/python3";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  ADD_FAILURE() << "python3 is not on PATH (" << (path ? path : "unset") << "); scripts/setup installs it";
  return "python3";
}

CommandResult runReader(const std::string& arg) {
  return cohort::testing::runCommand(
      {python3(), cohort::testing::runfile("tests/train/tensorboard_reader.py"), arg},
      {.timeout = std::chrono::seconds(60), .workingDirectory = {}, .extraEnvironment = {}});
}

// The reader's JSON lines; fails the test unless it exits 0 with only well-formed lines.
std::vector<Json> readEvents(const std::string& path) {
  CommandResult r = runReader(path);
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.stderrText, "") << r.describe();
  std::vector<Json> events;
  std::istringstream lines(r.stdoutText);
  for (std::string line; std::getline(lines, line);) events.push_back(Json::parse(line));
  return events;
}

std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

uint64_t littleEndian(const std::string& bytes, size_t at, int size) {
  uint64_t v = 0;
  for (int i = size - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

// The offsets of a file's records, walked here from the length fields alone (not through the
// reader); fails the test unless the records cover the file exactly.
std::vector<size_t> recordOffsets(const std::string& file) {
  std::vector<size_t> offsets;
  size_t at = 0;
  while (at + 12 <= file.size()) {
    offsets.push_back(at);
    at += 16 + littleEndian(file, at, 8);
  }
  EXPECT_EQ(at, file.size()) << "records do not end where the file does";
  return offsets;
}

// A record framed by the test itself, to feed the reader events the writer never writes.
std::string record(const std::string& data) {
  auto masked = [](const std::string& bytes) {
    const uint32_t crc = nn::crc32c(bytes.data(), bytes.size());
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
  };
  auto le = [](uint64_t v, int size) {
    std::string out;
    for (int i = 0; i < size; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return out;
  };
  const std::string length = le(data.size(), 8);
  return length + le(masked(length), 4) + data + le(masked(data), 4);
}

double now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

struct Written {
  std::string tag;
  int64_t step;
  double value;
};

TEST(TensorBoardWriterTest, ReaderSelfTest) {
  CommandResult r = runReader("--self-test");
  EXPECT_EQ(r.exitCode, 0) << r.describe();
}

// Every scalar comes back with its tag, step and value; the first record is the file version.
TEST(TensorBoardWriterTest, ScalarsRoundTripThroughTheIndependentReader) {
  const std::string base = freshTempDir();
  // As every output path (issue 33): the directory itself is created, missing ones above it are refused.
  EXPECT_THROW(TensorBoardWriter(base + "/runs/a/b"), IoError);
  EXPECT_FALSE(std::filesystem::exists(base + "/runs"));
  const std::string dir = base + "/runs";
  const int64_t big = int64_t{1} << 40;
  const std::vector<Written> scalars = {
      {"train/loss", 0, 0.25},
      {"train/loss", 1, 0.125},
      {"eval/accuracy", 1, 0.75},
      {"lr", 2, -1.5},
      {"zero", 3, 0.0},
      {"grösse/λ-µ ✓ 日本 😀", 4, 3.0},
      {"big/step", big, 1024.5},
      {"big/step", big + 1, -16777216.0},
      {"tiny", 5, std::ldexp(1.0, -20)},
      {"negative/step", -3, -0.5},
  };
  const double before = now();
  std::string path;
  {
    TensorBoardWriter writer(dir);
    path = writer.path();
    for (const Written& s : scalars) writer.scalar(s.tag, s.step, s.value);
    writer.scalar({.tag = "explicit/time", .step = 7, .value = 2.5, .wallTime = 1234567890.25});
  }  // the destructor flushes
  const double after = now();

  std::vector<Json> events = readEvents(path);
  ASSERT_EQ(events.size(), scalars.size() + 2);
  const std::vector<size_t> offsets = recordOffsets(readBytes(path));
  ASSERT_EQ(offsets.size(), events.size());
  EXPECT_EQ(events[0]["file_version"], "brain.Event:2");
  EXPECT_EQ(events[0]["step"], 0);
  EXPECT_FALSE(events[0].contains("tag"));
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["record"], i);
    EXPECT_EQ(events[i]["offset"], offsets[i]);
    if (i + 1 == events.size()) break;  // the explicit wall time, below
    const double wallTime = events[i]["wall_time"];
    EXPECT_GE(wallTime, before - 1) << i;
    EXPECT_LE(wallTime, after + 1) << i;
  }
  for (size_t i = 0; i < scalars.size(); ++i) {
    const Json& e = events[i + 1];
    EXPECT_EQ(e["tag"].get<std::string>(), scalars[i].tag) << i;
    EXPECT_EQ(e["step"].get<int64_t>(), scalars[i].step) << i;
    EXPECT_EQ(e["value"].get<double>(), scalars[i].value) << i;
    EXPECT_FALSE(e.contains("file_version")) << i;
  }
  const Json& last = events.back();
  EXPECT_EQ(last["tag"], "explicit/time");
  EXPECT_EQ(last["step"], 7);
  EXPECT_EQ(last["value"].get<double>(), 2.5);
  EXPECT_EQ(last["wall_time"].get<double>(), 1234567890.25);
}

// A value that is not a float32 is stored rounded to one, as TensorBoard's simple_value is.
TEST(TensorBoardWriterTest, ValuesAreStoredAsFloat32) {
  std::string path;
  {
    TensorBoardWriter writer(freshTempDir());
    path = writer.path();
    writer.scalar("x", 1, 0.1);
  }
  std::vector<Json> events = readEvents(path);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1]["value"].get<double>(), static_cast<double>(0.1f));
}

// The version record is in the file from the constructor on; flush() makes scalars visible to a
// reader while the writer lives.
TEST(TensorBoardWriterTest, FlushMakesRecordsVisible) {
  TensorBoardWriter writer(freshTempDir());
  ASSERT_EQ(readEvents(writer.path()).size(), 1u);
  writer.scalar("a", 1, 1.0);
  writer.scalar("b", 2, 2.0);
  writer.flush();
  std::vector<Json> events = readEvents(writer.path());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[2]["tag"], "b");
  EXPECT_EQ(events[2]["value"].get<double>(), 2.0);
}

TEST(TensorBoardWriterTest, FileNameFollowsTensorBoard) {
  const std::string dir = freshTempDir();
  const long long before = static_cast<long long>(now());
  TensorBoardWriter writer(dir);
  const long long after = static_cast<long long>(now());
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const std::string prefix = dir + "/events.out.tfevents.";
  ASSERT_EQ(writer.path().rfind(prefix, 0), 0u) << writer.path();
  std::smatch m;
  const std::string name = writer.path().substr(prefix.size());
  ASSERT_TRUE(std::regex_match(name, m, std::regex(R"(^(\d{10})\.(.+)\.(\d+)\.(\d+)$)"))) << name;
  EXPECT_GE(std::stoll(m[1]), before);
  EXPECT_LE(std::stoll(m[1]), after);
  EXPECT_EQ(m[2], std::string(host));
  EXPECT_EQ(std::stoll(m[3]), ::getpid());
  EXPECT_EQ(m[4], "0");  // the first writer of this directory
}

TEST(TensorBoardWriterTest, TwoWritersInOneDirectoryGetTwoFiles) {
  const std::string dir = freshTempDir();
  TensorBoardWriter first(dir), second(dir);
  EXPECT_NE(first.path(), second.path());
  first.scalar("first", 1, 1.0);
  second.scalar("second", 1, 2.0);
  first.flush();
  second.flush();
  // Each file holds its own writer's records and nothing of the other's.
  std::vector<Json> a = readEvents(first.path()), b = readEvents(second.path());
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(a[1]["tag"], "first");
  EXPECT_EQ(b[1]["tag"], "second");
  // In the same second the names differ only in the counter.
  const std::string stemA = first.path().substr(0, first.path().rfind('.'));
  const std::string stemB = second.path().substr(0, second.path().rfind('.'));
  if (stemA == stemB) {
    EXPECT_EQ(second.path(), stemB + ".1");
  }
}

TEST(TensorBoardWriterTest, UnwritableDirectoryIsAnIoErrorNamingIt) {
  const std::string dir = freshTempDir();
  const std::string file = dir + "/plain-file";
  writeBytes(file, "x");
  // A directory that cannot be created: its parent is a file.
  try {
    TensorBoardWriter writer(file + "/tb");
    FAIL() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(file + "/tb"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TensorBoardWriter(""), InvalidArgument);
  // A directory that exists but where no file can be created, whoever runs the test (root included).
  try {
    TensorBoardWriter writer("/proc");
    FAIL() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/events.out.tfevents."), std::string::npos) << e.what();
  }
}

TEST(TensorBoardWriterTest, TagsMustBeUtf8) {
  TensorBoardWriter writer(freshTempDir());
  for (const std::string bad : {"\xff", "ab\xe6\x97", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"}) {
    EXPECT_THROW(writer.scalar(bad, 1, 1.0), InvalidArgument) << bad.size();
  }
  writer.scalar("\xf0\x9f\x98\x80", 1, 1.0);  // U+1F600, four bytes
  writer.flush();
  EXPECT_EQ(readEvents(writer.path()).size(), 2u);
}

// Events the writer never makes: two Values in one Summary, fields the reader does not know (each
// wire type), an event with neither a version nor a summary.
TEST(TensorBoardWriterTest, ReaderDecodesWhatOtherWritersWrite) {
  tensorboard::Event two;
  two.set_wall_time(1.5);
  two.set_step(9);
  for (const auto& [tag, value] : {std::pair{"p", 0.5f}, std::pair{"q", -2.0f}}) {
    tensorboard::Summary::Value* v = two.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(value);
  }
  std::string data;
  ASSERT_TRUE(two.SerializeToString(&data));
  // Field 99 varint 300, field 100 fixed64, field 101 three bytes, field 102 fixed32.
  data += std::string("\x98\x06\xac\x02", 4) + std::string("\xa1\x06", 2) + std::string(8, '\x07') +
          std::string("\xaa\x06\x03", 3) + "abc" + std::string("\xb5\x06", 2) + std::string(4, '\x01');
  // A second summary field, which merges into the first: a Value "r" whose simple_value 1.0 is then
  // replaced by field 8 (TensorBoard's tensor, another member of Value's oneof), so it has no value.
  data += std::string("\x2a\x0c\x0a\x0a\x0a\x01r\x15\x00\x00\x80\x3f\x42\x00", 14);
  tensorboard::Event bare;
  bare.set_wall_time(2.0);
  bare.set_step(10);
  std::string bareData;
  ASSERT_TRUE(bare.SerializeToString(&bareData));

  const std::string path = freshTempDir() + "/events";
  writeBytes(path, record(data) + record(bareData));
  std::vector<Json> events = readEvents(path);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].dump(), R"({"record":0,"offset":0,"wall_time":1.5,"step":9,"tag":"p","value":0.5})");
  EXPECT_EQ(events[1].dump(), R"({"record":0,"offset":0,"wall_time":1.5,"step":9,"tag":"q","value":-2.0})");
  EXPECT_EQ(events[2].dump(), R"({"record":0,"offset":0,"wall_time":1.5,"step":9,"tag":"r","value":null})");
  EXPECT_EQ(events[3].dump(),
            R"({"record":1,"offset":)" + std::to_string(record(data).size()) + R"(,"wall_time":2.0,"step":10})");
}

// The reader refuses each corruption, naming the record and its offset, after printing the records
// before it.
class ReaderRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshTempDir();
    std::string path;
    {
      TensorBoardWriter writer(dir_ + "/good");
      path = writer.path();
      for (int step = 1; step <= 3; ++step) writer.scalar("train/loss", step, 1.0 / (1 << step));
    }
    ASSERT_EQ(readEvents(path).size(), 4u);
    good_ = readBytes(path);
    offsets_ = recordOffsets(good_);
    ASSERT_EQ(offsets_.size(), 4u);
  }

  // Writes `bytes` and checks that the reader exits 1 naming record `index` after printing the
  // records before it.
  void expectRefused(const std::string& bytes, size_t index, const std::string& reason) {
    const std::string path = dir_ + "/bad";
    writeBytes(path, bytes);
    CommandResult r = runReader(path);
    EXPECT_EQ(r.exitCode, 1) << r.describe();
    const std::string named =
        path + ": record " + std::to_string(index) + " at byte " + std::to_string(offsets_[index]) + ": ";
    EXPECT_NE(r.stderrText.find(named + reason), std::string::npos) << "expected: " << named << reason << "\n"
                                                                    << r.describe();
    EXPECT_EQ(cohort::testing::linesWith(r.stdoutText, "\"record\"").size(), index) << r.describe();
  }

  std::string flipped(size_t at) const {
    std::string bytes = good_;
    bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
    return bytes;
  }

  std::string dir_, good_;
  std::vector<size_t> offsets_;  // of the 4 records: the version, then 3 scalars
};

TEST_F(ReaderRefusalTest, FlippedDataByte) {
  expectRefused(flipped(offsets_[2] + 12), 2, "data CRC mismatch");  // the first data byte
  expectRefused(flipped(offsets_[3] - 5), 2, "data CRC mismatch");   // the last
  expectRefused(flipped(offsets_[1] + 20), 1, "data CRC mismatch");
}

TEST_F(ReaderRefusalTest, FlippedLengthByte) {
  expectRefused(flipped(offsets_[2]), 2, "length CRC mismatch");
  expectRefused(flipped(offsets_[3] + 7), 3, "length CRC mismatch");  // the length's top byte
  expectRefused(flipped(offsets_[0]), 0, "length CRC mismatch");
}

TEST_F(ReaderRefusalTest, FlippedCrcByte) {
  expectRefused(flipped(offsets_[1] + 9), 1, "length CRC mismatch");
  expectRefused(flipped(offsets_[2] - 1), 1, "data CRC mismatch");
  expectRefused(flipped(good_.size() - 4), 3, "data CRC mismatch");
}

TEST_F(ReaderRefusalTest, TruncatedFile) {
  expectRefused(good_.substr(0, good_.size() - 1), 3, "cut short");  // the last CRC's last byte
  expectRefused(good_.substr(0, offsets_[3] + 13), 3, "cut short");  // mid-data
  expectRefused(good_.substr(0, offsets_[2] + 11), 2, "cut short");  // mid-header
  expectRefused(good_.substr(0, offsets_[1] + 3), 1, "cut short");   // mid-length
  expectRefused(good_.substr(0, 5), 0, "cut short");
}

// Records whose CRCs are right but whose bytes are no Event.
TEST_F(ReaderRefusalTest, BadWireData) {
  const std::string prefix = good_.substr(0, offsets_[1]);
  expectRefused(prefix + record(std::string("\x0a\x01x", 3)), 1, "Event: field 1 has wire type 2, expected 1");
  expectRefused(prefix + record(std::string("\x10\xff", 2)), 1, "varint cut short");
  expectRefused(prefix + record(std::string("\x2a\x05\x0a", 3)), 1, "Event: field 5 of 5 bytes runs past the end");
  expectRefused(prefix + record(std::string("\x0b", 1)), 1, "Event: field 1 has wire type 3");
  expectRefused(prefix + record(std::string("\x1a\x02\xc3\x28", 4)), 1, "Event.file_version is not UTF-8");
}

}  // namespace
}  // namespace cohort::train
