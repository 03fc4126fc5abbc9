// CairoLibrary (cli/cairo_library.h): cairo opened at run time.
#include "cli/cairo_library.h"

namespace cohort::cli {

namespace {

// Where Debian's libcairo2 installs it (dpkg -L libcairo2): the multiarch directory of x86-64, the
// only architecture Cohort builds for (.bazelrc). Debian's loader searches it anyway; a program run
// under another loader (a bundle's or an environment's own glibc) may not.
constexpr char kDebianLibraryDir[] = "/usr/lib/x86_64-linux-gnu";

}  // namespace

// Not COHORT_LIBRARY_FUNCTION: in the cudasim configuration that takes the function from the program
// itself, and nothing links cairo.
#define COHORT_CAIRO_FUNCTION(fn) library.function<decltype(::fn)>(#fn)

CairoLibrary::CairoLibrary(const std::string& fileName)
    : library(runtime::SharedLibrary::open(
          {.what = "cairo (Debian's package libcairo2)", .fileName = fileName, .fallbackDir = kDebianLibraryDir})),
      imageSurfaceCreate(COHORT_CAIRO_FUNCTION(cairo_image_surface_create)),
      svgSurfaceCreateForStream(COHORT_CAIRO_FUNCTION(cairo_svg_surface_create_for_stream)),
      svgSurfaceSetDocumentUnit(COHORT_CAIRO_FUNCTION(cairo_svg_surface_set_document_unit)),
      surfaceWriteToPngStream(COHORT_CAIRO_FUNCTION(cairo_surface_write_to_png_stream)),
      surfaceFinish(COHORT_CAIRO_FUNCTION(cairo_surface_finish)),
      surfaceStatus(COHORT_CAIRO_FUNCTION(cairo_surface_status)),
      surfaceDestroy(COHORT_CAIRO_FUNCTION(cairo_surface_destroy)),
      statusToString(COHORT_CAIRO_FUNCTION(cairo_status_to_string)),
      create(COHORT_CAIRO_FUNCTION(cairo_create)),
      destroy(COHORT_CAIRO_FUNCTION(cairo_destroy)),
      status(COHORT_CAIRO_FUNCTION(cairo_status)),
      save(COHORT_CAIRO_FUNCTION(cairo_save)),
      restore(COHORT_CAIRO_FUNCTION(cairo_restore)),
      setSourceRgb(COHORT_CAIRO_FUNCTION(cairo_set_source_rgb)),
      setSourceRgba(COHORT_CAIRO_FUNCTION(cairo_set_source_rgba)),
      setLineWidth(COHORT_CAIRO_FUNCTION(cairo_set_line_width)),
      setLineJoin(COHORT_CAIRO_FUNCTION(cairo_set_line_join)),
      setDash(COHORT_CAIRO_FUNCTION(cairo_set_dash)),
      newPath(COHORT_CAIRO_FUNCTION(cairo_new_path)),
      moveTo(COHORT_CAIRO_FUNCTION(cairo_move_to)),
      lineTo(COHORT_CAIRO_FUNCTION(cairo_line_to)),
      arc(COHORT_CAIRO_FUNCTION(cairo_arc)),
      rectangle(COHORT_CAIRO_FUNCTION(cairo_rectangle)),
      stroke(COHORT_CAIRO_FUNCTION(cairo_stroke)),
      fillPreserve(COHORT_CAIRO_FUNCTION(cairo_fill_preserve)),
      paint(COHORT_CAIRO_FUNCTION(cairo_paint)),
      clip(COHORT_CAIRO_FUNCTION(cairo_clip)),
      selectFontFace(COHORT_CAIRO_FUNCTION(cairo_select_font_face)),
      setFontSize(COHORT_CAIRO_FUNCTION(cairo_set_font_size)),
      fontExtents(COHORT_CAIRO_FUNCTION(cairo_font_extents)),
      textExtents(COHORT_CAIRO_FUNCTION(cairo_text_extents)),
      showText(COHORT_CAIRO_FUNCTION(cairo_show_text)) {}

#undef COHORT_CAIRO_FUNCTION

}  // namespace cohort::cli
