#!/usr/bin/env bash
# Cohort against PyTorch on one GPU, on the same work, in one run: one table with ratios.
#   bench/gpu_compare.sh TORCH_SCRIPT [OUT_DIR [SCRATCH_DIR]]
# TORCH_SCRIPT is bench-peers' gpu_torch.py (not part of this repository: copy it next to the GPU
# bundle). COHORT names the cohort binary (default: the bundle's, else bazel-bin/cli/cohort); PYTHON
# the interpreter with PyTorch (default python3). Both sides train the same models at the same batch
# sizes with the same optimizers (SGD with momentum 0.9 for the classifiers, AdamW for the GPTs) and
# report the steady state: warm-up steps, start-up and evaluation are outside the clock, which stops
# when the GPU is done (`cohort bench train`, bench/train_bench.h; gpu_torch.py's `timed`).
# Precision: fp32 with TF32 off on both sides (Cohort's fp32 is plain FMA), then bf16: Cohort's
# --precision bf16 against PyTorch's bf16 path (autocast, SDPA, fused AdamW) on GPT-2 124M.
# Writes the raw lines to OUT_DIR/gpu_compare.raw (default: a temporary directory) and prints
#   | case | precision | unit | Cohort | PyTorch | Cohort/PyTorch |
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
torch_script=${1:?usage: bench/gpu_compare.sh TORCH_SCRIPT [OUT_DIR]}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
raw="$out/gpu_compare.raw"
: > "$raw"
cohort=${COHORT:-}
if [ -z "$cohort" ]; then
  for c in "$here/runfiles/cohort/cli/cohort" "$here/../bazel-bin/cli/cohort"; do [ -x "$c" ] && { cohort=$c; break; }; done
fi
[ -x "$cohort" ] || { echo "gpu_compare: no cohort binary (set COHORT)" >&2; exit 2; }
python=${PYTHON:-python3}

# The GPT corpus PyTorch samples from: random bytes (a GPT's speed does not depend on the tokens;
# Cohort's bench draws its own random bytes).
corpus="${3:-$out}/corpus.bin"
head -c 4000000 /dev/urandom > "$corpus"

# case name | cohort bench train arguments | the field to read | PyTorch's RESULT prefix | field
cases=(
  "MLP 784-512-256-10, batch 64|--model mlp:784,512,256,10 --batch-size 64 --repeats 3|samples_per_s|RESULT torch mlp:784,512,256,10 batch=64 data=host|samples_per_s"
  "cnn:rosetta, batch 64|--model cnn:rosetta --batch-size 64 --samples 25600 --repeats 3|samples_per_s|RESULT torch cnn:rosetta batch=64 |samples_per_s"
  "cnn:rosetta, batch 256|--model cnn:rosetta --batch-size 256 --samples 25600 --repeats 3|samples_per_s|RESULT torch cnn:rosetta batch=256 |samples_per_s"
  "GPT 4x128, ctx 64, batch 32|--model gpt:layers=4,heads=4,dim=128,ctx=64 --batch-size 32 --samples 9600 --repeats 3|tokens_per_s|RESULT torch gpt:layers=4,heads=4,dim=128,ctx=64 batch=32 |tokens_per_s"
  "GPT 6x384, ctx 256, batch 64|--model gpt:layers=6,heads=6,dim=384,ctx=256 --batch-size 64 --samples 6400 --repeats 1|tokens_per_s|RESULT torch gpt:layers=6,heads=6,dim=384,ctx=256 batch=64 |tokens_per_s"
  "GPT-2 124M, ctx 1024, batch 8, vocab 256|--model gpt:layers=12,heads=12,dim=768,ctx=1024 --batch-size 8 --samples 240 --repeats 1|tokens_per_s|RESULT torch gpt:layers=12,heads=12,dim=768,ctx=1024 batch=8 |tokens_per_s"
)
# bf16 on both sides: Cohort's --precision bf16 against PyTorch's autocast path, at GPT-2's padded
# vocabulary (the issue's target) and at 256.
bf16=(
  "GPT-2 124M bf16, ctx 1024, batch 8, vocab 50304|--model gpt:layers=12,heads=12,dim=768,ctx=1024,vocab=50304 --batch-size 8 --samples 240 --repeats 1 --precision bf16|tokens_per_s|RESULT torch-bf16 gpt:layers=12,heads=12,dim=768,ctx=1024 vocab=50304 batch=8 |tokens_per_s"
  "GPT-2 124M bf16, ctx 1024, batch 8, vocab 256|--model gpt:layers=12,heads=12,dim=768,ctx=1024 --batch-size 8 --samples 240 --repeats 1 --precision bf16|tokens_per_s|RESULT torch-bf16 gpt:layers=12,heads=12,dim=768,ctx=1024 vocab=256 batch=8 |tokens_per_s"
)

