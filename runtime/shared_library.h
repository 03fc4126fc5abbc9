// SharedLibrary: a shared object opened at run time (dlopen), for the NVIDIA libraries only a GPU run
// needs. Linked the usual way, cuBLAS alone (with cuBLASLt) costs every process that starts about
// 200 MB resident before main(), CPU workers included (docs/build.md, "What a CPU worker costs");
// opened here, it is loaded by the first object that asks for it (runtime/cuda/cublas_library.h,
// cudnn_library.h, collectives/nccl/nccl_library.h).
//
// open() looks for the file name ("libcublas.so.13") as the dynamic linker does (LD_LIBRARY_PATH,
// the calling object's RUNPATH, ld.so.cache, the default directories), then, if that fails, in the
// fallback directory (where the build found it: an object without that RUNPATH, such as a test's
// shared library, still finds it there). The library is opened RTLD_NOW | RTLD_LOCAL |
// RTLD_NODELETE: every symbol it needs is bound at once (a broken install fails here, not in the
// middle of a step), it adds no symbols to the process's namespace, and it is never unloaded, so a
// later open() of the same library costs a lookup (microseconds), not a second load.
// Errors (the environment's doing: a file that is missing or of another version) throw IoError,
// naming the library, every file tried and the loader's reasons.
// Ownership: owns one dlopen reference (dlclose on destruction, which with RTLD_NODELETE leaves the
// library mapped); movable, not copyable. Addresses from function() stay valid for the life of the
// process. Thread safety: open() and function() may be called from any thread (the loader's lock);
// one SharedLibrary object is used as a value. Part of //runtime:base: links no CUDA.
//
// The tables built on it (CublasLibrary, CudnnLibrary, NcclLibrary) share one contract: each opens
// lib<name>.so.<the major version of the headers Cohort was compiled with>, falling back to the
// directory where the build found it (COHORT_<NAME>_DIR from @local_cuda's cuda_library_dirs.h);
// its constructor throws IoError as open() and function() do (the first load of a library takes
// tens of milliseconds, later ones microseconds); it holds a reference to the library, which stays
// loaded for the life of the process; it is immutable after construction, and its members are the
// library's functions, named without the library's prefix, with the library's own contract.
//
//   SharedLibrary cublas = SharedLibrary::open({.what = "cuBLAS", .fileName = "libcublas.so.13",
//                                               .fallbackDir = "/usr/local/cuda/lib64"});
//   auto create = cublas.function<decltype(::cublasCreate_v2)>("cublasCreate_v2");
//   auto destroy = COHORT_LIBRARY_FUNCTION(cublas, cublasDestroy_v2);   // the same, spelled once
#pragma once

#include <string>

namespace cohort::runtime {

struct SharedLibraryOptions {
  std::string what;         // the library's name in messages: "cuBLAS"
  std::string fileName;     // searched for as the dynamic linker does: "libcublas.so.13"
  std::string fallbackDir;  // then fallbackDir/fileName is tried, unless it is empty
};

class SharedLibrary {
 public:
  static SharedLibrary open(const SharedLibraryOptions& options);
  // The program itself (dlopen(nullptr)), for a build that links the library in: the emulated
  // device of the tests (cudasim/) links emulated cuBLAS, cuDNN and NCCL, and the tables built with
  // COHORT_OPEN_LIBRARY_TABLE and COHORT_LIBRARY_FUNCTION take their functions directly.
  static SharedLibrary linkedIn(const SharedLibraryOptions& options);

  SharedLibrary(SharedLibrary&& other) noexcept;
  SharedLibrary& operator=(SharedLibrary&& other) noexcept;
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;
  ~SharedLibrary();

  // The address of `name`, typed as the function declared in the library's header. Throws IoError
  // when the library has no such symbol (a version older than the headers Cohort was built with).
  template <class Function>
  Function* function(const char* name) const {
    return reinterpret_cast<Function*>(address(name));
  }

  const std::string& what() const { return what_; }
  // The file the loader opened, as a full path when it searched for a bare name.
  const std::string& path() const { return path_; }

 private:
  SharedLibrary(void* handle, std::string what, std::string path);
  void* address(const char* name) const;

  void* handle_ = nullptr;
  std::string what_;
  std::string path_;
};

}  // namespace cohort::runtime

// `library`.function<decltype(::fn)>("fn"): resolves a function by the name and type of its
// declaration. decltype does not odr-use the declaration, so the program needs no link-time
// reference to the library.
// How the tables open their library and take its functions: dlopen and dlsym, or, in the cudasim
// build (COHORT_CUDASIM), the emulated library linked into the program.
// COHORT_LIBRARY_OVERLOAD names the function's type, for a name the header overloads (C++ inline
// wrappers beside the library's extern "C" function).
#ifdef COHORT_CUDASIM
#define COHORT_OPEN_LIBRARY_TABLE(...) ::cohort::runtime::SharedLibrary::linkedIn(__VA_ARGS__)
#define COHORT_LIBRARY_FUNCTION(library, fn) (static_cast<void>(library), &::fn)
#define COHORT_LIBRARY_OVERLOAD(library, fn, Type) (static_cast<void>(library), static_cast<Type*>(&::fn))
#else
#define COHORT_OPEN_LIBRARY_TABLE(...) ::cohort::runtime::SharedLibrary::open(__VA_ARGS__)
#define COHORT_LIBRARY_FUNCTION(library, fn) (library).function<decltype(::fn)>(#fn)
#define COHORT_LIBRARY_OVERLOAD(library, fn, Type) (library).function<Type>(#fn)
#endif
