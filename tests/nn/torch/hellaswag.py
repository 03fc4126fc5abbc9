"""`cohort eval --task hellaswag` against a PyTorch reference written here as llm.c's
dev/data/hellaswag.py scores (issue 47, item 9): acc and acc_norm must be the same counts, on one
worker and on two under cohortrun; bad files are refused with one line naming FILE:LINE, exit 2.

usage: hellaswag.py COHORT COHORTRUN WORK_DIR

Everything is made here: a small byte-level BPE tokenizer in llm.c's gpt2_tokenizer.bin layout (the
256 bytes, then merges), a corpus of sentences from a small grammar encoded by this script's own BPE
(tiktoken's rule: merge the adjacent pair of lowest rank, a token's rank its id, within the pieces of
GPT-2's pattern; the text is ASCII, so the pattern's \\p{L} and \\p{N} are [A-Za-z] and [0-9] here),
a GPT trained on it by `cohort train --tokenizer` (a minute's training: better than chance, far from
perfect), and 20 HellaSwag items (ctx, endings, label), some with a context longer than the model's,
which both sides crop from the left. The reference loads the checkpoint's tensors into parity.py's
Gpt (nanoGPT's, strict) and, per item, computes for each ending the cross-entropy of its tokens given
the row before them (row = ctx tokens + ending tokens, cropped to its last ctx + 1), summed (acc:
argmin) and divided by the ending's token count (acc_norm: argmin).
"""
import json
import os
import random
import re
import struct
import subprocess
import sys

import torch

from load_checkpoint import read_safetensors
from parity import Gpt

LAYERS, HEADS, DIM, CONTEXT = 2, 2, 32, 32
PATTERN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")
MERGES = ["th", "he", "the", " t", " the", "at", " c", " ca", " cat", "og", " d", " do", " dog", "in", "ing", " s",
          "it", " sit", "ed", "an", " an", "nd", " and", "er", " o", " on", "ou", " r", "un", " run", " a", "re", ".\n"]
SUBJECTS = ["the cat", "the dog", "a bird", "the old man", "a child", "the farmer"]
VERBS = ["runs", "sits", "sleeps", "sings", "waits", "jumps"]
PLACES = ["on the mat", "in the garden", "by the river", "under the tree", "at the door", "near the house"]


def vocabulary():
    tokens = [bytes([b]) for b in range(256)]
    for m in MERGES:
        m = m.encode()
        assert any(m[:i] in tokens and m[i:] in tokens for i in range(1, len(m))), m
        tokens.append(m)
    return tokens


def tokenizer_file(tokens):
    header = struct.pack("<256I", 20240328, 1, len(tokens), *([0] * 253))
    return header + b"".join(bytes([len(t)]) + t for t in tokens)


def encode(text, ranks):
    ids = []
    for piece in PATTERN.findall(text):
        parts = [bytes([b]) for b in piece.encode()]
        while len(parts) > 1:
            best = min(((ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)
                        if parts[i] + parts[i + 1] in ranks), default=None)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        ids += [ranks[p] for p in parts]
    return ids


def sentence(rng):
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(PLACES)}."


def items(rng):
    out = []
    for n in range(20):
        ctx = " ".join(sentence(rng) for _ in range(1 + n % 3))
        if n % 5 == 0:  # longer than the model's context: cropped from the left
            ctx = " ".join(sentence(rng) for _ in range(5))
        true = sentence(rng)
        words = true.split()
        wrong = [" ".join(rng.sample(words, len(words))),  # the same words, shuffled
                 " ".join(rng.choice(VERBS) for _ in range(rng.randint(2, 6))) + ".",
                 f"{rng.choice(PLACES)} {rng.choice(SUBJECTS)}"]
        label = rng.randrange(4)
        endings = wrong[:label] + [true] + wrong[label:]
        out.append({"ind": n, "activity_label": "test", "ctx": ctx, "label": label, "endings": endings,
                    "split": "val", "source_id": f"test~{n}"})
    return out


