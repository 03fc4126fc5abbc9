// The drawing vocabulary of cli/plot.h: an Axis with "nice" ticks, and a Canvas (a cairo context on
// a surface, with text and a legend in units that grow with the image). cairo is called through a
// CairoLibrary (cli/cairo_library.h), opened when a plot is drawn: nothing here links it.
//
// Ticks are 1, 2 or 5 times a power of ten, and an axis's range is widened to whole ticks, so every
// label is short and round (0, 0.5, 1, 1.5; 0, 2k, 4k). Sizes given to a Canvas (fonts, gaps) are
// pixels of a 960x540 image, multiplied by scale() (the square root of the area's ratio to that, so a
// tall image is not scaled by its width alone): a large image is not all margin, a small one not all
// text. Text uses cairo's toy API with DejaVu Sans (Debian's fonts-dejavu-core; fontconfig substitutes
// another sans-serif face where it is missing).
// Ownership: a Canvas owns its cairo context, not the surface or the CairoLibrary, which must
// outlive it.
// Thread safety: none; one Canvas per thread.
//
//   Axis y = niceAxis({.lo = 0.12, .hi = 2.31, .ticks = 6});   // 0 to 2.5 by 0.5
//   for (double v : y.ticks()) canvas.text(x, top + (1 - y.fraction(v)) * h, y.label(v), ink, {.h = 1});
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cli/cairo_library.h"

namespace cohort::cli {

struct Point {
  double x = 0, y = 0;
};

struct Rect {
  double x = 0, y = 0, w = 0, h = 0;
};

struct Size {
  int width = 0, height = 0;  // pixels
};

struct Colour {
  double r = 0, g = 0, b = 0;
};

struct Axis {
  double lo = 0, hi = 1;  // the range shown
  double step = 0;        // between ticks; 0: no ticks

  // Where v lies: 0 at lo, 1 at hi.
  double fraction(double v) const { return (v - lo) / (hi - lo); }
  // lo, lo + step, ..., hi (each computed as k * step, so no error accumulates).
  std::vector<double> ticks() const;
  // v with the decimals the step needs, thousands as "k" and millions as "M" once the values are large.
  std::string label(double v) const;
};

struct AxisOptions {
  double lo = 0, hi = 1;  // the values to cover
  int ticks = 5;          // about how many ticks
  double minStep = 0;     // e.g. 1 for whole steps or epochs
};

// The range [lo, hi] widened to whole nice steps, about `ticks` of them.
Axis niceAxis(const AxisOptions& options);

// Deletes copy: it owns a cairo context.
class Canvas {
 public:
  Canvas(const CairoLibrary& cairo, cairo_surface_t* surface, Size size);
  ~Canvas();
  Canvas(const Canvas&) = delete;
  Canvas& operator=(const Canvas&) = delete;

  // The functions to draw on cr() with.
  const CairoLibrary& cairo() const { return library_; }
  cairo_t* cr() const { return cr_; }
  double scale() const { return scale_; }

  enum class Weight { kNormal, kBold };
  // DejaVu Sans at `size` pixels (times scale()).
  void setFont(double size, Weight weight);
  double lineHeight() const;
  double textWidth(const std::string& text) const;
  // `text` cut from the front ("…" standing for the cut) to at most `width`.
  std::string fitText(const std::string& text, double width) const;

  struct Align {
    double h = 0;  // 0: starts at x, 0.5: centred on x, 1: ends at x; always centred on y
  };
  void text(double x, double y, const std::string& text, const Colour& colour, Align align);

  // A legend entry: its label, and how to draw its key in the box (x, y centre line, w long).
  struct LegendEntry {
    std::string label;
    std::function<void(double x, double y, double w)> key;
  };
  // The entries in centred rows across box.w, from box.y down; returns the height they took.
  double legend(const std::vector<LegendEntry>& entries, const Rect& box);

 private:
  const CairoLibrary& library_;
  cairo_t* cr_;
  double scale_;
};

// A horizontal axis over `range` for an area `width` pixels wide: as many ticks as there is room
// for with their labels apart (at most 10).
Axis fitTicks(const Canvas& canvas, const AxisOptions& range, double width);

// A coordinate on a pixel's centre, so a one-pixel line is sharp.
double crisp(double v);

}  // namespace cohort::cli
