#include "cli/plot.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "cli/cairo_library.h"  // cairo, opened when a plot is drawn
#include "cli/metrics_file.h"   // the files' lines
#include "cli/plot_canvas.h"    // nice ticks, text, the legend
#include "runtime/error.h"
#include "runtime/output_file.h"  // the image is written as every output is

namespace cohort::cli {

namespace {

enum class Format { kPng, kSvg };

Format formatOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  std::string ext = dot == std::string::npos || (slash != std::string::npos && dot < slash) ? "" : path.substr(dot);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".png") return Format::kPng;
  if (ext == ".svg") return Format::kSvg;
  COHORT_THROW(InvalidArgument) << path << ": cannot draw a plot as '" << (ext.empty() ? "(no extension)" : ext)
                                << "': the output must end in .png or .svg";
}

// The file's name, with as many of its folders as make it differ from the other runs' (two runs'
// metrics.jsonl in run1/ and run2/ read run1/metrics.jsonl and run2/metrics.jsonl).
std::vector<std::string> labelsOf(const std::vector<PlotRun>& runs) {
  std::vector<std::vector<std::string>> parts(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string& p = runs[i].metricsPath;
    for (size_t start = 0; start <= p.size();) {
      const size_t end = std::min(p.find('/', start), p.size());
      if (end > start) parts[i].push_back(p.substr(start, end - start));
      start = end + 1;
    }
    if (parts[i].empty()) parts[i].push_back(p);
  }
  std::vector<size_t> depth(runs.size(), 1);
  auto joined = [&](size_t i) {
    std::string s;
    for (size_t k = parts[i].size() - std::min(depth[i], parts[i].size()); k < parts[i].size(); ++k) {
      s += (s.empty() ? "" : "/") + parts[i][k];
    }
    return s;
  };
  // Every name shared by two runs grows a folder at once (growing one would leave the other short).
  for (bool changed = true; changed;) {
    std::vector<bool> grow(runs.size(), false);
    for (size_t i = 0; i < runs.size(); ++i) {
      for (size_t j = 0; j < runs.size(); ++j) grow[i] = grow[i] || (i != j && joined(i) == joined(j));
    }
    changed = false;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (grow[i] && depth[i] < parts[i].size()) ++depth[i], changed = true;
    }
  }
  std::vector<std::string> labels(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) labels[i] = runs[i].label.empty() ? joined(i) : runs[i].label;
  return labels;
}

// Optimizer steps per epoch, for placing step lines against the epoch: from the first epoch line
// (every epoch of a run has the same batches), else from the step lines (an epoch's steps are at
// least step / epoch); 0 when unknown.
double stepsPerEpoch(const MetricsFile& f) {
  const MetricsLine* first = nullptr;
  for (const MetricsLine& e : f.epochs) {
    if (e.epoch > 0 && (!first || e.epoch < first->epoch)) first = &e;
  }
  if (first) return first->step / first->epoch;
  double most = 0;
  for (const MetricsLine& s : f.steps) {
    if (s.epoch > 0) most = std::max(most, s.step / s.epoch);
  }
  return most;
}

enum class Style { kTrain, kTest, kTrainSteps };

struct Series {
  int run = 0;
  Style style = Style::kTrain;
  std::vector<Point> points;  // sorted by x, one per x
};

struct Panel {
  std::string name;
  std::vector<Series> series;
  bool accuracy = false;
};

// What the image shows.
struct Figure {
  std::string title;
  std::vector<std::string> labels;  // one per run
  std::vector<Panel> panels;
  AxisOptions x;      // the values every panel's horizontal axis covers
  std::string xName;  // "step" or "epoch"
};

using XOf = std::function<double(const MetricsLine&)>;

// The curve of one figure: finite values only, sorted by x; of several points at one x (a resumed run
// logs some steps twice) the file's last.
std::vector<Point> curveOf(const std::vector<MetricsLine>& lines, double MetricsLine::*figure, const XOf& xOf) {
  std::vector<Point> points;
  for (const MetricsLine& m : lines) {
    if (std::isfinite(m.*figure)) points.push_back({xOf(m), m.*figure});
  }
  std::stable_sort(points.begin(), points.end(), [](const Point& a, const Point& b) { return a.x < b.x; });
  std::vector<Point> unique;
  for (const Point& p : points) {
    if (!unique.empty() && unique.back().x == p.x)
      unique.back() = p;
    else
      unique.push_back(p);
  }
  return unique;
}

