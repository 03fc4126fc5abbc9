#!/usr/bin/python3
"""GPT-2 weights in and out of Cohort (issue 32), against a GPT-2 written here in PyTorch in
HuggingFace's layout (Conv1D projections computed as x.W + b, the head tied to wte, GELU's tanh form,
LayerNorm eps 1e-5), in float64.

Random weights (2 layers, width 64, 4 heads, context 32, vocabulary 515: llm.c pads it to 640) are
written the way HuggingFace and llm.c write them, from their published layouts:
  hf/         model.safetensors (F32, names without "transformer.", the attention's mask buffers) and
              config.json
  hf16.safetensors  "transformer." names, a tied lm_head.weight, BF16, no config.json
  gpt2.bin    llm.c version 3 (fp32), gpt2_16.bin version 5 (bf16, rounded to nearest even)
Must hold:
  - Cohort's logits (nn::readModelWeights, as --init-from and generate read) for every file equal the
    reference's within 1e-5 of the largest logit (bf16 files: the reference on the bf16 weights); a
    model of llm.c's padded vocabulary gives the same logits and zeros past 515; a model of a shorter
    context takes wpe's leading rows;
  - `cohort export --format llmc` of the Cohort checkpoint of these weights is byte for byte the llm.c
    file written here (fp32 and bf16), `--format hf` holds the same tensors bit for bit;
  - `cohort train --init-from` from the checkpoint, the HuggingFace files and the llm.c file ends
    with the same weights bit for bit;
  - `cohort eval` of the llm.c and HuggingFace files on a token shard gives the reference's loss;
  - every malformed file and mismatching --model is refused with one line and exit 2.

usage: gpt2_weights.py COHORT WORKER WORK_DIR     (exit 1: a check failed)
"""
import json
import os
import struct
import subprocess
import sys

import torch

from load_checkpoint import read_safetensors

L, C, H, T, V = 2, 64, 4, 32, 515
VP = 640
TOLERANCE = 1e-5
BLOCK = [  # llm.c's order; True: a Conv1D weight, [in, out] in HuggingFace's files
    ("ln_1.weight", False), ("ln_1.bias", False), ("attn.c_attn.weight", True), ("attn.c_attn.bias", False),
    ("attn.c_proj.weight", True), ("attn.c_proj.bias", False), ("ln_2.weight", False), ("ln_2.bias", False),
    ("mlp.c_fc.weight", True), ("mlp.c_fc.bias", False), ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False),
]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def random_weights(seed):
    """HuggingFace-layout GPT-2 tensors (names without "transformer.")."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, std=0.1: torch.randn(*shape, generator=g) * std
    w = {"wte.weight": rnd(V, C), "wpe.weight": rnd(T, C), "ln_f.weight": 1 + rnd(C), "ln_f.bias": rnd(C)}
    sizes = {"ln_1": None, "attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "ln_2": None,
             "mlp.c_fc": (C, 4 * C), "mlp.c_proj": (4 * C, C)}
    for l in range(L):
        for name, shape in sizes.items():
            p = f"h.{l}.{name}"
            if shape is None:
                w[p + ".weight"], w[p + ".bias"] = 1 + rnd(C), rnd(C)
            else:
                w[p + ".weight"], w[p + ".bias"] = rnd(*shape), rnd(shape[1], std=0.05)
    return w


def reference_logits(w, ids):
    """GPT-2 forward in HuggingFace's layout, float64."""
    w = {k: v.double() for k, v in w.items()}
    ln = lambda x, p: torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], 1e-5)
    conv1d = lambda x, p: x @ w[p + ".weight"] + w[p + ".bias"]
    b, t = ids.shape
    x = w["wte.weight"][ids] + w["wpe.weight"][:t]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for l in range(L):
        p = f"h.{l}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-2, -1) / (C // H) ** 0.5).masked_fill(~mask, float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, C)
        x = x + conv1d(y, p + "attn.c_proj")
        h = torch.nn.functional.gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
        x = x + conv1d(h, p + "mlp.c_proj")
    return ln(x, "ln_f") @ w["wte.weight"].T


