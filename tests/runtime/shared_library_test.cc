// SharedLibrary: finds a library by name or in its fallback directory, resolves typed functions,
// names every file tried and the missing function in its IoError, keeps the library loaded after
// its owner is gone (RTLD_NODELETE), and hands over on move. zlib (libz.so.1, which every Debian
// system has) stands in for the NVIDIA libraries; this test does not link it.
#include "runtime/shared_library.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>

#include "runtime/error.h"

namespace cohort::runtime {
namespace {

namespace fs = std::filesystem;

using ZlibVersion = const char*();  // zlib.h: const char* zlibVersion(void)

fs::path freshDirectory(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(tmp ? tmp : "/tmp") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The message of the IoError that `body` throws ("" if it throws none).
template <class Body>
std::string ioErrorOf(Body body) {
  try {
    body();
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

TEST(SharedLibrary, FindsALibraryByItsNameAndResolvesTypedFunctions) {
  SharedLibrary zlib = SharedLibrary::open({.what = "zlib", .fileName = "libz.so.1"});
  EXPECT_EQ(zlib.what(), "zlib");
  EXPECT_TRUE(fs::path(zlib.path()).is_absolute()) << zlib.path();
  EXPECT_TRUE(fs::exists(zlib.path())) << zlib.path();
  ZlibVersion* version = zlib.function<ZlibVersion>("zlibVersion");
  ASSERT_NE(version, nullptr);
  EXPECT_EQ(std::string(version()).substr(0, 2), "1.");
}

TEST(SharedLibrary, TriesTheFallbackDirectoryAfterTheLoadersSearch) {
  // A copy under a name the loader cannot find: only the fallback directory has it.
  const std::string real = SharedLibrary::open({.what = "zlib", .fileName = "libz.so.1"}).path();
  const fs::path dir = freshDirectory("shared_library_fallback");
  fs::copy_file(real, dir / "libcohort_test_zlib_copy.so.1");
  SharedLibrary copy = SharedLibrary::open(
      {.what = "zlib's copy", .fileName = "libcohort_test_zlib_copy.so.1", .fallbackDir = dir.string()});
  EXPECT_EQ(copy.path(), (dir / "libcohort_test_zlib_copy.so.1").string());
  EXPECT_NE(copy.function<ZlibVersion>("zlibVersion"), nullptr);
}

TEST(SharedLibrary, AMissingLibraryNamesEveryFileTried) {
  const fs::path dir = freshDirectory("shared_library_missing");
  const std::string message = ioErrorOf([&] {
    SharedLibrary::open({.what = "cuNothing", .fileName = "libcunothing.so.7", .fallbackDir = dir.string()});
  });
  EXPECT_NE(message.find("cannot load cuNothing"), std::string::npos) << message;
  EXPECT_NE(message.find("libcunothing.so.7: cannot open shared object file"), std::string::npos) << message;
  EXPECT_NE(message.find((dir / "libcunothing.so.7").string()), std::string::npos) << message;
  EXPECT_NE(message.find("LD_LIBRARY_PATH"), std::string::npos) << message;
}

TEST(SharedLibrary, AMissingFunctionNamesTheLibraryAndTheFunction) {
  SharedLibrary zlib = SharedLibrary::open({.what = "zlib", .fileName = "libz.so.1"});
  const std::string message = ioErrorOf([&] { zlib.function<ZlibVersion>("zlibVersionFromTheFuture"); });
  EXPECT_NE(message.find("zlib (" + zlib.path() + ") has no function zlibVersionFromTheFuture"), std::string::npos)
      << message;
}

TEST(SharedLibrary, StaysLoadedAfterItsOwnerIsGone) {
  const std::string real = SharedLibrary::open({.what = "zlib", .fileName = "libz.so.1"}).path();
  const fs::path dir = freshDirectory("shared_library_nodelete");
  const fs::path copy = dir / "libcohort_test_zlib_nodelete.so.1";
  fs::copy_file(real, copy);
  ASSERT_EQ(dlopen(copy.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr) << "loaded before the test opened it";
  ZlibVersion* version = nullptr;
  {
    SharedLibrary library = SharedLibrary::open({.what = "zlib's copy", .fileName = copy.string()});
    version = library.function<ZlibVersion>("zlibVersion");
  }
  void* handle = dlopen(copy.c_str(), RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(handle, nullptr) << "unloaded with its owner";
  if (handle) dlclose(handle);
  EXPECT_EQ(std::string(version()).substr(0, 2), "1.");  // the address is still good
}

TEST(SharedLibrary, MoveHandsTheLibraryOver) {
  SharedLibrary a = SharedLibrary::open({.what = "zlib", .fileName = "libz.so.1"});
  const std::string path = a.path();
  SharedLibrary b = std::move(a);
  EXPECT_EQ(b.path(), path);
  EXPECT_NE(b.function<ZlibVersion>("zlibVersion"), nullptr);
  SharedLibrary c = SharedLibrary::open({.what = "zlib again", .fileName = "libz.so.1"});
  c = std::move(b);
  EXPECT_EQ(c.what(), "zlib");
  EXPECT_NE(c.function<ZlibVersion>("zlibVersion"), nullptr);
}

}  // namespace
}  // namespace cohort::runtime
