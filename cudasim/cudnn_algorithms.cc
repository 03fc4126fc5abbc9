// The emulated cuDNN's convolution algorithms (cudnn_algorithms.h): support, workspace, times.
#include "cudasim/cudnn_algorithms.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <span>

namespace cudasim::dnn {
namespace {

// What an algorithm's workspace holds: nothing, an index table of the taps, one image's im2col
// columns, Winograd's transformed filters (fused) or tiles (non-fused), FFT planes, FFT tiles.
enum class Workspace { kNone, kIndices, kColumns, kWinogradFilters, kWinogradTiles, kFftPlanes, kFftTiles };

struct Entry {
  Algo algo;
  Workspace workspace;
  double overheadUs;  // the launch and set-up cost of the modelled device
  double macsPerUs;   // multiply-adds per microsecond for the GEMM family; the base rate otherwise
};

constexpr double kRate = 12000;        // multiply-adds per microsecond of the best GEMM kernel
constexpr double kBytesPerUs = 40000;  // workspace traffic of the transforms
constexpr double kFftRate = 50000;     // transform and pointwise operations per microsecond

constexpr Entry kForward[] = {
    {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, Family::kGemm, CUDNN_DETERMINISTIC},
     Workspace::kIndices,
     6,
     kRate},
    {{CUDNN_CONVOLUTION_FWD_ALGO_GEMM, Family::kGemm, CUDNN_DETERMINISTIC}, Workspace::kColumns, 8, 10000},
    {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, Family::kGemm, CUDNN_DETERMINISTIC}, Workspace::kNone, 4, 8000},
    {{CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, Family::kWinograd, CUDNN_DETERMINISTIC},
     Workspace::kWinogradFilters,
     20,
     kRate},
    {{CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, Family::kWinograd, CUDNN_DETERMINISTIC},
     Workspace::kWinogradTiles,
     30,
     kRate},
    {{CUDNN_CONVOLUTION_FWD_ALGO_FFT, Family::kFft, CUDNN_DETERMINISTIC}, Workspace::kFftPlanes, 40, kFftRate},
    {{CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, Family::kFft, CUDNN_DETERMINISTIC}, Workspace::kFftTiles, 50, kFftRate}};
constexpr Entry kData[] = {
    {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, Family::kGemm, CUDNN_DETERMINISTIC}, Workspace::kColumns, 6, 11000},
    {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, Family::kGemm, CUDNN_NON_DETERMINISTIC},
     Workspace::kNone,
     4,
     7000},  // atomics on a GPU
    {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD, Family::kWinograd, CUDNN_DETERMINISTIC},
     Workspace::kWinogradFilters,
     20,
     kRate},
    {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, Family::kWinograd, CUDNN_DETERMINISTIC},
     Workspace::kWinogradTiles,
     30,
     kRate},
    {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, Family::kFft, CUDNN_DETERMINISTIC}, Workspace::kFftPlanes, 40, kFftRate},
    {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, Family::kFft, CUDNN_DETERMINISTIC},
     Workspace::kFftTiles,
     50,
     kFftRate}};
constexpr Entry kFilter[] = {
    {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, Family::kGemm, CUDNN_DETERMINISTIC}, Workspace::kColumns, 6, 11000},
    {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, Family::kGemm, CUDNN_NON_DETERMINISTIC}, Workspace::kNone, 4, 7000},
    {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, Family::kGemm, CUDNN_NON_DETERMINISTIC}, Workspace::kIndices, 8, 10000},
    {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED, Family::kWinograd, CUDNN_DETERMINISTIC},
     Workspace::kWinogradTiles,
     30,
     kRate},
    {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, Family::kFft, CUDNN_DETERMINISTIC}, Workspace::kFftPlanes, 40, kFftRate},
    {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, Family::kFft, CUDNN_DETERMINISTIC},
     Workspace::kFftTiles,
     50,
     kFftRate}};
// (cuDNN has no fused Winograd for the filter gradient of fp32 data, and DIRECT is implemented by
// no algorithm of any version: the emulation reports both unsupported, as the real one does.)

std::span<const Entry> entries(Direction d) {
  switch (d) {
    case Direction::kForward:
      return kForward;
    case Direction::kBackwardData:
      return kData;
    case Direction::kBackwardFilter:
      break;
  }
  return kFilter;
}

const Entry* entryOf(Direction d, int id) {
  for (const Entry& e : entries(d)) {
    if (e.algo.id == id) return &e;
  }
  return nullptr;
}

int64_t ceilDiv(int64_t n, int64_t d) { return (n + d - 1) / d; }
int64_t roundUp(int64_t n, int64_t to) { return ceilDiv(n, to) * to; }

// The padded input's sides, rounded up to the FFT's sizes (multiples of 16).
int64_t fftHeight(const ConvSizes& z) { return roundUp(z.h + 2 * z.padH, 16); }
int64_t fftWidth(const ConvSizes& z) { return roundUp(z.w + 2 * z.padW, 16); }
constexpr int64_t kFftTile = 32;

// Winograd F(m x m, r x r): output tiles of m, input tiles of alpha = m + r - 1. The fused algorithm
// is F(2x2, 3x3); the non-fused one F(4x4, 3x3) or F(2x2, 5x5).
int64_t winogradOutputTile(const Entry& e, const ConvSizes& z) {
  return e.workspace == Workspace::kWinogradFilters || z.r == 5 ? 2 : 4;
}
int64_t winogradTiles(const Entry& e, const ConvSizes& z) {
  const int64_t m = winogradOutputTile(e, z);
  return ceilDiv(z.outH, m) * ceilDiv(z.outW, m);
}
int64_t winogradAlpha(const Entry& e, const ConvSizes& z) { return winogradOutputTile(e, z) + z.r - 1; }

