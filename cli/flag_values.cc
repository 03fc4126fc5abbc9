#include "cli/flag_values.h"

#include <CLI/CLI.hpp>

#include <charconv>
#include <limits>
#include <regex>
#include <system_error>

#include "runtime/error.h"

namespace cohort::cli {

CLI::Option* addSeedOption(CLI::App& c, uint64_t& seed, const std::string& help) {
  return c.add_option_function<std::string>("--seed", [&seed](const std::string& text) { seed = parseSeed(text); }, help)
      ->default_str(std::to_string(seed));
}

uint64_t parseSeed(const std::string& text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || stop != end) {
    COHORT_THROW(InvalidArgument) << "--seed must be a whole number 0.." << std::numeric_limits<uint64_t>::max() << ", got '"
                                  << text << "'";
  }
  return value;
}

std::string describeParseError(const std::string& message) {
  static const std::regex repeated(R"(^(-[-\w]+): At Most 1 required but received (\d+)$)");
  std::smatch m;
  if (std::regex_match(message, m, repeated)) return m[1].str() + " is given " + m[2].str() + " times; give it once";
  return message;
}

}  // namespace cohort::cli
