// `cohort plot` (issue 18): PNG and SVG files of the size asked for, the same bytes for the same
// input and other pixels for other data, runs overlaid in their own colours, the epoch axis, and
// bad input (a malformed line, a missing file, an unknown extension) exiting 2 with one line naming
// it and leaving no file. Metrics files are written by hand, in the format cohort train writes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

// An epoch line and, with `stepsPerEpoch`, step lines every 25 steps before it.
std::string metricsLines(int epochs, int stepsPerEpoch, double lossScale, bool accuracy) {
  std::string text;
  for (int e = 1; e <= epochs; ++e) {
    for (int s = (e - 1) * stepsPerEpoch + 25; s < e * stepsPerEpoch; s += 25) {
      text += "{\"epoch\":" + std::to_string(e) + ",\"step\":" + std::to_string(s) +
              ",\"lr\":0.1,\"samples_per_s\":9000," +
              "\"train_loss\":" + std::to_string(lossScale * 2.0 / (1 + s / 40.0)) + "}\n";
    }
    const double loss = lossScale / e;
    text += "{\"epoch\":" + std::to_string(e) + ",\"step\":" + std::to_string(e * stepsPerEpoch) +
            ",\"train_loss\":" + std::to_string(loss) + ",\"test_loss\":" + std::to_string(loss * 0.9) +
            ",\"samples_per_s\":9000.5,\"run_samples_per_s\":8000.25,\"lr\":0.1,\"grad_norm\":1.5,"
            "\"grad_norm_max\":3.25,\"skipped_steps\":0";
    if (accuracy) {
      text += ",\"train_acc\":" + std::to_string(1 - loss / 4) + ",\"test_acc\":" + std::to_string(1 - loss / 3);
    }
    text += "}\n";
  }
  return text;
}

