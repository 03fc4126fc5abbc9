// docs/api.md's gradient check of its own layer, run on the Gate the doc's program defines: the
// program is compiled here with its main renamed, so the check sees the doc's class as it stands.
#include <gtest/gtest.h>

#define main gatedMlpMain  // the program's main; unused here, the test needs its Gate
#include "tests/docs/gated_mlp.inc"
#undef main

namespace {

TEST(ApiDocGate, PassesTheGradientCheckAsTheDocShowsIt) {
#include "tests/docs/gate_gradient_check.inc"
  EXPECT_GT(r.checked, 3) << "the input and the gate were checked: " << r.summary();
}

}  // namespace
