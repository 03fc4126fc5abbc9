// NCCL is opened at run time (collectives/nccl/nccl_library.h), not linked: a program linked with
// //collectives (nccl backend included) has not loaded it when it starts, and NcclLibrary loads it
// and resolves every function the backend calls. Opening it needs no GPU, so this runs anywhere a
// CUDA build with NCCL does.
#include "collectives/nccl/nccl_library.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <filesystem>
#include <string>

namespace cohort::collectives::nccl {
namespace {

const std::string kNccl = "libnccl.so." + std::to_string(NCCL_MAJOR);

bool loaded(const std::string& soname) {
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);
  return handle != nullptr;
}

// Read during static initialisation, before any test has run.
const bool kLoadedAtStart = loaded(kNccl);

TEST(NcclLibrary, IsNotLoadedWhenTheProgramStarts) {
  EXPECT_FALSE(kLoadedAtStart) << "linking the nccl backend loads NCCL again: every CPU worker pays for it";
}

TEST(NcclLibrary, LoadsNcclAndResolvesItsFunctions) {
  const NcclLibrary nccl;
  EXPECT_TRUE(loaded(kNccl));
  EXPECT_TRUE(std::filesystem::path(nccl.library.path()).is_absolute()) << nccl.library.path();
  for (const void* f :
       {(const void*)nccl.getUniqueId, (const void*)nccl.commInitRankConfig, (const void*)nccl.commGetAsyncError,
        (const void*)nccl.commFinalize, (const void*)nccl.commDestroy, (const void*)nccl.commAbort,
        (const void*)nccl.getLastError, (const void*)nccl.allReduce, (const void*)nccl.reduceScatter,
        (const void*)nccl.allGather, (const void*)nccl.broadcast}) {
    EXPECT_NE(f, nullptr);
  }
  EXPECT_STRNE(nccl.getErrorString(ncclInvalidArgument), "");
}

}  // namespace
}  // namespace cohort::collectives::nccl