def bf16(t):
    return t.to(torch.bfloat16).float()


def write_safetensors(path, tensors, metadata=None, dtype="F32"):
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        data = (t.to(torch.bfloat16).view(torch.int16) if dtype == "BF16" else t.float()).contiguous().numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def llmc_bytes(w, version=3):
    """llm.c's model file: the header, then the parameters in its order, Linear layout [out, in]."""
    header = [20240326, version, T, V, L, H, C, VP] + [0] * 248
    linear = lambda name, conv: w[name].T if conv else w[name]
    parts = [torch.cat([w["wte.weight"], torch.zeros(VP - V, C)]), w["wpe.weight"]]
    for name, conv in BLOCK:
        parts += [linear(f"h.{l}.{name}", conv) for l in range(L)]
    parts += [w["ln_f.weight"], w["ln_f.bias"]]
    flat = torch.cat([p.contiguous().reshape(-1) for p in parts])
    data = flat.to(torch.bfloat16).view(torch.int16) if version == 5 else flat
    return struct.pack("<256i", *header) + data.numpy().tobytes()


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def run(cmd):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True)


def cohort_logits(worker, work, weights, ids, spec=None, vocab=V):
    tokens = os.path.join(work, "tokens.i32")
    write(tokens, struct.pack("<2i", *ids.shape) + ids.to(torch.int32).numpy().tobytes())
    out = os.path.join(work, "logits.f32")
    r = run([worker, "logits", weights, tokens, out] + ([spec] if spec else []))
    if r.returncode != 0:
        check(False, f"worker on {weights}: {r.stderr.strip()}")
        return None, ""
    with open(out, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(*ids.shape, vocab), r.stdout.strip()


def compare_logits(got, want, what):
    if got is None:
        return
    err = (got.double() - want).abs().max().item() / want.abs().max().item()
    check(err <= TOLERANCE, f"{what}: logits within {err:.2e} of the reference's largest (bound {TOLERANCE:g})")


def check_logits(worker, work, w, files):
    ids = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(7))
    want, want16 = reference_logits(w, ids), reference_logits({k: bf16(v) for k, v in w.items()}, ids)
    spec = f"gpt:layers={L},heads={H},dim={C},ctx={T},vocab={V}"
    for path, reference, model in [(files["hf"], want, None), (files["hf16"], want16, spec),
                                   (files["llmc"], want, None), (files["llmc16"], want16, None)]:
        got, said = cohort_logits(worker, work, path, ids, model)
        compare_logits(got, reference, f"{os.path.basename(path)} ({said})")
    got, _ = cohort_logits(worker, work, files["llmc"], ids, spec.replace(f"vocab={V}", f"vocab={VP}"), VP)
    if got is not None:
        compare_logits(got[..., :V], want, "gpt2.bin in a model of the padded vocabulary 640")
        check(bool((got[..., V:] == 0).all()), "the padded vocabulary's logits are 0 (llm.c's zero rows)")
    short = ids[:, : T // 2]
    got, _ = cohort_logits(worker, work, files["hf"], short, spec.replace(f"ctx={T}", f"ctx={T // 2}"))
    compare_logits(got, reference_logits(w, short), "hf/ in a model of context 16 (wpe's leading rows)")


def check_export(cohort, worker, work, w, files):
    ckpt = os.path.join(work, "cohort.safetensors")
    r = run([worker, "checkpoint", files["hf"], ckpt])
    check(r.returncode == 0, f"the weights as a Cohort checkpoint {r.stderr.strip()}")
    for fmt, args, out, expected in [("llmc", [], "out.bin", files["llmc"]), ("llmc", ["--dtype", "bf16"], "out16.bin", files["llmc16"])]:
        r = run([cohort, "export", "--format", fmt] + args + [ckpt, os.path.join(work, out)])
        same = r.returncode == 0 and open(os.path.join(work, out), "rb").read() == open(expected, "rb").read()
        check(same, f"export --format llmc {' '.join(args)} is byte for byte llm.c's file {r.stderr.strip()}")
    r = run([cohort, "export", "--format", "hf", ckpt, os.path.join(work, "out_hf")])
    exported, meta = read_safetensors(os.path.join(work, "out_hf", "model.safetensors"))
    config = json.load(open(os.path.join(work, "out_hf", "config.json")))
    names = {k.removeprefix("transformer."): v for k, v in exported.items()}
    same = r.returncode == 0 and names.keys() == w.keys() and all(torch.equal(names[k], w[k]) for k in w)
    check(same and meta.get("format") == "pt", "export --format hf holds HuggingFace's tensors bit for bit, format pt")
    check((config["n_head"], config["n_embd"], config["n_layer"], config["vocab_size"], config["n_positions"]) == (H, C, L, V, T),
          "export --format hf writes config.json with the model's sizes")
    return ckpt, os.path.join(work, "out_hf"), os.path.join(work, "out.bin")


def check_init_from(cohort, work, sources):
    text = os.path.join(work, "text.txt")
    write(text, bytes(range(32, 127)) * 200)
    finals = []
    for source in sources:
        out = os.path.join(work, "trained.safetensors")
        r = run([cohort, "train", "--init-from", source, "--data", f"text:{text}", "--batch-size", "4", "--max-steps", "2",
                 "--optimizer", "adamw", "--lr", "1e-3", "--checkpoint", out, "--progress-every", "0"])
        check(r.returncode == 0 and "started from" in r.stdout + r.stderr, f"cohort train --init-from {os.path.basename(source)} {r.stderr.strip()[-300:]}")
        finals.append(read_safetensors(out)[0] if r.returncode == 0 else {})
    params = [k for k in finals[0] if k.startswith("transformer.")]
    same = len(params) == 2 + 12 * L + 2 and all(all(torch.equal(f.get(k), finals[0][k]) for k in params) for f in finals[1:])
    check(same, f"training from {len(sources)} files of the same weights ends with the same {len(params)} tensors bit for bit")



def check_eval(cohort, work, w, files):
    """`cohort eval` of GPT-2's files on a token shard: the reference's mean cross-entropy over the
    shard's consecutive windows of T + 1 tokens (the test split of tokens: data)."""
    windows = 6
    ids = torch.randint(0, V, (windows * T + 1,), generator=torch.Generator().manual_seed(11))
    shard = os.path.join(work, "shard.bin")
    write(shard, struct.pack("<256i", 20240520, 1, len(ids), *[0] * 253) + ids.to(torch.int16).numpy().tobytes())
    x = torch.stack([ids[i * T: i * T + T] for i in range(windows)])
    y = torch.stack([ids[i * T + 1: i * T + T + 1] for i in range(windows)])
    want = torch.nn.functional.cross_entropy(reference_logits(w, x).reshape(-1, V), y.reshape(-1)).item()
    for source in (files["llmc"], files["hf"]):
        r = run([cohort, "eval", "--checkpoint", source, "--data", f"tokens:{shard}"])
        got = [float(f.split("=")[1]) for f in r.stdout.split() if f.startswith("test_loss=")]
        ok = r.returncode == 0 and len(got) == 1 and abs(got[0] - want) <= 1e-5 * abs(want)
        check(ok, f"cohort eval --checkpoint {os.path.basename(source)} on a token shard: {got} against the reference's {want:.6f} {r.stderr.strip()}")


def check_refusals(cohort, work, w, files):
    text = os.path.join(work, "text.txt")
    bad = lambda name: os.path.join(work, name)
    header = bytearray(open(files["llmc"], "rb").read())
    write(bad("magic.bin"), struct.pack("<i", 20240327) + header[4:])
    write(bad("version.bin"), header[:4] + struct.pack("<i", 4) + header[8:])
    write(bad("short.bin"), header[:-4])
    missing = {k: v for k, v in w.items() if k != "h.1.mlp.c_fc.bias"}
    write_safetensors(bad("missing.safetensors"), missing)
    write_safetensors(bad("shape.safetensors"), {**w, "h.0.attn.c_attn.weight": w["h.0.attn.c_attn.weight"].T})
    write_safetensors(bad("untied.safetensors"), {**w, "lm_head.weight": w["wte.weight"] + 1})
    write_safetensors(bad("other.safetensors"), {"fc0.weight": torch.zeros(2, 2)})
    os.makedirs(bad("config"), exist_ok=True)
    write_safetensors(bad("config/model.safetensors"), w)
    json.dump({"n_head": H, "n_embd": 2 * C}, open(bad("config/config.json"), "w"))
    model = lambda **o: "gpt:" + ",".join(f"{k}={v}" for k, v in {"layers": L, "heads": H, "dim": C, "ctx": T, "vocab": V, **o}.items())
    cases = [
        ([bad("magic.bin")], "magic 20240327 at byte 0"),
        ([bad("version.bin")], "version 4 at byte 4"),
        ([bad("short.bin")], "bytes, but an llm.c fp32 model of these sizes"),
        ([bad("missing.safetensors")], "has no tensor 'h.1.mlp.c_fc.bias'"),
        ([bad("shape.safetensors")], "'h.0.attn.c_attn.weight' is [192, 64], a GPT-2 of these sizes needs [64, 192]"),
        ([bad("untied.safetensors")], "differs from 'wte.weight'"),
        ([bad("other.safetensors")], "no 2-d tensor 'wte.weight'"),
        ([bad("config")], "\"n_embd\" is 128, but the weights say 64"),
        ([bad("absent.safetensors")], "absent.safetensors: cannot open: No such file"),
        ([files["hf"], "--model", model(vocab=600)], "'transformer.wte.weight' is [600, 64] in the model and [515, 64] in the file"),
        ([files["llmc"], "--model", model(heads=2)], "has 2 heads, but"),
        ([files["hf"], "--model", model(ctx=64)], "'transformer.wpe.weight' is [64, 64] in the model and [32, 64] in the file"),
    ]
    for args, expected in cases:
        r = run([cohort, "train", "--init-from"] + args + ["--data", f"text:{text}", "--max-steps", "1", "--progress-every", "0"])
        lines = r.stderr.strip().splitlines()
        ok = r.returncode == 2 and len(lines) == 1 and expected in lines[0]
        check(ok, f"--init-from {' '.join(os.path.basename(a) for a in args)} refused, exit {r.returncode}: {r.stderr.strip()}")


def main():
    cohort, worker, work = sys.argv[1:4]
    w = random_weights(1)
    files = {"hf": os.path.join(work, "hf"), "hf16": os.path.join(work, "hf16.safetensors"),
             "llmc": os.path.join(work, "gpt2.bin"), "llmc16": os.path.join(work, "gpt2_16.bin")}
    os.makedirs(files["hf"], exist_ok=True)
    attn_mask = torch.ones(T, T).tril().view(1, 1, T, T)
    write_safetensors(os.path.join(files["hf"], "model.safetensors"),
                      {**w, **{f"h.{l}.attn.bias": attn_mask for l in range(L)}}, {"format": "pt"})
    json.dump({"model_type": "gpt2", "n_head": H, "n_embd": C, "n_layer": L, "vocab_size": V, "n_positions": T,
               "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}, open(os.path.join(files["hf"], "config.json"), "w"))
    write_safetensors(files["hf16"], {**{"transformer." + k: v for k, v in w.items()}, "lm_head.weight": w["wte.weight"]},
                      {"format": "pt"}, dtype="BF16")
    write(files["llmc"], llmc_bytes(w, 3))
    write(files["llmc16"], llmc_bytes(w, 5))
    check_logits(worker, work, w, files)
    ckpt, hf_out, llmc_out = check_export(cohort, worker, work, w, files)
    check_init_from(cohort, work, [ckpt, files["hf"], files["llmc"], hf_out, llmc_out])
    check_eval(cohort, work, w, files)
    check_refusals(cohort, work, w, files)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
