#!/usr/bin/env bash
# extract_snippets.sh [--all] DOC OUTDIR NAME...: writes the C++ block of DOC named NAME to
# OUTDIR/NAME.inc, for each NAME, so that a build compiles the code the doc shows (tests/docs/BUILD,
# scripts/test). A block is named by the line just before its opening fence:
#
#   <!-- snippet: NAME -->
#   ```cpp
#
# Fails, naming DOC's line, on a ```cpp block without a name (every C++ block of a doc this reads
# must be compiled somewhere), a name without a block or given twice, and a NAME the doc lacks; with
# --all also on a named block that is not among the NAMEs, so that a new snippet cannot go uncompiled.
set -euo pipefail

all=false
if [ "${1:-}" = --all ]; then
  all=true
  shift
fi
if [ $# -lt 3 ]; then
  echo "usage: extract_snippets.sh [--all] DOC OUTDIR NAME..." >&2
  exit 2
fi
doc=$1 outdir=$2
shift 2

# One awk pass: every named block to OUTDIR/NAME.inc, every name on stdout; errors on stderr.
names=$(awk -v doc="$doc" -v outdir="$outdir" '
  function fail(message) { print doc ":" NR ": " message > "/dev/stderr"; failed = 1; exit 1 }
  inBlock && /^```[[:space:]]*$/ { inBlock = 0; close(file); next }
  inBlock { print > file; next }
  /^<!-- snippet: [A-Za-z0-9_]+ -->[[:space:]]*$/ {
    if (pending != "") fail("snippet " pending " has no ```cpp block after it")
    pending = $3
    if (pending in seen) fail("snippet " pending " is named twice")
    seen[pending] = 1
    next
  }
  /^```cpp/ {
    if (pending == "") fail("a ```cpp block without a <!-- snippet: NAME --> line before it")
    file = outdir "/" pending ".inc"
    printf "" > file
    print pending
    inBlock = 1
    pending = ""
    next
  }
  pending != "" { fail("snippet " pending " has no ```cpp block after it") }
  END {
    if (failed) exit 1
    if (inBlock) { print doc ": the last ```cpp block is not closed" > "/dev/stderr"; exit 1 }
  }
' "$doc")

for name in "$@"; do
  grep -qx -- "$name" <<<"$names" || { echo "$doc: no snippet named $name" >&2; exit 1; }
done
if $all; then
  while IFS= read -r name; do
    printf '%s\n' "$@" | grep -qx -- "$name" ||
      { echo "$doc: snippet $name is compiled nowhere (add it to tests/docs/BUILD)" >&2; exit 1; }
  done <<<"$names"
fi
