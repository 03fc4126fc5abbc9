// Counts calls to the global operator new, for tests that prove a loop allocates nothing in steady
// state. Linking //tests/support:alloc_counter replaces operator new/delete in the test binary
// (alwayslink), so every allocation of the process is counted, on any thread.
//
//   long before = allocationCount();
//   runSteadyStateLoop();
//   EXPECT_EQ(allocationCount() - before, 0);
#pragma once

namespace cohort::testing {

// Calls to operator new so far in this process.
long allocationCount();

}  // namespace cohort::testing