// The test curve: the epoch lines' figures and, with --eval-every, the eval lines' at their steps
// (the epoch's evaluation is one of them where both exist: the same samples, the same figure).
std::vector<Point> testCurve(const MetricsFile& f, double MetricsLine::*figure, const XOf& epochX, const XOf& stepX) {
  std::vector<MetricsLine> lines = f.evals;
  lines.insert(lines.end(), f.epochs.begin(), f.epochs.end());
  // One x for both kinds (curveOf reads `lines` in place): eval lines as step lines, the rest as epochs.
  const MetricsLine* firstEpoch = lines.data() + f.evals.size();
  return curveOf(lines, figure, [&](const MetricsLine& m) { return &m < firstEpoch ? stepX(m) : epochX(m); });
}

std::vector<Panel> panelsOf(const std::vector<MetricsFile>& files, PlotAxis axis) {
  Panel loss{"loss", {}, false}, accuracy{"accuracy", {}, true};
  auto add = [](Panel& panel, int run, Style style, std::vector<Point> points) {
    if (!points.empty()) panel.series.push_back({run, style, std::move(points)});
  };
  for (size_t i = 0; i < files.size(); ++i) {
    const MetricsFile& f = files[i];
    const int run = static_cast<int>(i);
    const double perEpoch = axis == PlotAxis::kEpoch ? stepsPerEpoch(f) : 0;
    XOf epochX = [](const MetricsLine& m) { return m.step; };
    XOf stepX = epochX;
    if (axis == PlotAxis::kEpoch) {
      epochX = [](const MetricsLine& m) { return m.epoch; };
      stepX = [perEpoch](const MetricsLine& m) { return perEpoch > 0 ? m.step / perEpoch : m.epoch; };
    }
    add(loss, run, Style::kTrainSteps, curveOf(f.steps, &MetricsLine::trainLoss, stepX));
    add(loss, run, Style::kTrain, curveOf(f.epochs, &MetricsLine::trainLoss, epochX));
    add(loss, run, Style::kTest, testCurve(f, &MetricsLine::testLoss, epochX, stepX));
    add(accuracy, run, Style::kTrainSteps, curveOf(f.steps, &MetricsLine::trainAcc, stepX));
    add(accuracy, run, Style::kTrain, curveOf(f.epochs, &MetricsLine::trainAcc, epochX));
    add(accuracy, run, Style::kTest, testCurve(f, &MetricsLine::testAcc, epochX, stepX));
  }
  std::vector<Panel> panels;
  for (Panel* p : {&loss, &accuracy}) {
    if (!p->series.empty()) panels.push_back(std::move(*p));
  }
  return panels;
}

// Every panel's horizontal axis: from 0 (or below, if some x is) to the largest x, in whole steps, or
// whole epochs once there are two.
AxisOptions xRangeOf(const std::vector<Panel>& panels, PlotAxis axis) {
  double lo = 0, hi = 0;
  for (const Panel& p : panels) {
    for (const Series& s : p.series) lo = std::min(lo, s.points.front().x), hi = std::max(hi, s.points.back().x);
  }
  if (hi <= lo) hi = lo + 1;
  return {.lo = lo, .hi = hi, .minStep = axis == PlotAxis::kStep || hi - lo >= 2 ? 1.0 : 0.0};
}

// matplotlib's "tab10": distinct, and familiar from other training plots.
constexpr Colour kRunColours[] = {
    {0.122, 0.467, 0.706}, {1.000, 0.498, 0.055}, {0.173, 0.627, 0.173}, {0.839, 0.153, 0.157}, {0.580, 0.404, 0.741},
    {0.549, 0.337, 0.294}, {0.890, 0.467, 0.761}, {0.498, 0.498, 0.498}, {0.737, 0.741, 0.133}, {0.090, 0.745, 0.812}};
constexpr Colour kInk{0.15, 0.15, 0.15}, kKeyInk{0.35, 0.35, 0.35}, kGrid{0.88, 0.88, 0.88};

Colour runColour(int run) { return kRunColours[run % std::size(kRunColours)]; }

// How each style is stroked: epoch curves solid (train) or dashed (test), step curves thin and light.
void setStroke(const Canvas& canvas, Style style, const Colour& c) {
  const CairoLibrary& cairo = canvas.cairo();
  cairo_t* cr = canvas.cr();
  const double s = canvas.scale(), dash[] = {6 * s, 4 * s};
  cairo.setSourceRgba(cr, c.r, c.g, c.b, style == Style::kTrainSteps ? 0.5 : 1);
  cairo.setLineWidth(cr, (style == Style::kTrainSteps ? 1 : 2) * s);
  cairo.setDash(cr, dash, style == Style::kTest ? 2 : 0, 0);
  cairo.setLineJoin(cr, CAIRO_LINE_JOIN_ROUND);
}

