// docs/api.md's first program, as the doc shows it (tests/docs/BUILD extracts it): it must build
// under -Wall -Wextra -Werror. It trains on the full synthetic set, so it is built, not run.
#include "tests/docs/first_program.inc"
