#!/usr/bin/env bash
# Runs tests/nn/torch/parity.py (Debian's python3-torch) against parity_worker.
set -euo pipefail
here=tests/nn/torch
exec /usr/bin/python3 "$here/parity.py" "$here/parity_worker"