// A panel's plotting area and its axes.
struct Frame {
  Rect area;
  Axis x, y;
  Point at(const Point& p) const {
    return {area.x + x.fraction(p.x) * area.w, area.y + (1 - y.fraction(p.y)) * area.h};
  }
};

// Epoch curves mark their points while they are few enough to tell apart (a one-point curve would
// otherwise not show at all): train filled, test hollow.
constexpr size_t kMostMarkedPoints = 40;

void drawSeries(const Canvas& canvas, const Series& series, const Frame& frame) {
  const CairoLibrary& cairo = canvas.cairo();
  cairo_t* cr = canvas.cr();
  const Colour c = runColour(series.run);
  setStroke(canvas, series.style, c);
  cairo.newPath(cr);
  for (const Point& p : series.points) {
    const Point q = frame.at(p);
    cairo.lineTo(cr, q.x, q.y);
  }
  cairo.stroke(cr);
  if (series.style == Style::kTrainSteps || series.points.size() > kMostMarkedPoints) return;
  cairo.setDash(cr, nullptr, 0, 0);
  cairo.setLineWidth(cr, 1.5 * canvas.scale());
  for (const Point& p : series.points) {
    const Point q = frame.at(p);
    cairo.newPath(cr);
    cairo.arc(cr, q.x, q.y, 3 * canvas.scale(), 0, 2 * M_PI);
    if (series.style == Style::kTest) cairo.setSourceRgb(cr, 1, 1, 1);
    cairo.fillPreserve(cr);
    cairo.setSourceRgb(cr, c.r, c.g, c.b);
    cairo.stroke(cr);
  }
}

// The range of a panel's values, widened a little so no curve runs along the frame, but not past 0
// (or, for accuracy, 1) when the values do not cross it.
AxisOptions valueRange(const Panel& panel) {
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& s : panel.series) {
    for (const Point& p : s.points) lo = std::min(lo, p.y), hi = std::max(hi, p.y);
  }
  const double pad = hi > lo ? 0.03 * (hi - lo) : std::max(0.05 * std::abs(lo), 0.05);
  AxisOptions o{.lo = lo - pad, .hi = hi + pad};
  if (lo >= 0) o.lo = std::max(o.lo, 0.0);
  if (panel.accuracy && hi <= 1) o.hi = std::min(o.hi, 1.0);
  return o;
}

// Grid lines and tick labels for both axes, and the horizontal axis's name.
void drawGrid(Canvas& canvas, const Frame& f, const std::string& xName) {
  const CairoLibrary& cairo = canvas.cairo();
  cairo_t* cr = canvas.cr();
  const double s = canvas.scale(), lineH = canvas.lineHeight();
  cairo.setSourceRgb(cr, kGrid.r, kGrid.g, kGrid.b);
  cairo.setLineWidth(cr, 1);
  cairo.setDash(cr, nullptr, 0, 0);
  for (double v : f.y.ticks()) {
    const double py = crisp(f.at({f.x.lo, v}).y);
    cairo.setSourceRgb(cr, kGrid.r, kGrid.g, kGrid.b);
    cairo.moveTo(cr, f.area.x, py);
    cairo.lineTo(cr, f.area.x + f.area.w, py);
    cairo.stroke(cr);
    canvas.text(f.area.x - 5 * s, py, f.y.label(v), kInk, {.h = 1});
  }
  for (double v : f.x.ticks()) {
    const double px = crisp(f.at({v, f.y.lo}).x);
    cairo.setSourceRgb(cr, kGrid.r, kGrid.g, kGrid.b);
    cairo.moveTo(cr, px, f.area.y);
    cairo.lineTo(cr, px, f.area.y + f.area.h);
    cairo.stroke(cr);
    canvas.text(px, f.area.y + f.area.h + 0.8 * lineH, f.x.label(v), kInk, {.h = 0.5});
  }
  canvas.text(f.area.x + f.area.w / 2, f.area.y + f.area.h + 1.9 * lineH, xName, kKeyInk, {.h = 0.5});
}