// The images, filters and outputs as planes: n·c + k·c + n·k.
int64_t planes(const ConvSizes& z) { return z.n * z.c + z.k * z.c + z.n * z.k; }

double macs(const ConvSizes& z) {
  return static_cast<double>(z.n) * z.k * z.c * z.r * z.s * static_cast<double>(z.outH) * z.outW;
}

bool unitStrideAndDilation(const ConvSizes& z) {
  return z.strideH == 1 && z.strideW == 1 && z.dilationH == 1 && z.dilationW == 1 && z.nchw;
}

bool runs(const Entry& e, const ConvSizes& z) {
  switch (e.algo.family) {
    case Family::kGemm:
      return true;
    case Family::kWinograd: {
      const bool fused = e.workspace == Workspace::kWinogradFilters;
      const bool kernel = z.r == z.s && (z.r == 3 || (!fused && z.r == 5));
      return unitStrideAndDilation(z) && kernel;
    }
    case Family::kFft:
      if (!unitStrideAndDilation(z) || z.padH >= z.r || z.padW >= z.s) return false;
      if (e.workspace == Workspace::kFftPlanes) return z.h + 2 * z.padH <= 256 && z.w + 2 * z.padW <= 256;
      return z.r <= kFftTile && z.s <= kFftTile;
  }
  return false;
}

}  // namespace

int algoCount(Direction d) {
  switch (d) {
    case Direction::kForward:
      return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case Direction::kBackwardData:
      return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    case Direction::kBackwardFilter:
      break;
  }
  return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
}

const Algo* runnable(Direction d, int id, const ConvSizes& sizes) {
  const Entry* e = entryOf(d, id);
  return e && runs(*e, sizes) ? &e->algo : nullptr;
}

size_t workspaceBytes(Direction d, const Algo& algo, const ConvSizes& z) {
  const int64_t taps = z.c * z.r * z.s;
  int64_t bytes = 0;
  const Entry& e = *entryOf(d, algo.id);
  switch (e.workspace) {
    case Workspace::kNone:
      break;
    case Workspace::kIndices:
      bytes = taps * int64_t{sizeof(int)};
      break;
    case Workspace::kColumns:
      bytes = taps * z.outH * z.outW * int64_t{sizeof(float)};
      break;
    case Workspace::kWinogradFilters:
      bytes = z.k * z.c * 16 * int64_t{sizeof(float)};
      break;
    case Workspace::kWinogradTiles: {
      const int64_t alpha = winogradAlpha(e, z), tiles = winogradTiles(e, z);
      bytes = alpha * alpha * (z.n * z.c * tiles + z.k * z.c + z.n * z.k * tiles) * int64_t{sizeof(float)};
      break;
    }
    case Workspace::kFftPlanes:  // complex planes of the real transforms: height x (width / 2 + 1)
      bytes = fftHeight(z) * (fftWidth(z) / 2 + 1) * planes(z) * 8;
      break;
    case Workspace::kFftTiles: {
      const int64_t tiles =
          ceilDiv(z.h + 2 * z.padH, kFftTile - z.r + 1) * ceilDiv(z.w + 2 * z.padW, kFftTile - z.s + 1);
      bytes = kFftTile * (kFftTile / 2 + 1) * (z.n * z.c * tiles + z.k * z.c + z.n * z.k * tiles) * 8;
      break;
    }
  }
  return static_cast<size_t>(bytes);
}

float modelledMs(Direction d, const Algo& algo, const ConvSizes& z) {
  const Entry& e = *entryOf(d, algo.id);
  const double traffic = static_cast<double>(workspaceBytes(d, algo, z)) / kBytesPerUs;
  double us = e.overheadUs;
  switch (algo.family) {
    case Family::kGemm:
      us += macs(z) / e.macsPerUs;
      break;
    case Family::kWinograd: {  // r·r·m·m multiplications of a tile become alpha·alpha
      const double m = static_cast<double>(winogradOutputTile(e, z)), alpha = static_cast<double>(winogradAlpha(e, z));
      us += macs(z) / (e.macsPerUs * (static_cast<double>(z.r * z.s) * m * m / (alpha * alpha))) + traffic;
      break;
    }
    case Family::kFft: {  // the planes' transforms, then a complex multiply-add per pair of planes
      const double hw = static_cast<double>(fftHeight(z) * fftWidth(z));
      const double transforms = static_cast<double>(planes(z)) * hw * std::log2(hw) * 2.5;
      const double pointwise = static_cast<double>(z.n * z.k * z.c) * static_cast<double>(fftHeight(z)) *
                               static_cast<double>(fftWidth(z) / 2 + 1) * 4;
      us += (transforms + pointwise) / e.macsPerUs + traffic;
      break;
    }
  }
  return static_cast<float>(us / 1000);
}

int keptBits(const Algo& algo) {
  switch (algo.family) {
    case Family::kGemm:
      break;
    case Family::kWinograd:
      return kWinogradBits;
    case Family::kFft:
      return kFftBits;
  }
  return 23;
}

void heuristicOrder(Direction d, int* ids) {
  int next = 0;
  for (const Entry& e : entries(d)) ids[next++] = e.algo.id;
  for (int id = 0; id < algoCount(d); ++id) {
    if (!entryOf(d, id)) ids[next++] = id;
  }
}

float roundMantissa(float v, int bits) {
  if (bits >= 23) return v;
  uint32_t u = std::bit_cast<uint32_t>(v);
  if ((u & 0x7f800000u) == 0x7f800000u) return v;  // Inf and NaN stay
  const int drop = 23 - bits;
  u += ((1u << (drop - 1)) - 1) + ((u >> drop) & 1u);
  return std::bit_cast<float>(u & ~((1u << drop) - 1));
}

}  // namespace cudasim::dnn
