// agreeOnSettings: every rank of a job compares the settings it was started with (train::Settings,
// name/value pairs in a fixed order) with rank 0's, before anything relies on them; where a rank
// differs, every rank throws the same InvalidArgument naming the ranks and the first differing
// setting with both values (issue 15: ranks with another batch size or learning rate used to train
// silently wrong). Internal to train/: users reach it through Job::place() and Job::agree().
//
// Collective over collectives::compareAcrossRanks (see there for the transport and its waits).
// Thread safety: the training thread only.
#pragma once

#include <string>
#include <vector>

#include "collectives/agreement.h"
#include "train/settings.h"

namespace cohort::train {

// Length-prefixed, so names and values may hold any byte.
std::string encodeSettings(const Settings& settings);
// InvalidArgument on bytes encodeSettings did not write.
Settings decodeSettings(const std::string& bytes);
// The message for rank 0's `reference` against rank `rank`'s `theirs` (which differ): the two ranks
// with their hosts, as collectives name ranks ("ranks 0 (node0) and 3 (node1)"), then the first
// setting that differs or that one of them lacks, then what to do: that setting's `fix` in `advice`
// (the caller's own settings, whose fixes are not sent across ranks), or the general advice.
std::string describeDifference(const Settings& reference, int rank, const Settings& theirs, int differingRanks,
                               int worldSize, const std::string& referenceHost, const std::string& rankHost,
                               const Settings& advice = {});

void agreeOnSettings(const Settings& mine, const collectives::AgreementOptions& options);

}  // namespace cohort::train