void drawPanel(Canvas& canvas, const Figure& figure, const Panel& panel, const Rect& box) {
  const CairoLibrary& cairo = canvas.cairo();
  cairo_t* cr = canvas.cr();
  const double s = canvas.scale();
  canvas.setFont(13, Canvas::Weight::kBold);
  canvas.text(box.x, box.y + 8 * s, panel.name, kInk, {.h = 0});
  canvas.setFont(11, Canvas::Weight::kNormal);
  const double top = box.y + 22 * s, bottom = box.y + box.h - 2.4 * canvas.lineHeight();
  AxisOptions yRange = valueRange(panel);
  yRange.ticks = std::clamp(static_cast<int>((bottom - top) / (40 * s)), 3, 8);
  Frame f;
  f.y = niceAxis(yRange);
  double labelW = 0;
  for (double v : f.y.ticks()) labelW = std::max(labelW, canvas.textWidth(f.y.label(v)));
  f.area = {box.x + labelW + 8 * s, top, box.w - labelW - 8 * s - 12 * s, bottom - top};
  f.x = fitTicks(canvas, figure.x, f.area.w);
  drawGrid(canvas, f, figure.xName);

  // Step curves beneath, then test, then train on top; clipped a little outside the frame so that
  // markers on it stay whole.
  cairo.save(cr);
  const double slack = 4 * s;
  cairo.rectangle(cr, f.area.x - slack, f.area.y - slack, f.area.w + 2 * slack, f.area.h + 2 * slack);
  cairo.clip(cr);
  for (Style style : {Style::kTrainSteps, Style::kTest, Style::kTrain}) {
    for (const Series& series : panel.series) {
      if (series.style == style) drawSeries(canvas, series, f);
    }
  }
  cairo.restore(cr);

  cairo.setSourceRgb(cr, kKeyInk.r, kKeyInk.g, kKeyInk.b);
  cairo.setLineWidth(cr, 1);
  cairo.setDash(cr, nullptr, 0, 0);
  cairo.rectangle(cr, crisp(f.area.x), crisp(f.area.y), std::round(f.area.w), std::round(f.area.h));
  cairo.stroke(cr);
}

// The legend: a colour per run, then the line styles present. Returns the height it took.
double drawLegend(Canvas& canvas, const Figure& figure, const Rect& box) {
  bool haveTest = false, haveSteps = false;
  for (const Panel& p : figure.panels) {
    for (const Series& s : p.series) {
      haveTest |= s.style == Style::kTest;
      haveSteps |= s.style == Style::kTrainSteps;
    }
  }
  auto key = [&canvas](Style style, Colour colour, double width) {
    return [&canvas, style, colour, width](double x, double y, double w) {
      const CairoLibrary& cairo = canvas.cairo();
      setStroke(canvas, style, colour);
      cairo.setLineWidth(canvas.cr(), width * canvas.scale());
      cairo.moveTo(canvas.cr(), x, y);
      cairo.lineTo(canvas.cr(), x + w, y);
      cairo.stroke(canvas.cr());
    };
  };
  std::vector<Canvas::LegendEntry> entries;
  for (size_t i = 0; i < figure.labels.size(); ++i) {
    entries.push_back({figure.labels[i], key(Style::kTrain, runColour(static_cast<int>(i)), 3)});
  }
  entries.push_back({haveSteps ? "train (epoch)" : "train", key(Style::kTrain, kKeyInk, 2)});
  if (haveTest) entries.push_back({"test", key(Style::kTest, kKeyInk, 2)});
  if (haveSteps) entries.push_back({"train (logged steps)", key(Style::kTrainSteps, kKeyInk, 1)});
  return canvas.legend(entries, box);
}

// The title, the legend beneath it, and the panels side by side (stacked in a tall image).
void draw(Canvas& canvas, const Figure& figure, const PlotOptions& options) {
  const CairoLibrary& cairo = canvas.cairo();
  cairo_t* cr = canvas.cr();
  const double s = canvas.scale(), w = options.width, h = options.height, margin = 12 * s;
  cairo.setSourceRgb(cr, 1, 1, 1);
  cairo.paint(cr);
  canvas.setFont(17, Canvas::Weight::kBold);
  canvas.text(w / 2, margin + 8 * s, canvas.fitText(figure.title, w - 2 * margin), kInk, {.h = 0.5});
  canvas.setFont(11, Canvas::Weight::kNormal);
  const double legendTop = margin + 26 * s;
  const double legendH = drawLegend(canvas, figure, {margin, legendTop, w - 2 * margin, 0});
  const Rect body{margin, legendTop + legendH + 8 * s, w - 2 * margin, h - legendTop - legendH - 8 * s - margin};
  const bool sideBySide = w >= h;
  const double gap = 24 * s;
  const double n = static_cast<double>(figure.panels.size());
  for (size_t i = 0; i < figure.panels.size(); ++i) {
    Rect box = body;
    if (sideBySide)
      box.w = (body.w - gap * (n - 1)) / n, box.x = body.x + i * (box.w + gap);
    else
      box.h = (body.h - gap * (n - 1)) / n, box.y = body.y + i * (box.h + gap);
    drawPanel(canvas, figure, figure.panels[i], box);
  }
}

