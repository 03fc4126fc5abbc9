// readSafetensors and writeSafetensors (nn/checkpoint.h): any safetensors file in, plain safetensors
// out, with the layout checks of Cohort's checkpoints (tests/nn/checkpoint_test.cc covers those).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nn/checkpoint.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

namespace cohort::nn {
namespace {

using runtime::Shape;
using runtime::Tensor;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/safetensors_test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A safetensors file of one [2, 3] tensor "w" of `dtype` holding `bits`, and `metadata` (JSON or "").
  std::string write(const std::string& dtype, const std::vector<uint16_t>& bits, const std::string& metadata) {
    std::string header = "{" + (metadata.empty() ? "" : "\"__metadata__\":" + metadata + ",") + "\"w\":{\"dtype\":\"" +
                         dtype + "\",\"shape\":[2,3],\"data_offsets\":[0," + std::to_string(2 * bits.size()) + "]}}";
    header.append((8 - header.size() % 8) % 8, ' ');
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
    bytes += header + std::string(reinterpret_cast<const char*>(bits.data()), 2 * bits.size());
    const std::string path = dir_ + "/" + dtype + ".safetensors";
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  std::string dir_;
};

TEST_F(SafetensorsTest, SixteenBitTensorsAreWidenedExactly) {
  // 1, -2, 0.5, 65504 (F16's largest), 2^-24 (its smallest subnormal), -0.
  const std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001, 0x8000};
  const float want16[] = {1.0f, -2.0f, 0.5f, 65504.0f, std::ldexp(1.0f, -24), -0.0f};
  const Checkpoint a = readSafetensors(write("F16", f16, ""));
  ASSERT_EQ(a.tensors.size(), 1u);
  EXPECT_EQ(a.tensors[0].tensor.shape(), (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(a.tensors[0].tensor.at(i)), std::bit_cast<uint32_t>(want16[i])) << i;
  std::vector<uint16_t> bf16;
  const float values[] = {1.0f, -2.5f, 3.140625f, 1e30f, -1e-30f, 0.0f};  // bf16-exact
  for (float v : values) bf16.push_back(runtime::toBf16(v).bits);
  const Checkpoint b = readSafetensors(write("BF16", bf16, "{\"format\":\"pt\"}"));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(b.tensors[0].tensor.at(i), runtime::roundToBf16(values[i])) << i;
  EXPECT_EQ(b.metadata, (Metadata{{"format", "pt"}}));
}

TEST_F(SafetensorsTest, ReadCheckpointStillTakesOnlyCohortsFloat32Files) {
  const std::string path = write("BF16", std::vector<uint16_t>(6, 0), "{\"format\":\"pt\"}");
  try {
    readCheckpoint(path);
    ADD_FAILURE() << "readCheckpoint took a foreign file";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported checkpoint format 'pt'"), std::string::npos) << e.what();
  }
  const std::string other = write("I32", std::vector<uint16_t>(12, 0), "");
  try {
    readSafetensors(other);
    ADD_FAILURE() << "readSafetensors took an I32 tensor";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported dtype 'I32' (only F32, F16 and BF16)"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, PlainFilesRoundTripWithTheirMetadataAndNoCohortKeys) {
  Tensor w = Tensor::zeros(Shape{2, 2});
  for (int i = 0; i < 4; ++i) w.at(i) = 0.25f * static_cast<float>(i) - 1.0f;
  const std::string path = dir_ + "/plain.safetensors";
  writeSafetensors(path, {{"w", w}}, {{"format", "pt"}});
  const Checkpoint got = readSafetensors(path);
  EXPECT_EQ(got.metadata, (Metadata{{"format", "pt"}}));  // no CRCs, no Cohort format
  ASSERT_EQ(got.tensors.size(), 1u);
  EXPECT_EQ(std::memcmp(got.tensors[0].tensor.data(), w.data(), w.bytes()), 0);
  EXPECT_THROW(readCheckpoint(path), IoError);
  writeSafetensors(path, {{"w", w}});  // no metadata at all
  EXPECT_TRUE(readSafetensors(path).metadata.empty());
}

TEST_F(SafetensorsTest, ACohortCheckpointReadAsSafetensorsIsCheckedAndSaysSo) {
  Tensor w = Tensor::zeros(Shape{3});
  const std::string path = dir_ + "/cohort.safetensors";
  writeCheckpoint(path, {{"w", w}}, {{"model", "mlp:3,1"}});
  const Checkpoint got = readSafetensors(path);
  EXPECT_EQ(got.metadata, (Metadata{{"format", kCheckpointFormat}, {"model", "mlp:3,1"}}));
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-1, std::ios::end);
  f.put('\x01');  // the last data byte: a CRC mismatch
  f.close();
  try {
    readSafetensors(path);
    ADD_FAILURE() << "a corrupt Cohort checkpoint was read";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("crc32c mismatch for tensor 'w'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cohort::nn