uint32_t bigEndian32(const std::string& bytes, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

// An 8-bit RGB or RGBA, non-interlaced PNG's pixels (what cairo writes), as RGB; fails the test
// on anything else.
struct Image {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgb;

  // Pixels within 40 of the colour in every channel.
  int countNear(int r, int g, int b) const {
    int n = 0;
    for (size_t i = 0; i + 2 < rgb.size(); i += 3) {
      n += std::abs(rgb[i] - r) <= 40 && std::abs(rgb[i + 1] - g) <= 40 && std::abs(rgb[i + 2] - b) <= 40;
    }
    return n;
  }
};

Image decodePng(const std::string& png) {
  Image image;
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << "not a PNG signature";
  if (png.size() < 33 || png.substr(12, 4) != "IHDR") {
    ADD_FAILURE() << "no IHDR chunk first";
    return image;
  }
  image.width = bigEndian32(png, 16);
  image.height = bigEndian32(png, 20);
  const int depth = png[24], colourType = png[25], interlace = png[28];
  EXPECT_EQ(depth, 8);
  EXPECT_TRUE(colourType == 2 || colourType == 6) << colourType;
  EXPECT_EQ(interlace, 0);
  const size_t channels = colourType == 6 ? 4 : 3;
  std::string idat;
  bool sawEnd = false;
  for (size_t at = 8; at + 12 <= png.size();) {
    const uint32_t length = bigEndian32(png, at);
    const std::string type = png.substr(at + 4, 4);
    if (type == "IDAT") idat += png.substr(at + 8, length);
    if (type == "IEND") sawEnd = true;
    at += 12 + length;
  }
  EXPECT_TRUE(sawEnd) << "no IEND chunk";
  const size_t stride = image.width * channels;
  std::vector<uint8_t> raw(image.height * (1 + stride));
  uLongf rawSize = raw.size();
  if (uncompress(raw.data(), &rawSize, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK ||
      rawSize != raw.size()) {
    ADD_FAILURE() << "IDAT does not inflate to " << raw.size() << " bytes";
    return image;
  }
  // Undo each row's filter (PNG spec §9) in place; `prev` is the row above, unfiltered.
  std::vector<uint8_t> prev(stride, 0), row(stride);
  for (uint32_t y = 0; y < image.height; ++y) {
    const uint8_t filter = raw[y * (1 + stride)];
    const uint8_t* in = &raw[y * (1 + stride) + 1];
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= channels ? row[i - channels] : 0, b = prev[i], c = i >= channels ? prev[i - channels] : 0;
      int predicted = 0;
      if (filter == 1)
        predicted = a;
      else if (filter == 2)
        predicted = b;
      else if (filter == 3)
        predicted = (a + b) / 2;
      else if (filter == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        predicted = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      row[i] = static_cast<uint8_t>(in[i] + predicted);
    }
    for (uint32_t x = 0; x < image.width; ++x) {
      for (size_t k = 0; k < 3; ++k) image.rgb.push_back(row[x * channels + k]);
    }
    prev = row;
  }
  return image;
}

// The value of attribute `name` in the first <svg ...> tag.
std::string svgAttribute(const std::string& svg, const std::string& name) {
  const size_t tag = svg.find("<svg");
  const size_t end = svg.find('>', tag);
  if (tag == std::string::npos || end == std::string::npos) return "";
  const std::string open = svg.substr(tag, end - tag);
  const size_t at = open.find(" " + name + "=\"");
  if (at == std::string::npos) return "";
  const size_t value = at + name.size() + 3;
  return open.substr(value, open.find('"', value) - value);
}

class PlotCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshTempDir();
    writeFile(path("a.jsonl"), metricsLines(4, 100, 2.0, true));
    writeFile(path("b.jsonl"), metricsLines(3, 100, 1.0, true));
    writeFile(path("reg.jsonl"), metricsLines(5, 80, 4.0, false));  // regression: no accuracy
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Runs `cohort plot ARGS`, expecting success: a RESULT line, nothing on stderr.
  void plot(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"plot"};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = runCohort(argv);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_EQ(r.stderrText, "") << r.describe();
    EXPECT_EQ(parseResultLine(r.stdoutText).count, 1) << r.describe();
  }
  // Runs `cohort plot ARGS`, expecting exit 2, one stderr line with `mentions`, and no new file.
  void expectError(const std::vector<std::string>& args, const std::vector<std::string>& mentions) {
    const std::vector<std::string> before = listDir(dir_);
    std::vector<std::string> argv = {"plot"};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = runCohort(argv);
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_EQ(countLines(r.stderrText), 1) << r.describe();
    for (const std::string& m : mentions) {
      EXPECT_NE(r.stderrText.find(m), std::string::npos) << "stderr should mention '" << m << "'\n" << r.describe();
    }
    EXPECT_EQ(listDir(dir_), before) << "a failed plot must leave no file\n" << r.describe();
  }
  std::string dir_;
};

// matplotlib's tab10, which cli/plot.cc colours runs with: the first run blue, the second orange.
constexpr int kBlue[] = {31, 119, 180}, kOrange[] = {255, 127, 14};

TEST_F(PlotCliTest, PngAndSvgHaveTheSizeAskedFor) {
  plot({path("a.jsonl"), "--output", path("a.png"), "--width", "640", "--height", "400"});
  const Image image = decodePng(readFile(path("a.png")));
  EXPECT_EQ(image.width, 640u);
  EXPECT_EQ(image.height, 400u);
  EXPECT_EQ(image.rgb.size(), 640u * 400 * 3);
  EXPECT_GT(image.countNear(kBlue[0], kBlue[1], kBlue[2]), 50) << "the run's curves are blue";
  EXPECT_EQ(image.countNear(kOrange[0], kOrange[1], kOrange[2]), 0) << "one run, one colour";

  plot({path("a.jsonl"), "--output", path("a.svg"), "--width", "500", "--height", "300"});
  const std::string svg = readFile(path("a.svg"));
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u) << svg.substr(0, 100);
  EXPECT_EQ(svgAttribute(svg, "width"), "500px");
  EXPECT_EQ(svgAttribute(svg, "height"), "300px");
  EXPECT_EQ(svgAttribute(svg, "viewBox"), "0 0 500 300");
  EXPECT_NE(svg.find("</svg>", svg.size() - 10), std::string::npos) << "the SVG ends with </svg>";
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '<'), std::count(svg.begin(), svg.end(), '>'));
}

