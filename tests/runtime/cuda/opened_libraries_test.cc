// cuBLAS and cuDNN are opened at run time (cublas_library.h, cudnn_library.h), not linked: a
// program linked with //runtime has loaded neither when it starts (cuBLAS with its cuBLASLt costs a
// process ~200 MB resident), and CublasLibrary / CudnnLibrary load them and resolve every function
// Cohort calls. Opening them needs no driver, so this runs (and checks the names) without a GPU.
// Built only with CUDA and cuDNN (tests/runtime/cuda/BUILD).
#include <cublas_v2.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "runtime/cuda/cublas_library.h"
#include "runtime/cuda/cublaslt_library.h"
#include "runtime/cuda/cudnn_library.h"
#include "runtime/cuda/dnn.h"

namespace cohort::runtime::cuda {
namespace {

const std::string kCublas = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
const std::string kCublasLt = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
const std::string kCudnn = "libcudnn.so." + std::to_string(CUDNN_MAJOR);

bool loaded(const std::string& soname) {
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);
  return handle != nullptr;
}

// Read during static initialisation: after the loader has mapped every library the program links,
// before any test has run (whatever their order).
const bool kLoadedAtStart = loaded(kCublas) || loaded(kCublasLt) || loaded(kCudnn);

TEST(OpenedLibraries, NoneIsLoadedWhenTheProgramStarts) {
  EXPECT_FALSE(kLoadedAtStart) << "linking //runtime loads cuBLAS or cuDNN again: every CPU worker pays for it";
}

TEST(OpenedLibraries, CublasLibraryLoadsCublasAndResolvesItsFunctions) {
  const CublasLibrary cublas;
  EXPECT_TRUE(loaded(kCublas));
  EXPECT_TRUE(std::filesystem::path(cublas.library.path()).is_absolute()) << cublas.library.path();
  for (const void* f : {(const void*)cublas.create, (const void*)cublas.destroy, (const void*)cublas.setStream,
                        (const void*)cublas.setMathMode, (const void*)cublas.setPointerMode, (const void*)cublas.sgemm,
                        (const void*)cublas.sscal64}) {
    EXPECT_NE(f, nullptr);
  }
  EXPECT_STREQ(cublas.getStatusName(CUBLAS_STATUS_ALLOC_FAILED), "CUBLAS_STATUS_ALLOC_FAILED");
  EXPECT_STRNE(cublas.getStatusString(CUBLAS_STATUS_ALLOC_FAILED), "");
  const CublasLibrary again;  // already loaded: the same library
  EXPECT_EQ(again.library.path(), cublas.library.path());
  EXPECT_EQ(again.sgemm, cublas.sgemm);
}

TEST(OpenedLibraries, CublasLtLibraryLoadsCublasLtAndResolvesItsFunctions) {
  const CublasLtLibrary lt;
  EXPECT_TRUE(loaded(kCublasLt));
  EXPECT_TRUE(std::filesystem::path(lt.library.path()).is_absolute()) << lt.library.path();
  for (const void* f :
       {(const void*)lt.create, (const void*)lt.destroy, (const void*)lt.matmulDescCreate,
        (const void*)lt.matmulDescDestroy, (const void*)lt.matmulDescSetAttribute, (const void*)lt.matrixLayoutCreate,
        (const void*)lt.matrixLayoutDestroy, (const void*)lt.matmulPreferenceCreate,
        (const void*)lt.matmulPreferenceDestroy, (const void*)lt.matmulPreferenceSetAttribute,
        (const void*)lt.matmulAlgoGetHeuristic, (const void*)lt.matmul}) {
    EXPECT_NE(f, nullptr);
  }
  EXPECT_STREQ(lt.getStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
}

TEST(OpenedLibraries, CudnnLibraryLoadsCudnnAndResolvesItsFunctions) {
  const CudnnLibrary cudnn;
  EXPECT_TRUE(loaded(kCudnn));
  EXPECT_EQ(cudnn.getVersion() / 10000, static_cast<size_t>(CUDNN_MAJOR));
  EXPECT_STRNE(cudnn.getErrorString(CUDNN_STATUS_BAD_PARAM), "");
  EXPECT_NE(cudnn.convolutionForward, nullptr);
  EXPECT_NE(cudnn.addTensor, nullptr);
  EXPECT_EQ(Dnn::version().rfind("cuDNN " + std::to_string(CUDNN_MAJOR) + ".", 0), 0u) << Dnn::version();
}

}  // namespace
}  // namespace cohort::runtime::cuda
