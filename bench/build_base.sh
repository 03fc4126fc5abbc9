#!/usr/bin/env bash
# Builds `cohort` and `cohortrun` of commit REV (default HEAD) in a temporary git worktree with an
# output base of its own, keeps them in ~/.cache/cohort-bench-base/<rev>/bin (built once per
# revision) and prints that folder: the other side of the compare_*.sh scripts that run two builds
# in one run.
#
#   base=$(bench/build_base.sh 63c1a79)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=$(git rev-parse --short "${1:-HEAD}")
cache="${XDG_CACHE_HOME:-$HOME/.cache}/cohort-bench-base/$rev"
if [ ! -x "$cache/bin/cohort" ] || [ ! -x "$cache/bin/cohortrun" ]; then
  work=$(mktemp -d)
  trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
  mkdir -p "$cache/bin"
  git worktree add --detach "$work/base" "$rev" >/dev/null 2>&1
  (cd "$work/base" && bazel --output_base="$cache/output" build --symlink_prefix=/ //cli:cohort //launcher:cohortrun \
     >"$work/base-build.log" 2>&1) || { tail -20 "$work/base-build.log" >&2; exit 1; }
  out=$(cd "$work/base" && bazel --output_base="$cache/output" info --symlink_prefix=/ bazel-bin 2>/dev/null)
  cp "$out/cli/cohort" "$out/launcher/cohortrun" "$cache/bin/"
  (cd "$work/base" && bazel --output_base="$cache/output" shutdown >/dev/null 2>&1) || true
fi
echo "$cache/bin"
