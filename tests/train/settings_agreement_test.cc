// The settings' encoding and the message for ranks that differ (the comparison across ranks itself is
// tested in tests/collectives/agreement_test and end to end in tests/cli/cli_agreement_test).
#include "train/settings_agreement.h"

#include <gtest/gtest.h>

#include "runtime/error.h"

namespace cohort::train {
namespace {

TEST(SettingsAgreement, EncodingRoundTripsAnyBytes) {
  const Settings s = {{"model", "mlp:784,32,10"}, {"empty", ""}, {"odd:name", std::string("a\0b:3:", 6)}, {"lr", settingValue(0.05f)}};
  const Settings back = decodeSettings(encodeSettings(s));
  ASSERT_EQ(back.size(), s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(back[i].name, s[i].name);
    EXPECT_EQ(back[i].value, s[i].value);
  }
  EXPECT_EQ(settingValue(0.05f), "0.05");
  EXPECT_EQ(settingValue(1e-8), "1e-08");
  EXPECT_THROW(decodeSettings("5:ab"), InvalidArgument);
  EXPECT_THROW(decodeSettings("x:ab"), InvalidArgument);
}

TEST(SettingsAgreement, TheMessageNamesTheFirstDifferingSettingWithBothValues) {
  const Settings a = {{"mode", "allreduce"}, {"batch_size", "64"}, {"lr", "0.05"}};
  const Settings b = {{"mode", "allreduce"}, {"batch_size", "32"}, {"lr", "0.5"}};
  std::string m = describeDifference(a, 1, b, 1, 2, "node0", "node1");
  EXPECT_NE(m.find("ranks 0 (node0) and 1 (node1) were started with different settings: batch_size is 64 on rank 0 but 32 on rank 1."),
            std::string::npos)
      << m;
  m = describeDifference(a, 3, b, 2, 4, "node0", "node1");
  EXPECT_NE(m.find("on rank 3 (2 of 4 ranks differ from rank 0)"), std::string::npos) << m;
}

TEST(SettingsAgreement, ASettingOnlyOneSideHasIsNamed) {
  const Settings a = {{"mode", "allreduce"}, {"checkpoint", ""}};
  const Settings b = {{"mode", "allreduce"}};
  EXPECT_NE(describeDifference(a, 1, b, 1, 2, "node0", "node1").find("checkpoint is '' on rank 0 but not set on rank 1"), std::string::npos);
  const Settings c = {{"mode", "allreduce"}, {"checkpoint", ""}, {"user", "x"}};
  EXPECT_NE(describeDifference(a, 2, c, 1, 3, "node0", "node0").find("user is x on rank 2 but not set on rank 0"), std::string::npos);
}

// A setting's fix (from the caller's own list: fixes are not sent across ranks) replaces the general
// advice where that setting is the one named; other settings keep the general advice.
TEST(SettingsAgreement, TheDifferingSettingsFixIsSaid) {
  const Settings a = {{"mode", "allreduce"}, {"train_data_digest", "aa"}, {"batch_size", "64"}};
  const Settings b = {{"mode", "allreduce"}, {"train_data_digest", "bb"}, {"batch_size", "32"}};
  const Settings advice = {{"mode", "allreduce", "unused"}, {"train_data_digest", "aa", "Build the same data."}};
  std::string m = describeDifference(a, 1, b, 1, 2, "node0", "node0", advice);
  EXPECT_NE(m.find("train_data_digest is aa on rank 0 but bb on rank 1. Build the same data."), std::string::npos) << m;
  EXPECT_EQ(m.find("Every rank of a job"), std::string::npos) << m;
  const Settings c = {{"mode", "allreduce"}, {"train_data_digest", "aa"}, {"batch_size", "32"}};
  m = describeDifference(a, 1, c, 1, 2, "node0", "node0", advice);
  EXPECT_NE(m.find("batch_size is 64 on rank 0 but 32 on rank 1. Every rank of a job"), std::string::npos) << m;
}

}  // namespace
}  // namespace cohort::train
