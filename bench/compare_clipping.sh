#!/usr/bin/env bash
# What a learning-rate schedule and gradient clipping cost (issue 16): bench/compare_flags.sh with
# `--lr-schedule cosine --warmup-steps 100 --clip-grad-norm 1` against the same run without them.
# Both sides measure every step's gradient norm and check for a non-finite loss or gradient (always
# on); the clipped side also scales the gradient when its norm exceeds 1, which the printed grad_norm
# mean and max (the clipped side's epoch) show how often it did. Issue 16 asks for a ratio of at
# least 0.97 in local and allreduce.
#
#   bench/compare_clipping.sh                 # REPS=3
#   REPS=5 MODES="local allreduce" bench/compare_clipping.sh
FLAGS="--lr-schedule cosine --warmup-steps 100 --clip-grad-norm 1" LABEL=clipped SHOW="grad_norm grad_norm_max" \
  exec "$(dirname "$0")/compare_flags.sh"
