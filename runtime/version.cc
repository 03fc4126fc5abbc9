#include "runtime/version.h"

#include "runtime/version_string.h"  // generated from VERSION (runtime/BUILD: version_string)

namespace cohort {

const char* version() { return kVersionString; }

}  // namespace cohort
