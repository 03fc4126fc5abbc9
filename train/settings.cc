#include "train/settings.h"

#include <charconv>

namespace cohort::train {

namespace {

template <typename T>
std::string shortest(T value) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, r.ptr);
}

}  // namespace

std::string settingValue(double value) { return shortest(value); }
std::string settingValue(float value) { return shortest(value); }

}  // namespace cohort::train