field() {  # field LINE NAME: the value of NAME=... in LINE
  sed -nE "s/.*[ ]$2=([^ ]+).*/\1/p" <<<"$1" | head -n1
}

echo "# cohort: $("$cohort" --version 2>&1)" | tee -a "$raw"
for c in "${cases[@]}" "${bf16[@]}"; do
  IFS='|' read -r name args _ _ _ <<<"$c"
  # shellcheck disable=SC2086  # the arguments are words
  line=$(timeout 150 "$cohort" bench train --device cuda $args 2>>"$out/gpu_compare.err" | grep '^RESULT bench=train' || echo "RESULT bench=train failed")
  echo "cohort|$name|$line" | tee -a "$raw"
done
# Two processes: gpu_torch.py's bf16 cases turn TF32 on for the rest of the process, which would
# make fp32 cases after them TF32 ones (the first H200 run measured its fp32 GPT-2 at 180k tokens/s
# after the bf16 cases, against 69k alone).
timeout 200 "$python" "$torch_script" "$corpus" mlp,cnn,gpt,gpt2 2>>"$out/gpu_compare.err" | sed 's/^/torch|/' | tee -a "$raw"
timeout 100 "$python" "$torch_script" "$corpus" amp 2>>"$out/gpu_compare.err" | sed 's/^/torch|/' | tee -a "$raw"

echo
echo "| case | precision | unit | Cohort | PyTorch | Cohort/PyTorch |"
echo "|---|---|---|---|---|---|"
row() {  # row SPEC PRECISION
  local name args cfield tprefix tfield cl tl cv tv ratio
  IFS='|' read -r name args cfield tprefix tfield <<<"$1"
  cl=$(grep -F "cohort|$name|" "$raw" | head -n1)
  tl=$(grep -F "torch|$tprefix" "$raw" | head -n1)
  cv=$(field "$cl" "$cfield")
  tv=$(field "$tl" "$tfield")
  ratio=$(awk -v a="${cv:-0}" -v b="${tv:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "-" }')
  echo "| $name | $2 | ${cfield//_/ } | ${cv:-failed} | ${tv:-failed} | $ratio |"
}
for c in "${cases[@]}"; do row "$c" "fp32, TF32 off"; done
for c in "${bf16[@]}"; do row "$c" "bf16 (fp32 master weights)"; done
peak=$(grep -F "torch|RESULT torch-bf16 gpt:layers=12,heads=12,dim=768,ctx=1024 vocab=50304 batch=8 " "$raw" | head -n1)
ours=$(grep -F "cohort|GPT-2 124M bf16, ctx 1024, batch 8, vocab 50304|" "$raw" | head -n1)
echo
echo "GPT-2 124M bf16, batch 8, vocab 50304, peak GPU memory allocated: Cohort $(field "$ours" peak_mem_gib) GiB," \
  "PyTorch $(field "$peak" peak_mem_gib) GiB (target: Cohort's no more than PyTorch's)"
