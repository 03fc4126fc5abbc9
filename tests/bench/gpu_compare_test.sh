#!/usr/bin/env bash
# bench/gpu_compare.sh and bench/gpu_profile.sh without a GPU, so that the scripts keep working: a
# stand-in cohort and stand-in profilers and PyTorch print lines of the real programs' formats, and
# the table, its ratios and peaks, the order of the cases (bf16 first), the line on issue 48's targets
# and the profile's shares must come out of them.
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
# cohort bench train: tokens/s from the case's arguments (bf16 GPT-2 at 50304: 380000), a calls log.
cat > "$work/bin/cohort" <<'SH'
#!/usr/bin/env bash
echo "$*" >> "$CALLS"
[ "$1" = --version ] && { echo "cohort test"; exit 0; }
tps=100000
case "$*" in *vocab=50304*bf16*) tps=380000 ;; *bf16*) tps=300000 ;; esac
echo "RESULT bench=train model=x device=cuda:0 batch=8 samples_per_s=$((tps / 1024)) peak_mem_gib=8.500 warmup_loss=5.1 loss=3.2 tokens_per_s=$tps"
SH
cat > "$work/torch.py" <<'PY'
import sys
with open(sys.argv[0] + ".calls", "a") as f:
    f.write(sys.argv[2] + "\n")
if sys.argv[2] == "amp":
    print("RESULT torch-bf16 gpt:layers=12,heads=12,dim=768,ctx=1024 vocab=50304 batch=8 tokens_per_s=300000 peak_mem_gib=9.1")
    print("RESULT torch-bf16 gpt:layers=12,heads=12,dim=768,ctx=1024 vocab=256 batch=8 tokens_per_s=250000 peak_mem_gib=7.0")
else:
    print("RESULT torch mlp:784,512,256,10 batch=64 data=host samples_per_s=50000")
    print("RESULT torch gpt:layers=6,heads=6,dim=384,ctx=256 batch=64 tokens_per_s=200000")
PY
chmod +x "$work/bin/cohort"
export CALLS="$work/calls"
out=$(COHORT="$work/bin/cohort" PYTHON=python3 bash bench/gpu_compare.sh "$work/torch.py" "$work/out" "$work")
echo "$out"
fail() { echo "gpu_compare_test: $*" >&2; exit 1; }
grep -Fq '| GPT-2 124M bf16, ctx 1024, batch 8, vocab 50304 | bf16 (fp32 master weights) | tokens per s | 380000 | 300000 | 1.27 | 8.500 | 9.1 |' <<<"$out" ||
  fail "no bf16 GPT-2 row with its ratio and peaks"
grep -Fq '| GPT 6x384, ctx 256, batch 64 | fp32, TF32 off | tokens per s | 100000 | 200000 | 0.50 |' <<<"$out" ||
  fail "no fp32 GPT row"
grep -Fq '| cnn:rosetta, batch 64 | fp32, TF32 off | samples per s | 97 | failed | - |' <<<"$out" ||
  fail "a case PyTorch did not print must read failed, its ratio -"
grep -Fq 'target GPT-2 124M bf16, ctx 1024, batch 8, vocab 50304: 380000 tokens/s (>= 370000: met), 1.27 x PyTorch (>= 1.2: met), peak 8.500 GiB (<= 8.9: met)' <<<"$out" ||
  fail "no target line"
# bf16 first on both sides: Cohort's first two runs are the bf16 ones, PyTorch's amp process first.
[ "$(sed -n 2p "$CALLS" | grep -c 'precision bf16')" = 1 ] && [ "$(sed -n 3p "$CALLS" | grep -c 'precision bf16')" = 1 ] ||
  fail "Cohort's bf16 cases do not run first: $(cat "$CALLS")"
[ "$(head -n1 "$work/torch.py.calls")" = amp ] || fail "PyTorch's bf16 (amp) process does not run first"

# gpu_profile.sh with a stand-in ncu writing gpu__time_duration of one step's kernels.
cat > "$work/bin/ncu" <<'SH'
#!/usr/bin/env bash
log=""
while [ $# -gt 0 ]; do case "$1" in --log-file) log=$2; shift 2 ;; --*) [ "$1" = --profile-from-start ] || [ "$1" = --metrics ] || [ "$1" = --page ] && shift; shift ;; *) break ;; esac; done
"$@" | grep RESULT
case "$*" in *--profile*) ;; *) echo "ncu stand-in: the bench was not asked to mark its steps" >&2; exit 3 ;; esac
{
  echo '"ID","Kernel Name","gpu__time_duration.sum"'
  echo '"","","usecond"'
  echo '"0","gemm_kernel(int)","600"'
  echo '"1","attention(int)","300"'
  echo '"2","gemm_kernel(int)","100"'
} > "$log"
SH
chmod +x "$work/bin/ncu"
prof=$(PROFILER=ncu PATH="$work/bin:$PATH" COHORT="$work/bin/cohort" bash bench/gpu_profile.sh "$work/profile")
echo "$prof"
grep -Fq 'profile: ncu, 1 steps, 3 kernel launches a step, 1.00 ms of kernel time a step' <<<"$prof" || fail "no profile line"
grep -Fq '| 70.0% | 0.700 | 2 | `gemm_kernel` |' <<<"$prof" || fail "no gemm share"
grep -Fq '| 30.0% | 0.300 | 1 | `attention` |' <<<"$prof" || fail "no attention share"
echo "gpu_compare_test: passed"