// cairo's write function: into the output's temporary (runtime/output_file.h); the first failure is
// kept for the message (cairo's own status says only "error while writing to output stream").
struct StreamTarget {
  runtime::OutputFile* file;
  std::string error;
};
cairo_status_t writeToOutput(void* closure, const unsigned char* data, unsigned int length) {
  auto* target = static_cast<StreamTarget*>(closure);
  try {
    target->file->write(data, length);
    return CAIRO_STATUS_SUCCESS;
  } catch (const IoError& e) {
    if (target->error.empty()) target->error = e.what();
    return CAIRO_STATUS_WRITE_ERROR;
  }
}

}  // namespace

PlotSummary writePlot(const std::vector<PlotRun>& runs, const PlotOptions& options) {
  const Format format = formatOf(options.outputPath);
  if (options.width < 240 || options.width > 16384 || options.height < 180 || options.height > 16384) {
    COHORT_THROW(InvalidArgument) << "a plot of " << options.width << "x" << options.height
                                  << " pixels: the width must be 240 to 16384 and the height 180 to 16384";
  }
  if (runs.empty()) COHORT_THROW(InvalidArgument) << "no metrics files to plot";
  const CairoLibrary cairo;  // loaded here, not at start (cli/cairo_library.h)
  std::vector<MetricsFile> files;
  PlotSummary summary;
  for (const PlotRun& run : runs) {
    files.push_back(readMetricsFile(run.metricsPath));
    summary.nonFinite += files.back().nonFinite;
  }
  summary.runs = static_cast<int>(runs.size());
  Figure figure;
  figure.labels = labelsOf(runs);
  figure.panels = panelsOf(files, options.x);
  figure.x = xRangeOf(figure.panels, options.x);
  figure.xName = options.x == PlotAxis::kEpoch ? "epoch" : "step";
  for (const Panel& p : figure.panels) {
    for (const Series& s : p.series) summary.points += static_cast<int64_t>(s.points.size());
  }
  figure.title = !options.title.empty() ? options.title
                 : runs.size() == 1     ? "Training curves: " + figure.labels[0]
                                        : "Training curves: " + std::to_string(runs.size()) + " runs";

  runtime::OutputFile out(options.outputPath, {.mode = runtime::OutputMode::kUserVisible});
  StreamTarget target{&out, ""};
  std::unique_ptr<cairo_surface_t, void (*)(cairo_surface_t*)> surface(
      format == Format::kSvg
          ? cairo.svgSurfaceCreateForStream(writeToOutput, &target, options.width, options.height)
          : cairo.imageSurfaceCreate(CAIRO_FORMAT_RGB24, options.width, options.height),
      cairo.surfaceDestroy);
  auto check = [&](cairo_status_t status, const char* what) {
    if (!target.error.empty()) COHORT_THROW(IoError) << target.error;
    if (status != CAIRO_STATUS_SUCCESS) {
      COHORT_THROW(IoError) << options.outputPath << ": cannot " << what << ": " << cairo.statusToString(status);
    }
  };
  check(cairo.surfaceStatus(surface.get()), "create the image");
  if (format == Format::kSvg) cairo.svgSurfaceSetDocumentUnit(surface.get(), CAIRO_SVG_UNIT_PX);
  {
    Canvas canvas(cairo, surface.get(), {.width = options.width, .height = options.height});
    draw(canvas, figure, options);
    check(cairo.status(canvas.cr()), "draw the plot");
  }
  if (format == Format::kPng) check(cairo.surfaceWriteToPngStream(surface.get(), writeToOutput, &target), "write the PNG");
  cairo.surfaceFinish(surface.get());  // the SVG is written now
  check(cairo.surfaceStatus(surface.get()), "write the SVG");
  out.commit();
  return summary;
}

PlotSummary writePlot(const std::string& metricsPath, const PlotOptions& options) {
  return writePlot(std::vector<PlotRun>{{metricsPath, ""}}, options);
}

PlotMetricsFile::PlotMetricsFile() {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/cohort-plot-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) {
    COHORT_THROW(IoError) << "--plot: cannot create a directory " << dir << " for the run's metrics: "
                          << std::strerror(errno) << " (set TMPDIR to a writable directory, or give --metrics)";
  }
  directory_ = dir;
}

PlotMetricsFile::~PlotMetricsFile() {
  ::unlink(path().c_str());
  ::rmdir(directory_.c_str());
}

}  // namespace cohort::cli