TEST_F(PlotCliTest, TheSameInputGivesTheSameBytesAndOtherDataOtherPixels) {
  for (const char* ext : {".png", ".svg"}) {
    plot({path("a.jsonl"), "--output", path(std::string("1") + ext)});
    plot({path("a.jsonl"), "--output", path(std::string("2") + ext)});
    EXPECT_EQ(readFile(path(std::string("1") + ext)), readFile(path(std::string("2") + ext))) << ext;
  }
  // Other data under the same file name (the default title and legend name it), so only the curves differ.
  ASSERT_EQ(::mkdir(path("other").c_str(), 0700), 0);
  writeFile(path("other/a.jsonl"), metricsLines(4, 100, 2.5, true));
  plot({path("other/a.jsonl"), "--output", path("other.png")});
  const Image same = decodePng(readFile(path("1.png"))), other = decodePng(readFile(path("other.png")));
  ASSERT_EQ(same.rgb.size(), other.rgb.size());
  EXPECT_NE(same.rgb, other.rgb);
}

TEST_F(PlotCliTest, SeveralRunsAreOverlaidInTheirOwnColours) {
  CommandResult r =
      runCohort({"plot", path("a.jsonl"), path("b.jsonl"), path("reg.jsonl"), "--output", path("all.png"), "--label",
                 "first", "--label", "second", "--label", "regression", "--title", "three runs"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  ResultLine result = parseResultLine(r.stdoutText);
  EXPECT_EQ(result.fields["runs"], "3");
  // a: 4 epochs x (train and test loss, train and test acc) + 12 step losses; b: 3 x 4 + 9; reg: 5 x 2 + 15.
  EXPECT_EQ(result.fields["points"], std::to_string(4 * 4 + 12 + 3 * 4 + 9 + 5 * 2 + 15));
  const Image all = decodePng(readFile(path("all.png")));
  EXPECT_GT(all.countNear(kBlue[0], kBlue[1], kBlue[2]), 50);
  EXPECT_GT(all.countNear(kOrange[0], kOrange[1], kOrange[2]), 50) << "the second run is orange";
  EXPECT_GT(all.countNear(44, 160, 44), 50) << "the third run is green";

  // A label per file or none.
  expectError({path("a.jsonl"), path("b.jsonl"), "--output", path("x.png"), "--label", "one"},
              {"1 --label for 2 metrics files"});
}

TEST_F(PlotCliTest, AgainstTheEpoch) {
  plot({path("a.jsonl"), path("reg.jsonl"), "--output", path("step.png")});
  plot({path("a.jsonl"), path("reg.jsonl"), "--output", path("epoch.png"), "--x", "epoch"});
  const Image step = decodePng(readFile(path("step.png"))), epoch = decodePng(readFile(path("epoch.png")));
  ASSERT_EQ(step.rgb.size(), epoch.rgb.size());
  EXPECT_NE(step.rgb, epoch.rgb) << "a and reg have other steps per epoch: the curves move";
  expectError({path("a.jsonl"), "--output", path("x.png"), "--x", "time"}, {"--x 'time'", "step or epoch"});
}

TEST_F(PlotCliTest, NonFiniteValuesAreSkipped) {
  writeFile(path("nan.jsonl"),
            "{\"epoch\":1,\"step\":10,\"train_loss\":2.5,\"run_samples_per_s\":1}\n"
            "{\"epoch\":2,\"step\":20,\"train_loss\":null,\"run_samples_per_s\":1}\n"
            "\n"
            "{\"epoch\":3,\"step\":30,\"train_loss\":NaN,\"test_loss\":-Infinity,\"run_samples_per_s\":1}\n"
            "{\"epoch\":4,\"step\":40,\"train_loss\":1.25,\"run_samples_per_s\":1,\"note\":\"NaN\"}\n");
  CommandResult r = runCohort({"plot", path("nan.jsonl"), "--output", path("nan.png")});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(parseResultLine(r.stdoutText).fields["points"], "2");
  EXPECT_NE(r.stderrText.find("skipped 3 non-finite values"), std::string::npos) << r.describe();
}

// Issue 33: a number beyond a double's range is JSON, but the JSON library refused it and its raw
// message ended the plot with exit 1. It is skipped like Infinity; digits in a string are text, and a
// key that is not plotted (lr) may hold one too.
TEST_F(PlotCliTest, NumbersBeyondADoublesRangeAreSkippedLikeInfinities) {
  const std::string digits400 = "1" + std::string(400, '0');
  const std::string lines[] = {
      R"({"epoch":1,"step":10,"train_loss":2.5,"run_samples_per_s":1})",
      R"({"epoch":2,"step":20,"train_loss":1e999,"test_loss":-1E+999,"run_samples_per_s":1})",
      R"({"epoch":3,"step":30,"train_loss":1.5,"test_acc":)" + digits400 + R"(,"lr":1e400,"run_samples_per_s":1})",
      R"({"epoch":4,"step":40,"train_loss":1e-999,"run_samples_per_s":1,"note":"1e999"})",
  };
  writeFile(path("huge.jsonl"), lines[0] + "\n" + lines[1] + "\n" + lines[2] + "\n" + lines[3] + "\n");
  CommandResult r = runCohort({"plot", path("huge.jsonl"), "--output", path("huge.png")});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(parseResultLine(r.stdoutText).fields["points"], "3") << "2.5, 1.5 and 1e-999 (0)\n" << r.describe();
  EXPECT_NE(r.stderrText.find("skipped 3 non-finite values"), std::string::npos) << r.describe();
}

// Issue 33: what is still wrong after that is named by FILE:LINE (and column) with exit 2: an
// out-of-range "step" is not a number, and a syntax error after rewritten tokens is placed in the
// line as written. Only regular files are read: /dev/zero was read without end and a FIFO waited for
// a writer (/dev/null stands for /dev/zero: the same refusal, and a run of the old code on it ends).
TEST_F(PlotCliTest, MalformedLinesAndNonRegularFilesExitTwoNamingThem) {
  writeFile(path("step.jsonl"), "{\"epoch\":1,\"step\":1e999,\"train_loss\":0.5}\n");
  expectError({path("step.jsonl"), "--output", path("x.png")},
              {path("step.jsonl") + ":1: \"step\" is null, expected a number"});
  // Column 39 is the '}' after the comma: the NaN made the rewritten line a byte longer.
  writeFile(path("comma.jsonl"), "{\"epoch\":1,\"step\":1,\"a\":NaN,\"b\":1e999,}\n");
  expectError({path("comma.jsonl"), "--output", path("x.png")},
              {path("comma.jsonl") + ":1: not JSON (syntax error at column 39)"});
  writeFile(path("word.jsonl"), "{\"epoch\":1,\"step\":1,\"train_loss\":1e999x}\n");
  expectError({path("word.jsonl"), "--output", path("x.png")}, {path("word.jsonl") + ":1: not JSON"});

  ASSERT_EQ(::mkfifo(path("fifo.jsonl").c_str(), 0600), 0);
  for (const auto& [file, what] : {std::pair<std::string, std::string>{"/dev/null", "a character device"},
                                   {path("fifo.jsonl"), "a FIFO or pipe"}}) {
    CommandResult r = runCohort({"plot", file, "--output", path("x.png")}, {.timeout = std::chrono::seconds(15)});
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_EQ(r.stderrText,
              "[rank 0] cohort: error: " + file + ": cannot read metrics: it is " + what + ", not a regular file\n")
        << r.describe();
    EXPECT_FALSE(fileExists(path("x.png")));
  }
}

// A value nested 200000 deep overflowed the stack (a segfault: the message about the figure that
// is no number printed the value, recursively); a metrics line is a flat object, so nesting past a
// small depth is refused before parsing, naming FILE:LINE (issue 44 item 21).
TEST_F(PlotCliTest, DeeplyNestedValuesExitTwoNamingTheLine) {
  writeFile(path("deep.jsonl"), metricsLines(1, 100, 1.0, false) + "{\"epoch\":2,\"step\":200,\"train_loss\":" +
                                    std::string(200000, '[') + std::string(200000, ']') + "}\n");
  expectError({path("deep.jsonl"), "--output", path("x.png")},
              {path("deep.jsonl") + ":5: values nested more than 64 deep (at column 99)"});
  // Brackets inside strings are text, not nesting.
  writeFile(path("text.jsonl"), "{\"epoch\":1,\"step\":1,\"train_loss\":1,\"note\":\"" + std::string(100, '[') + "\"}\n");
  plot({path("text.jsonl"), "--output", path("text.png")});
}

TEST_F(PlotCliTest, BadInputExitsTwoNamingIt) {
  writeFile(path("bad.jsonl"), metricsLines(2, 100, 1.0, true) + "{\"epoch\":3,\"step\":300,\"train_loss\":\"low\"}\n");
  expectError({path("a.jsonl"), path("bad.jsonl"), "--output", path("x.png")},
              {path("bad.jsonl") + ":9:", "\"train_loss\"", "expected a number"});
  writeFile(path("cut.jsonl"), "{\"epoch\":1,\"step\":100,\"train_loss\":0.5,\"run_samples_per_s\":1}\n{\"epoch\":2,");
  expectError({path("cut.jsonl"), "--output", path("x.svg")}, {path("cut.jsonl") + ":2:", "not JSON"});
  writeFile(path("nostep.jsonl"), "{\"epoch\":1,\"train_loss\":0.5}\n");
  expectError({path("nostep.jsonl"), "--output", path("x.png")}, {path("nostep.jsonl") + ":1:", "\"step\""});
  writeFile(path("array.jsonl"), "[1, 2]\n");
  expectError({path("array.jsonl"), "--output", path("x.png")}, {path("array.jsonl") + ":1:", "JSON object"});
  writeFile(path("none.jsonl"), "{\"epoch\":1,\"step\":100,\"lr\":0.1}\n");
  expectError({path("none.jsonl"), "--output", path("x.png")}, {path("none.jsonl"), "no plottable lines"});

  expectError({path("missing.jsonl"), "--output", path("x.png")}, {path("missing.jsonl"), "No such file"});
  expectError({path("a.jsonl"), "--output", path("x.jpg")}, {path("x.jpg"), "'.jpg'", ".png or .svg"});
  expectError({path("a.jsonl"), "--output", path("x.png"), "--width", "10"}, {"10x540"});
}

// cohort train --plot: the run's own curves when training ends, the metrics file beside it removed
// (none was asked for); a name that is neither .png nor .svg fails before training.
TEST_F(PlotCliTest, TrainDrawsItsOwnPlotAtTheEnd) {
  // The metrics go to a directory of the run's own (mkdtemp) in $TMPDIR, removed at the end.
  const std::string tmp = path("tmp");
  ASSERT_EQ(::mkdir(tmp.c_str(), 01777), 0);
  CommandResult r = runCohort({"train", "--model", "mlp:784,16,10", "--epochs", "2", "--progress-every", "0", "--plot",
                               path("run.png")},
                              {.extraEnvironment = {"TMPDIR=" + tmp}});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(std::filesystem::is_empty(tmp)) << "the run's metrics directory is gone";
  const Image image = decodePng(readFile(path("run.png")));
  EXPECT_EQ(image.width, 960u);
  EXPECT_EQ(image.height, 540u);
  EXPECT_GT(image.countNear(kBlue[0], kBlue[1], kBlue[2]), 50) << "the run's curves";
  EXPECT_FALSE(fileExists(path("run.png.metrics.jsonl"))) << "the metrics it drew from are gone";
  EXPECT_NE(r.stdoutText.find("plot of 8 points written to " + path("run.png")), std::string::npos) << r.stdoutText;

  r = runCohort({"train", "--model", "mlp:784,16,10", "--plot", path("run.jpg")});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find("run.jpg"), std::string::npos) << r.stderrText;
  EXPECT_EQ(r.stdoutText.find("epoch 1/"), std::string::npos) << "nothing was trained";
}

}  // namespace
}  // namespace cohort::testing
