"""A Cohort GPT checkpoint in PyTorch: the safetensors file `cohort train --model gpt:...` writes loads
into a PyTorch GPT with nanoGPT's parameter names (parity.py's Gpt) with load_state_dict(strict=True),
and that model's loss on the text's test split equals `cohort eval`'s.

usage: load_checkpoint.py COHORT TEXT_FILE WORK_DIR

Reads the file with the standard library and torch only (the safetensors layout: an 8-byte
little-endian header size, a JSON header of dtype, shape and byte offsets, then the data), the way a
user without the safetensors package can. The test split is the one Cohort evaluates: the last 10%
of the file, in consecutive windows of ctx + 1 bytes (runtime/data/text.h).
"""
import json
import math
import os
import re
import struct
import subprocess
import sys

import torch

from parity import Gpt

SPEC = "gpt:layers=2,heads=2,dim=32,ctx=16"


def read_safetensors(path):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        data = bytearray(f.read())
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", (name, entry["dtype"])
        begin, end = entry["data_offsets"]
        tensors[name] = torch.frombuffer(data[begin:end], dtype=torch.float32).reshape(entry["shape"]).clone()
    return tensors, header.get("__metadata__", {})


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    cohort, text, work = sys.argv[1:]
    checkpoint = os.path.join(work, "gpt.st")
    subprocess.run([cohort, "train", "--model", SPEC, "--data", "text:" + text, "--optimizer", "adamw", "--lr", "0.01",
                    "--batch-size", "8", "--max-steps", "30", "--epochs", "1", "--progress-every", "0",
                    "--checkpoint", checkpoint], check=True, stdout=subprocess.DEVNULL)
    out = subprocess.run([cohort, "eval", "--checkpoint", checkpoint, "--data", "text:" + text], check=True,
                         capture_output=True, text=True).stdout
    cohort_loss = float(re.search(r"test_loss=([0-9.e+-]+)", out).group(1))

    tensors, metadata = read_safetensors(checkpoint)
    assert metadata.get("model") == SPEC, metadata.get("model")
    params = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    model = Gpt(vocab=256, layers=2, heads=2, dim=32, context=16)
    model.load_state_dict(params, strict=True)  # every name and shape nanoGPT's, nothing left over
    data = open(text, "rb").read()
    test = data[len(data) - len(data) // 10:]
    ctx = 16
    windows = (len(test) - 1) // ctx
    ids = torch.tensor(list(test[:windows * ctx + 1]), dtype=torch.long)
    x = torch.stack([ids[w * ctx:w * ctx + ctx] for w in range(windows)])
    y = torch.stack([ids[w * ctx + 1:w * ctx + ctx + 1] for w in range(windows)])
    with torch.no_grad():
        torch_loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).item()
    rel = abs(torch_loss - cohort_loss) / abs(cohort_loss)
    verdict = "ok  " if rel <= 1e-5 else "FAIL"
    print(f"{verdict} {len(params)} tensors of {SPEC} loaded with strict=True; test loss over {windows} windows: "
          f"Cohort {cohort_loss:.6f} PyTorch {torch_loss:.6f} (relative difference {rel:.1e}, bound 1e-5)")
    return 0 if rel <= 1e-5 and math.isfinite(torch_loss) else 1


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