def reference(checkpoint, examples, ranks, vocab):
    tensors, _ = read_safetensors(checkpoint)
    model = Gpt(vocab=vocab, layers=LAYERS, heads=HEADS, dim=DIM, context=CONTEXT)
    model.load_state_dict({k: v for k, v in tensors.items() if not k.startswith("optimizer.")}, strict=True)
    model.eval()
    correct = correct_norm = cropped = 0
    for ex in examples:
        ctx = encode(ex["ctx"], ranks)
        sums, means = [], []
        for ending in ex["endings"]:
            end = encode(" " + ending, ranks)
            row = (ctx + end)[-(CONTEXT + 1):]
            cropped += len(ctx) + len(end) > CONTEXT + 1
            tokens = torch.tensor(row, dtype=torch.long)
            with torch.no_grad():
                logits = model(tokens[:-1].unsqueeze(0))[0]
            losses = torch.nn.functional.cross_entropy(logits[-len(end):], tokens[-len(end):], reduction="none")
            sums.append(losses.sum())
            means.append(losses.sum() / len(end))
        correct += int(torch.stack(sums).argmin()) == ex["label"]
        correct_norm += int(torch.stack(means).argmin()) == ex["label"]
    return correct, correct_norm, cropped


def cohort_counts(command):
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 0, (command, out.stdout, out.stderr)
    lines = [line for line in out.stdout.splitlines() if "RESULT hellaswag" in line]  # cohortrun: "[rank 0] …"
    assert len(lines) == 1, out.stdout
    m = re.search(r"items=(\d+) acc=([0-9.]+) acc_norm=([0-9.]+) correct=(\d+) correct_norm=(\d+)", lines[0])
    return int(m.group(1)), int(m.group(4)), int(m.group(5)), lines[0]


def bad_input(cohort, base, work):
    """Each bad file: exit 2 and one stderr line naming FILE:LINE and the problem."""
    good = json.dumps({"ctx": "the cat", "label": 0, "endings": ["a", "b", "c", "d"]})
    cases = [
        ('{"label": 0, "endings": ["a", "b", "c", "d"]}', ':2: no "ctx" string'),
        ('{"ctx": "x", "label": 0, "endings": ["a", "b", "c"]}', ':2: no "endings" array of 4 strings'),
        ('{"ctx": "x", "endings": ["a", "b", "c", "d"]}', ':2: no "label"'),
        ('{"ctx": "x", "label": 4, "endings": ["a", "b", "c", "d"]}', ":2: label 4 is outside 0..3"),
        ('{"ctx": "x", "label": 0, "endings": ["a", "b", "c", "d"]', ":2: not a JSON object (invalid JSON)"),
        ('[1, 2]', ":2: not a JSON object"),
        (json.dumps({"ctx": "x", "label": 1, "endings": ["a", "b", "the cat " * 20, "d"]}),
         f":2: ending 2 is"),
    ]
    failures = 0
    for n, (line, phrase) in enumerate(cases):
        path = os.path.join(work, f"bad{n}.jsonl")
        with open(path, "w") as f:
            f.write(good + "\n" + line + "\n")
        r = subprocess.run([cohort, "eval"] + base + [path], capture_output=True, text=True)
        ok = r.returncode == 2 and r.stderr.count("\n") == 1 and (path + phrase) in r.stderr and r.stdout == ""
        print(("ok   " if ok else "FAIL ") + f"bad line {n}: exit {r.returncode}: {r.stderr.strip()}")
        failures += not ok
    # Usage: each one line, exit 2 (a vocabulary past bytes needs --tokenizer).
    usage = [(["--checkpoint", base[1], "--task", "hellaswag"], "--task hellaswag needs its file"),
             (["--checkpoint", base[1], "--task", "mmlu", path], "unknown --task 'mmlu': expected hellaswag"),
             (["--checkpoint", base[1], path], "is for --task hellaswag"),
             (["--checkpoint", base[1], "--task", "hellaswag", path], "not bytes: give --tokenizer")]
    for args, phrase in usage:
        r = subprocess.run([cohort, "eval"] + args, capture_output=True, text=True)
        ok = r.returncode == 2 and r.stderr.count("\n") == 1 and phrase in r.stderr and r.stdout == ""
        print(("ok   " if ok else "FAIL ") + f"usage: exit {r.returncode}: {r.stderr.strip()}")
        failures += not ok
    return failures


