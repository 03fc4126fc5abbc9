// UnitRecorder: an nn::UnitListener for tests that records every event it is told, in order, as
// "<event> <unit>" ("after-backward transformer.h.1"), and can call another listener after each
// (`then`, e.g. a GradSync), so a test sees what that listener did by the time of each event.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "nn/module.h"

namespace cohort::nn::testing {

class UnitRecorder final : public UnitListener {
 public:
  UnitRecorder() = default;
  explicit UnitRecorder(UnitListener* then) : then_(then) {}

  void beforeForward(const ParamBuffer::Unit& u) override { record("before-forward", u, &UnitListener::beforeForward); }
  void afterForward(const ParamBuffer::Unit& u) override { record("after-forward", u, &UnitListener::afterForward); }
  void beforeBackward(const ParamBuffer::Unit& u) override {
    record("before-backward", u, &UnitListener::beforeBackward);
  }
  void afterBackward(const ParamBuffer::Unit& u) override { record("after-backward", u, &UnitListener::afterBackward); }

  // The units told `event` ("after-backward"), in order.
  std::vector<std::string> unitsOf(const std::string& event) const {
    std::vector<std::string> names;
    for (const std::string& e : events) {
      if (e.compare(0, event.size() + 1, event + " ") == 0) names.push_back(e.substr(event.size() + 1));
    }
    return names;
  }

  std::vector<std::string> events;
  std::vector<std::pair<size_t, size_t>> afterBackwardEntries;  // [first, end) of each after-backward
  // Runs after `then` for each event, given the event as recorded and the unit.
  std::function<void(const std::string& event, const ParamBuffer::Unit& unit)> onEvent = {};

 private:
  void record(const char* event, const ParamBuffer::Unit& u, void (UnitListener::*call)(const ParamBuffer::Unit&)) {
    events.push_back(std::string(event) + " " + u.name);
    if (call == &UnitListener::afterBackward) afterBackwardEntries.emplace_back(u.firstEntry, u.endEntry);
    if (then_) (then_->*call)(u);
    if (onEvent) onEvent(events.back(), u);
  }

  UnitListener* then_ = nullptr;
};

}  // namespace cohort::nn::testing
