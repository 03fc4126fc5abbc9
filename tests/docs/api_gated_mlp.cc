// docs/api.md's complete program with a model and data of its own, as the doc shows it
// (tests/docs/BUILD extracts it): built under -Wall -Wextra -Werror and run by api_program_test.
#include "tests/docs/gated_mlp.inc"
