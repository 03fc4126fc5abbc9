// SharedLibrary (runtime/shared_library.h): dlopen with RTLD_NODELETE, one IoError naming every try.
#include "runtime/shared_library.h"

#include <dlfcn.h>
#include <link.h>

#include <utility>
#include <vector>

#include "runtime/error.h"

namespace cohort::runtime {
namespace {

std::string loaderError() {
  const char* message = dlerror();
  return message ? message : "unknown error";
}

// Where the loader found the library (l_name is the path it opened; empty for the main program).
std::string loadedPath(void* handle, const std::string& requested) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && *map->l_name) {
    return map->l_name;
  }
  return requested;
}

}  // namespace

SharedLibrary SharedLibrary::open(const SharedLibraryOptions& options) {
  COHORT_CHECK(!options.fileName.empty()) << "SharedLibrary::open(" << options.what << ") without a file name";
  std::vector<std::string> candidates{options.fileName};
  if (!options.fallbackDir.empty()) candidates.push_back(options.fallbackDir + "/" + options.fileName);
  std::string tried;
  for (const std::string& candidate : candidates) {
    if (void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) {
      return SharedLibrary(handle, options.what, loadedPath(handle, candidate));
    }
    tried += (tried.empty() ? "" : "; ") + loaderError();
  }
  COHORT_THROW(IoError) << "cannot load " << options.what << " (" << tried
                        << "): install it, or put its directory on LD_LIBRARY_PATH";
}

SharedLibrary SharedLibrary::linkedIn(const SharedLibraryOptions& options) {
  void* handle = dlopen(nullptr, RTLD_NOW);
  COHORT_CHECK(handle) << "dlopen of the program itself failed: " << loaderError();
  return SharedLibrary(handle, options.what, "(linked in)");
}

SharedLibrary::SharedLibrary(void* handle, std::string what, std::string path)
    : handle_(handle), what_(std::move(what)), path_(std::move(path)) {}

SharedLibrary::SharedLibrary(SharedLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), what_(std::move(other.what_)), path_(std::move(other.path_)) {}

SharedLibrary& SharedLibrary::operator=(SharedLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_) dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    what_ = std::move(other.what_);
    path_ = std::move(other.path_);
  }
  return *this;
}

SharedLibrary::~SharedLibrary() {
  if (handle_) dlclose(handle_);  // drops our reference; RTLD_NODELETE keeps the library mapped
}

void* SharedLibrary::address(const char* name) const {
  COHORT_CHECK(handle_ != nullptr) << "function(" << name << ") of a moved-from SharedLibrary";
  dlerror();  // clear a stale message, so the one below is dlsym's
  void* address = dlsym(handle_, name);
  if (address == nullptr) {
    COHORT_THROW(IoError) << what_ << " (" << path_ << ") has no function " << name << " (" << loaderError()
                          << "): it is older than the headers Cohort was built with";
  }
  return address;
}

}  // namespace cohort::runtime