def sharded(cohort, cohortrun, spec, shard, tok, data, work):
    """A sharded (ZeRO-1) checkpoint of two workers records the tokenizer's digest in its manifest, as a
    whole-model checkpoint does, and --task hellaswag reads it."""
    manifest = os.path.join(work, "zero.st")
    subprocess.run([cohortrun, "--nproc-per-node", "2", "--", cohort, "train", "--threads", "1", "--model", spec,
                    "--data", "tokens:raw:" + shard, "--tokenizer", tok, "--mode", "allreduce", "--zero", "1",
                    "--max-steps", "3", "--epochs", "1", "--progress-every", "0", "--checkpoint", manifest],
                   check=True, stdout=subprocess.DEVNULL)
    _, whole = read_safetensors(os.path.join(work, "gpt.st"))
    _, metadata = read_safetensors(manifest)
    n, _, _, line = cohort_counts([cohort, "eval", "--checkpoint", manifest, "--tokenizer", tok, "--task", "hellaswag",
                                   data])
    ok = "sharded_checkpoint" in metadata and metadata.get("tokenizer_digest") == whole["tokenizer_digest"] and n == 20
    print(("ok   " if ok else "FAIL ") + f"a ZeRO-1 checkpoint records tokenizer_digest {metadata.get('tokenizer_digest')} "
          f"(the whole-model one: {whole.get('tokenizer_digest')}); {line}")
    return not ok


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    cohort, cohortrun, work = sys.argv[1:]
    tokens = vocabulary()
    ranks = {t: i for i, t in enumerate(tokens)}
    vocab = len(tokens)
    tok = os.path.join(work, "tokenizer.bin")
    with open(tok, "wb") as f:
        f.write(tokenizer_file(tokens))
    rng = random.Random(47)
    corpus = []
    while len(corpus) < 40000:
        corpus += encode(sentence(rng) + ("\n" if rng.random() < 0.2 else " "), ranks)
    shard = os.path.join(work, "corpus.bin")
    with open(shard, "wb") as f:
        f.write(struct.pack(f"<{len(corpus)}H", *corpus))
    checkpoint = os.path.join(work, "gpt.st")
    spec = f"gpt:layers={LAYERS},heads={HEADS},dim={DIM},ctx={CONTEXT},vocab={vocab}"
    subprocess.run([cohort, "train", "--threads", "1", "--model", spec, "--data", "tokens:raw:" + shard, "--tokenizer",
                    tok, "--optimizer", "adamw", "--lr", "0.003", "--batch-size", "8", "--max-steps", "200",
                    "--epochs", "1", "--progress-every", "0", "--checkpoint", checkpoint],
                   check=True, stdout=subprocess.DEVNULL)
    examples = items(random.Random(9))
    data = os.path.join(work, "hellaswag.jsonl")
    with open(data, "w") as f:
        f.write("".join(json.dumps(ex) + "\n" for ex in examples))

    base = ["--checkpoint", checkpoint, "--tokenizer", tok, "--task", "hellaswag"]
    metrics = os.path.join(work, "hellaswag.json")
    n1, c1, cn1, line1 = cohort_counts([cohort, "eval"] + base + ["--metrics", metrics, data])
    with open(metrics) as f:
        written = json.loads(f.read())
    n2, c2, cn2, line2 = cohort_counts([cohortrun, "--nproc-per-node", "2", "--", cohort, "eval"] + base + [data])
    torch.set_num_threads(1)
    correct, correct_norm, cropped = reference(checkpoint, examples, ranks, vocab)
    print(f"Cohort, 1 worker:  {line1}")
    print(f"Cohort, 2 workers: {line2}")
    print(f"PyTorch reference: items={len(examples)} correct={correct} correct_norm={correct_norm} "
          f"(acc {correct / len(examples):.4f}, acc_norm {correct_norm / len(examples):.4f}); "
          f"{cropped} rows cropped to the context")
    checks = {
        "the item count": n1 == n2 == len(examples),
        "acc (correct) equals the reference's": c1 == correct,
        "acc_norm (correct_norm) equals the reference's": cn1 == correct_norm,
        "two workers give one worker's counts": (c2, cn2) == (c1, cn1),
        "--metrics holds the same figures": written == {"task": "hellaswag", "items": 20, "acc": c1 / 20,
                                                        "acc_norm": cn1 / 20, "correct": c1, "correct_norm": cn1},
        "the figures are not trivial (neither 0 nor all)": 0 < correct < len(examples) and 0 < correct_norm < len(examples),
        "some rows were cropped": cropped > 0,
    }
    failures = 0
    for what, ok in checks.items():
        print(("ok   " if ok else "FAIL ") + what)
        failures += not ok
    failures += sharded(cohort, cohortrun, spec, shard, tok, data, work)
    failures += bad_input(cohort, base, work)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
