// describeUser: a local user as messages name one, e.g. when a file or directory that Cohort refuses
// belongs to someone else (docs/security.md).
// Thread safety: safe to call concurrently (getpwuid_r).
//
//   COHORT_THROW(IoError) << path << " belongs to " << runtime::describeUser(st.st_uid);
#pragma once

#include <sys/types.h>

#include <string>

namespace cohort::runtime {

// "nobody (uid 65534)", or "uid 1234" when the uid has no passwd entry.
std::string describeUser(uid_t uid);

}  // namespace cohort::runtime
