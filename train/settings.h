// Settings: what every rank of a job must have been started with alike (the data, the batch size,
// the optimizer's hyper-parameters, ...), as name/value pairs in a fixed order. train::Job compares
// them across ranks (Job::place, Job::agree) before anything relies on them, so ranks started with
// different flags fail at once with both values named instead of training silently wrong.
// Plain values: copy them freely.
//
//   job.agree({{"batch_size", std::to_string(batch)}, {"lr", train::settingValue(lr)}});
#pragma once

#include <string>
#include <vector>

namespace cohort::train {

struct Setting {
  std::string name = {};
  std::string value = {};
  // What to do when the ranks differ here, said after the difference instead of the general advice
  // (e.g. the training data's digest: build the same data on every rank). Not compared: the same
  // program gives every rank the same text.
  std::string fix = {};
};
using Settings = std::vector<Setting>;

// A number as a setting's value: the shortest text that reads back as the same value.
std::string settingValue(double value);
std::string settingValue(float value);

}  // namespace cohort::train
