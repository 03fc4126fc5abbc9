#include "train/settings_agreement.h"

#include <sstream>

#include "runtime/error.h"

namespace cohort::train {

namespace {

void put(std::string& out, const std::string& s) {
  out += std::to_string(s.size());
  out += ':';
  out += s;
}

std::string take(const std::string& bytes, size_t& at) {
  const size_t colon = bytes.find(':', at);
  if (colon == std::string::npos || colon == at || colon - at > 8) {
    COHORT_THROW(InvalidArgument) << "malformed settings at byte " << at;
  }
  size_t n = 0;
  for (size_t i = at; i < colon; ++i) {
    if (bytes[i] < '0' || bytes[i] > '9') COHORT_THROW(InvalidArgument) << "malformed settings at byte " << i;
    n = n * 10 + static_cast<size_t>(bytes[i] - '0');
  }
  if (n > bytes.size() - colon - 1) COHORT_THROW(InvalidArgument) << "malformed settings: a value runs past the end";
  at = colon + 1 + n;
  return bytes.substr(colon + 1, n);
}

const Setting* find(const Settings& settings, const std::string& name) {
  for (const Setting& s : settings) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string quoted(const std::string& value) { return value.empty() ? "''" : value; }

}  // namespace

std::string encodeSettings(const Settings& settings) {
  std::string out;
  for (const Setting& s : settings) {
    put(out, s.name);
    put(out, s.value);
  }
  return out;
}

Settings decodeSettings(const std::string& bytes) {
  Settings settings;
  for (size_t at = 0; at < bytes.size();) {
    Setting s;
    s.name = take(bytes, at);
    s.value = take(bytes, at);
    settings.push_back(std::move(s));
  }
  return settings;
}

std::string describeDifference(const Settings& reference, int rank, const Settings& theirs, int differingRanks,
                               int worldSize, const std::string& referenceHost, const std::string& rankHost,
                               const Settings& advice) {
  std::ostringstream os;
  os << "ranks 0 (" << referenceHost << ") and " << rank << " (" << rankHost << ") were started with different settings: ";
  // The first setting, in rank 0's order, that rank `rank` has otherwise or lacks; then one it has
  // that rank 0 lacks.
  bool found = false;
  std::string differing;  // the setting named
  for (const Setting& s : reference) {
    const Setting* t = find(theirs, s.name);
    if (t && t->value == s.value) continue;
    differing = s.name;
    os << s.name << " is " << quoted(s.value) << " on rank 0 but ";
    if (t) {
      os << quoted(t->value) << " on rank " << rank;
    } else {
      os << "not set on rank " << rank;
    }
    found = true;
    break;
  }
  if (!found) {
    for (const Setting& t : theirs) {
      if (find(reference, t.name)) continue;
      differing = t.name;
      os << t.name << " is " << quoted(t.value) << " on rank " << rank << " but not set on rank 0";
      found = true;
      break;
    }
  }
  if (!found) os << "the same settings in another order";
  if (differingRanks > 1) os << " (" << differingRanks << " of " << worldSize << " ranks differ from rank 0)";
  if (const Setting* s = found ? find(advice, differing) : nullptr; s && !s->fix.empty()) {
    os << ". " << s->fix;
    return os.str();
  }
  os << ". Every rank of a job must be started with the same settings (docs/errors.md lists the few that may "
        "differ per rank)";
  return os.str();
}

void agreeOnSettings(const Settings& mine, const collectives::AgreementOptions& options) {
  const collectives::Comparison c = collectives::compareAcrossRanks(encodeSettings(mine), options);
  if (c.firstDiffering < 0) return;
  COHORT_THROW(InvalidArgument) << describeDifference(decodeSettings(c.reference), c.firstDiffering,
                                                      decodeSettings(c.differing), c.differingRanks,
                                                      options.world.worldSize, c.referenceHost, c.differingHost, mine);
}

}  // namespace cohort::train
