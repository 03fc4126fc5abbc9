// CairoLibrary: the cairo functions the plots call (cli/plot.h), opened at run time when a plot is
// drawn rather than linked. Linked, cairo brought X11, xcb, freetype, fontconfig, pixman, png and
// their dependencies (18 shared objects, 1.7 MiB resident) into every process that started
// `cohort`, training workers included (docs/build.md, "What a CPU worker costs"); opened here, only
// `cohort plot` and a `cohort train --plot` run's rank 0 load them, when they draw.
//
// The contract is that of the tables in runtime/shared_library.h (how the library is looked for,
// errors, lifetime, thread safety): this one opens libcairo.so.2 (Debian's libcairo2), falling back
// to the directory where Debian installs it. A machine without it fails with one IoError naming the
// file and the package (exit code 2 from `cohort`). Its members are cairo's functions, named without
// the "cairo_" prefix, in camelCase (cairo_set_source_rgb is setSourceRgb), with cairo's own contract.
// Unlike the CUDA tables it always opens the real library (cudasim's build has no emulated cairo).
//
//   const CairoLibrary cairo;
//   cairo_surface_t* surface = cairo.imageSurfaceCreate(CAIRO_FORMAT_RGB24, 640, 480);
//   cairo_t* cr = cairo.create(surface);
#pragma once

#include <cairo/cairo-svg.h>
#include <cairo/cairo.h>

#include <string>

#include "runtime/shared_library.h"

namespace cohort::cli {

// The file CairoLibrary opens: the SONAME of cairo 1.x, the ABI of the headers Cohort is built with.
inline constexpr char kCairoFileName[] = "libcairo.so.2";

struct CairoLibrary {
  // Opens `fileName` (another name only in tests: a missing one checks the message).
  explicit CairoLibrary(const std::string& fileName = kCairoFileName);

  runtime::SharedLibrary library;  // first: the functions below are resolved from it

  // Surfaces: PNG (an image surface, written at the end) and SVG (written as it is drawn), both
  // through a write function: the caller opens the file (runtime/output_file.h), never cairo.
  decltype(&::cairo_image_surface_create) const imageSurfaceCreate;
  decltype(&::cairo_svg_surface_create_for_stream) const svgSurfaceCreateForStream;
  decltype(&::cairo_svg_surface_set_document_unit) const svgSurfaceSetDocumentUnit;
  decltype(&::cairo_surface_write_to_png_stream) const surfaceWriteToPngStream;
  decltype(&::cairo_surface_finish) const surfaceFinish;
  decltype(&::cairo_surface_status) const surfaceStatus;
  decltype(&::cairo_surface_destroy) const surfaceDestroy;
  decltype(&::cairo_status_to_string) const statusToString;

  // Contexts, paths and strokes.
  decltype(&::cairo_create) const create;
  decltype(&::cairo_destroy) const destroy;
  decltype(&::cairo_status) const status;
  decltype(&::cairo_save) const save;
  decltype(&::cairo_restore) const restore;
  decltype(&::cairo_set_source_rgb) const setSourceRgb;
  decltype(&::cairo_set_source_rgba) const setSourceRgba;
  decltype(&::cairo_set_line_width) const setLineWidth;
  decltype(&::cairo_set_line_join) const setLineJoin;
  decltype(&::cairo_set_dash) const setDash;
  decltype(&::cairo_new_path) const newPath;
  decltype(&::cairo_move_to) const moveTo;
  decltype(&::cairo_line_to) const lineTo;
  decltype(&::cairo_arc) const arc;
  decltype(&::cairo_rectangle) const rectangle;
  decltype(&::cairo_stroke) const stroke;
  decltype(&::cairo_fill_preserve) const fillPreserve;
  decltype(&::cairo_paint) const paint;
  decltype(&::cairo_clip) const clip;

  // Text (the toy API).
  decltype(&::cairo_select_font_face) const selectFontFace;
  decltype(&::cairo_set_font_size) const setFontSize;
  decltype(&::cairo_font_extents) const fontExtents;
  decltype(&::cairo_text_extents) const textExtents;
  decltype(&::cairo_show_text) const showText;
};

}  // namespace cohort::cli
