#!/usr/bin/env bash
# docs/architecture.md's one-way dependencies ("Layers"), checked on every #include "…" of the sources:
#   launcher/ -> ipc/ -> runtime/            (the launcher never links CUDA, NCCL or MPI)
#   cli/ -> train/ (its public job.h and trainer.h) -> nn/ -> runtime/
#   train/ -> collectives/ -> ipc/ -> runtime/
# nn/ knows models, parameters, losses and optimizers and nothing of segments or communicators;
# cli/ only turns flags into train/ options, so it includes no header of the strategies, segments
# or communicators. Bazel visibility keeps the targets apart; this keeps the headers apart too
# (a header reachable through a dependency's dependency would compile with GCC).
# Prints every offending line and exits 1, or says how many files it checked. First it checks
# itself: a tree with one include against the order must fail.
set -uo pipefail

# folder: the folders its files may include from (itself always)
allowed() {
  case "$1" in
    runtime) echo "runtime" ;;
    ipc) echo "runtime ipc" ;;
    collectives) echo "runtime ipc collectives" ;;
    nn) echo "runtime nn" ;;
    train) echo "runtime ipc collectives nn train" ;;
    cli) echo "runtime nn train bench cli" ;;
    launcher) echo "runtime ipc launcher" ;;
  esac
}
# Headers of train/ that cli/ may use: the public API.
cli_train_headers="train/evaluate.h train/job.h train/settings.h train/step.h train/test_hooks.h train/trainer.h train/zero_memory.h"

# check ROOT: prints the offending includes under ROOT; the count of bad ones in $bad, files in $files.
check() {
bad=0 files=0
for top in runtime ipc collectives nn train cli launcher; do
  while IFS= read -r file; do
    files=$((files + 1))
    while IFS= read -r line; do
      header=$(sed -E 's/^[0-9]+:#include "([^"]+)".*/\1/' <<<"$line")
      folder=${header%%/*}
      [ "$folder" = "$header" ] && continue  # a system-style or same-folder name
      case " $(allowed "$top") " in
        *" $folder "*) ;;
        *)
          case "$folder" in
            runtime|ipc|collectives|nn|train|cli|launcher|bench)
              echo "$file:${line%%:*}: $top/ may not include $header (docs/architecture.md, \"Layers\": $top/ builds on $(allowed "$top"))"
              bad=$((bad + 1)) ;;
          esac ;;
      esac
      if [ "$top" = cli ] && [ "$folder" = train ] && [[ " $cli_train_headers " != *" $header "* ]]; then
        echo "$file:${line%%:*}: cli/ may include only train/'s public API ($cli_train_headers), not $header"
        bad=$((bad + 1))
      fi
    done < <(grep -nE '^#include "[^"]+"' "$file")
  done < <(cd "$1" && find "$top" \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null | sort \
            | sed "s|^|$1/|")
done
}

# The check catches what it should: nn/ including a communicator, cli/ a strategy.
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
mkdir -p "$fake/nn" "$fake/cli" "$fake/train"
printf '#include "runtime/tensor.h"\n#include "collectives/communicator.h"\n' > "$fake/nn/bad.cc"
printf '#include "train/job.h"\n#include "train/placement/hogwild_placement.h"\n' > "$fake/cli/bad.cc"
check "$fake" > "$fake/out"
if [ "$bad" -ne 2 ] || ! grep -q 'nn/ may not include collectives/communicator.h' "$fake/out" ||
   ! grep -q "cli/ may include only train/'s public API" "$fake/out"; then
  echo "layering_test: the check missed a planted violation (found $bad):"; cat "$fake/out"; exit 1
fi

root="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-cohort}"
[ -d "$root/nn" ] || root=.
check "$root"
if [ "$files" -lt 150 ]; then
  echo "layering_test: found only $files source files: the runfiles are incomplete"
  exit 1
fi
if [ "$bad" -gt 0 ]; then
  echo "layering_test: $bad include(s) against the layering above"
  exit 1
fi
echo "layering_test: $files files follow the dependency order of docs/architecture.md, \"Layers\""
