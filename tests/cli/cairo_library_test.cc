// CairoLibrary (cli/cairo_library.h): cairo is opened, not linked. A program linked with it has not
// loaded cairo when it starts; a CairoLibrary loads libcairo.so.2, resolves every function the plots
// call and draws with them; a cairo that cannot be opened is one IoError line naming the file and
// Debian's package.
#include "cli/cairo_library.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "runtime/error.h"

namespace cohort::cli {
namespace {

bool loaded(const char* soname) {
  void* handle = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);
  return handle != nullptr;
}

// Read during static initialisation: after the loader has mapped every library the program links,
// before any test has run (whatever their order).
const bool kLoadedAtStart = loaded(kCairoFileName);

TEST(CairoLibrary, CairoIsNotLoadedWhenTheProgramStarts) {
  EXPECT_FALSE(kLoadedAtStart) << "linking //cli:cairo_library loads cairo again: every training worker pays for it";
}

TEST(CairoLibrary, LoadsCairoAndDrawsWithIt) {
  const CairoLibrary cairo;
  EXPECT_TRUE(loaded(kCairoFileName));
  EXPECT_TRUE(std::filesystem::path(cairo.library.path()).is_absolute()) << cairo.library.path();
  EXPECT_STREQ(cairo.statusToString(CAIRO_STATUS_NO_MEMORY), "out of memory");

  cairo_surface_t* surface = cairo.imageSurfaceCreate(CAIRO_FORMAT_RGB24, 8, 4);
  ASSERT_EQ(cairo.surfaceStatus(surface), CAIRO_STATUS_SUCCESS);
  cairo_t* cr = cairo.create(surface);
  cairo.setSourceRgb(cr, 1, 1, 1);
  cairo.paint(cr);
  cairo.setSourceRgb(cr, 0, 0, 1);
  cairo.rectangle(cr, 0, 0, 4, 4);
  cairo.fillPreserve(cr);
  cairo.newPath(cr);
  cairo.selectFontFace(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo.setFontSize(cr, 10);
  cairo_text_extents_t extents;
  cairo.textExtents(cr, "loss", &extents);
  EXPECT_GT(extents.x_advance, 0);
  EXPECT_EQ(cairo.status(cr), CAIRO_STATUS_SUCCESS);
  cairo.destroy(cr);
  cairo.surfaceFinish(surface);
  EXPECT_EQ(cairo.surfaceStatus(surface), CAIRO_STATUS_SUCCESS);
  cairo.surfaceDestroy(surface);

  const CairoLibrary again;  // already loaded: the same library, the same functions
  EXPECT_EQ(again.library.path(), cairo.library.path());
  EXPECT_EQ(again.paint, cairo.paint);
}

// What `cohort plot` prints (as "cohort: error: ...", exit code 2) on a machine without libcairo2.
TEST(CairoLibrary, AMissingCairoIsOneLineNamingTheFileAndThePackage) {
  try {
    const CairoLibrary cairo("libcairo.so.999");
    FAIL() << "opened " << cairo.library.path();
  } catch (const IoError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("libcairo.so.999: cannot open shared object file"), std::string::npos) << message;
    EXPECT_NE(message.find("/usr/lib/x86_64-linux-gnu/libcairo.so.999"), std::string::npos) << message;
    EXPECT_NE(message.find("libcairo2"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(e.code(), ExitCode::kUsage);
  }
}

}  // namespace
}  // namespace cohort::cli
