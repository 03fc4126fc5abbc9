#include "cli/plot_canvas.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace cohort::cli {

namespace {

// The least of 1, 2, 5 and 10 times a power of ten that is not below v.
double niceNumber(double v) {
  const double power = std::pow(10.0, std::floor(std::log10(v)));
  const double f = v / power;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * power;
}

// Ratios of whole steps are computed in floating point; this much off a whole number is one.
constexpr double kSlack = 1e-9;

}  // namespace

Axis niceAxis(const AxisOptions& o) {
  double lo = o.lo, hi = o.hi;
  if (!(hi > lo)) {
    const double half = std::max(std::abs(lo) * 0.05, 0.5);
    lo -= half, hi += half;
  }
  const int ticks = std::max(o.ticks, 2);
  // The least nice step that covers the range in ticks - 1 steps (one more once widened to whole steps).
  const double step = std::max(niceNumber((hi - lo) / (ticks - 1)), o.minStep);
  return {std::floor(lo / step + kSlack) * step, std::ceil(hi / step - kSlack) * step, step};
}

std::vector<double> Axis::ticks() const {
  std::vector<double> out;
  if (step <= 0) return out;
  const double first = std::ceil(lo / step - kSlack), last = std::floor(hi / step + kSlack);
  for (double k = first; k <= last; ++k) out.push_back(k * step);
  return out;
}

std::string Axis::label(double v) const {
  double divisor = 1;
  const char* suffix = "";
  const double largest = std::max(std::abs(lo), std::abs(hi));
  if (largest >= 1e7 && step >= 1e6)
    divisor = 1e6, suffix = "M";
  else if (largest >= 1e4 && step >= 1e3)
    divisor = 1e3, suffix = "k";
  const double scaled = step / divisor;
  const int decimals = scaled >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(scaled) - kSlack));
  if (std::abs(v) < step * kSlack) v = 0;  // not "-0"
  if (v == 0 && divisor != 1) return "0";  // not "0k"
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f%s", decimals, v / divisor, suffix);
  return buffer;
}

Canvas::Canvas(const CairoLibrary& cairo, cairo_surface_t* surface, Size size)
    : library_(cairo),
      cr_(cairo.create(surface)),
      scale_(std::clamp(std::sqrt(size.width * static_cast<double>(size.height) / (960 * 540)), 0.7, 4.0)) {}

Canvas::~Canvas() { library_.destroy(cr_); }

void Canvas::setFont(double size, Weight weight) {
  library_.selectFontFace(cr_, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                          weight == Weight::kBold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  library_.setFontSize(cr_, size * scale_);
}

double Canvas::lineHeight() const {
  cairo_font_extents_t e;
  library_.fontExtents(cr_, &e);
  return e.height;
}

double Canvas::textWidth(const std::string& text) const {
  cairo_text_extents_t e;
  library_.textExtents(cr_, text.c_str(), &e);
  return e.x_advance;
}

std::string Canvas::fitText(const std::string& text, double width) const {
  if (textWidth(text) <= width) return text;
  const std::string ellipsis = "\u2026";
  for (size_t cut = 1; cut < text.size(); ++cut) {
    if ((static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) continue;  // inside a UTF-8 character
    const std::string shorter = ellipsis + text.substr(cut);
    if (textWidth(shorter) <= width) return shorter;
  }
  return ellipsis;
}

void Canvas::text(double x, double y, const std::string& text, const Colour& colour, Align align) {
  cairo_font_extents_t f;
  library_.fontExtents(cr_, &f);
  library_.setSourceRgb(cr_, colour.r, colour.g, colour.b);
  library_.moveTo(cr_, x - align.h * textWidth(text), y + (f.ascent - f.descent) / 2);
  library_.showText(cr_, text.c_str());
  library_.newPath(cr_);
}

double Canvas::legend(const std::vector<LegendEntry>& entries, const Rect& box) {
  const double keyW = 24 * scale_, keyGap = 5 * scale_, entryGap = 18 * scale_, rowH = lineHeight() * 1.35;
  // Rows of entries, each as wide as fits, every label cut to fit a row alone.
  struct Placed {
    const LegendEntry* entry;
    std::string label;
    double w;
  };
  std::vector<std::vector<Placed>> rows(1);
  std::vector<double> rowW(1, 0);
  for (const LegendEntry& e : entries) {
    const std::string label = fitText(e.label, box.w - keyW - keyGap);
    const double w = keyW + keyGap + textWidth(label);
    if (!rows.back().empty() && rowW.back() + entryGap + w > box.w) rows.emplace_back(), rowW.push_back(0);
    rowW.back() += (rows.back().empty() ? 0 : entryGap) + w;
    rows.back().push_back({&e, label, w});
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    double x = box.x + (box.w - rowW[r]) / 2;
    const double y = box.y + (r + 0.5) * rowH;
    for (const Placed& p : rows[r]) {
      library_.save(cr_);
      p.entry->key(x, y, keyW);
      library_.restore(cr_);
      text(x + keyW + keyGap, y, p.label, {0.15, 0.15, 0.15}, {.h = 0});
      x += p.w + entryGap;
    }
  }
  return rows.size() * rowH;
}

Axis fitTicks(const Canvas& canvas, const AxisOptions& range, double width) {
  for (int ticks = std::clamp(static_cast<int>(width / (65 * canvas.scale())), 2, 10);; --ticks) {
    AxisOptions o = range;
    o.ticks = ticks;
    const Axis axis = niceAxis(o);
    double widest = 0;
    for (double v : axis.ticks()) widest = std::max(widest, canvas.textWidth(axis.label(v)));
    const double spacing = width * axis.step / (axis.hi - axis.lo);
    if (ticks == 2 || widest * 1.5 <= spacing) return axis;
  }
}

double crisp(double v) { return std::floor(v) + 0.5; }

}  // namespace cohort::cli
