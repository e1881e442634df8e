"""Loading the embedded SmolLM2-135M-Instruct: cold, warm, and plain ``transformers`` on the same weights.

- **cold**: ``lp.load_model()`` with an empty cache folder: the GGUF file is dequantised, its tokenizer
  converted, and the safetensors folder written (once per machine, file and package versions);
- **warm**: ``lp.load_model()`` again, from that folder (the cache's key and manifest checked, the
  weights read memory-mapped, the TransformerLens bridge built);
- **plain**: ``transformers`` ``AutoModelForCausalLM.from_pretrained`` of the same safetensors folder
  (eager attention, float32), alone and with ``AutoTokenizer.from_pretrained`` (``lp.load_model`` loads
  both); then, apart, TransformerLens building its bridge over that model (what ``lp.load_model`` adds
  to plain loading besides the cache's lookup).

Every load runs in a fresh Python process (what a notebook, a command or a test process pays) that
first imports the same libraries (torch, transformers, TransformerLens, lensprobe: their import time is
printed apart), so the load times compare the loading work alone; each load's first call still pays
what transformers imports lazily (the Llama modelling code). Warm and plain runs alternate, so a busy
machine slows both alike. The cache is a temporary folder (``$LENSPROBE_CACHE``), never the user's.
Times are medians (and minima) over ``--repeats``; ratios are of medians.

Usage:
    python benchmarks/load_time.py --repeats 5
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

LP = """
import json, time
t0 = time.perf_counter()
import torch, transformers, transformer_lens.model_bridge
import lensprobe as lp
from lensprobe.core.models.loading import converted_gguf_folder, embedded_gguf_path
t1 = time.perf_counter()
model = lp.load_model()
t2 = time.perf_counter()
folder = converted_gguf_folder(embedded_gguf_path())
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "lookup": t3 - t2, "folder": str(folder)}))
"""

PLAIN = """
import json, sys, time
t0 = time.perf_counter()
import torch, transformers, transformer_lens.model_bridge
import lensprobe
t1 = time.perf_counter()
hf = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], attn_implementation="eager", dtype=torch.float32)
t2 = time.perf_counter()
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
t3 = time.perf_counter()
bridge = transformer_lens.model_bridge.TransformerBridge.boot_transformers(
    sys.argv[1], hf_model=hf.eval(), tokenizer=tok, device="cpu", dtype=torch.float32)
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "load+tokenizer": t3 - t1, "bridge": t4 - t3}))
"""


def run(code: str, cache: str, *args: str) -> dict:
    env = {**os.environ, "LENSPROBE_CACHE": cache, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(name: str, values: list[float]) -> float:
    mid = statistics.median(values)
    print(f"{name:<34} median {mid:6.2f} s   min {min(values):6.2f} s   (n={len(values)})")
    return mid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="warm and plain loads, each (default: 5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lensprobe-load-time-") as cache:
        cold = run(LP, cache)
        warm, plain = [], []
        for _ in range(args.repeats):
            warm.append(run(LP, cache))
            plain.append(run(PLAIN, cache, cold["folder"]))
    print(f"embedded model, {args.repeats} warm and plain loads, each in a fresh process")
    cold_s = summary("cold lp.load_model() (converts)", [cold["load"]])
    warm_s = summary("warm lp.load_model()", [w["load"] for w in warm])
    summary("  of which the cache lookup", [w["lookup"] for w in warm])
    plain_s = summary("plain from_pretrained (model)", [p["load"] for p in plain])
    plain_tok = summary("plain from_pretrained (+tokenizer)", [p["load+tokenizer"] for p in plain])
    summary("TransformerLens bridge over it", [p["bridge"] for p in plain])
    summary("imports (torch, transformers, TL, lp)", [w["import"] for w in warm + plain])
    print(f"cold / warm: {cold_s / warm_s:.1f}x")
    print(f"warm / plain (model): {warm_s / plain_s:.2f}x")
    print(f"warm / plain (model + tokenizer): {warm_s / plain_tok:.2f}x")


if __name__ == "__main__":
    main()
