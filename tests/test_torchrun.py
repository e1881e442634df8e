"""Two processes under torchrun: a sharded ablation sweep and trace set merge into the single-process
result, bit for bit, and a rerun of the same folder resumes without computing anything."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lensprobe as lp
from lensprobe.core.storage.rowfiles import read_row_file

QUESTIONS = ["What is 12+7?", "What is 3*4?", "What is 5*6?"]
SWEEP = dict(metric="entropy", batch_size=3, progress=False)
TRACE = dict(max_new_tokens=6, track={"system": "system"})

SCRIPT = """
import json, sys
from pathlib import Path
import torch
import lensprobe as lp
from lensprobe.core.storage.shards import shard_info
from lensprobe.core.models.testing import tiny_model

questions, out = json.loads(sys.argv[1]), Path(sys.argv[2])
model = tiny_model(seed=0)
prompts = [lp.build_prompt(model, q, system="Please reason step by step.") for q in questions]
sweep = lp.ablation_sweep(model, prompts, **json.loads(sys.argv[3]), out=out / "sweep")
traces = lp.generation.trace_prompts(model, prompts, **json.loads(sys.argv[4]), out=out / "traces")
rank, world = shard_info()
torch.save({"world": world, "baseline": sweep.baseline, "ablated": sweep.ablated,
            "traces": {i: (t.token_ids_rows, t.entropy_rows, t.attention_rows["system"], t.texts)
                       for i, t in traces.items()}},
           out / f"returned-rank{rank}.pt")
"""


def torchrun(script: Path, out: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           json.dumps(QUESTIONS), str(out), json.dumps(SWEEP), json.dumps(TRACE)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def mtimes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow  # launches torchrun with two processes
def test_torchrun_two_processes_merge_to_the_single_run_and_resume(tiny, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT, encoding="utf-8")
    out = tmp_path / "run"
    torchrun(script, out)
    merged = torch.load(out / "returned-rank0.pt")
    part = torch.load(out / "returned-rank1.pt")
    assert merged["world"] == part["world"] == 2
    # shard-rank files from both processes: each computed its own units, one row each
    units = {r: [row["unit"] for _, row in read_row_file(out / "sweep" / f"shard-rank{r}.jsonl")] for r in (0, 1)}
    assert all(len(set(u)) == len(u) for u in units.values())
    assert sorted(units[0]) == sorted(f"prompt {p} batch {c}" for p in range(3) for c in range(3)
                                      if (3 * p + c) % 2 == 0)
    assert sorted(units[1]) == sorted(f"prompt {p} batch {c}" for p in range(3) for c in range(3)
                                      if (3 * p + c) % 2 == 1)

    # The single-process run, here in the test's own process.
    prompts = [lp.build_prompt(tiny, q, system="Please reason step by step.") for q in QUESTIONS]
    single = lp.ablation_sweep(tiny, prompts, **SWEEP)
    assert torch.equal(merged["baseline"], single.baseline) and torch.equal(merged["ablated"], single.ablated)
    assert bool(part["ablated"].isnan().any()) and not bool(merged["ablated"].isnan().any())
    assert list(merged["traces"]) == [0, 1, 2] and list(part["traces"]) == [1]
    for i, p in enumerate(prompts):
        want = lp.trace_generation(tiny, p, **TRACE)
        ids, ent, att, texts = merged["traces"][i]
        assert torch.equal(ids, want.token_ids_rows) and texts == want.texts
        assert torch.equal(ent, want.entropy_rows) and torch.equal(att, want.attention_rows["system"])

    # A rerun (here rank 1 then rank 0 of two, in this process) finds every unit on disk: nothing is
    # computed or written again, and rank 0 returns the merged results read back from the folder.
    before = {name: mtimes(out / name) for name in ("sweep", "traces")}
    for rank in (1, 0):
        sweep = lp.ablation_sweep(tiny, prompts, **SWEEP, out=out / "sweep", rank=rank, world_size=2)
        traces = lp.generation.trace_prompts(tiny, prompts, **TRACE, out=out / "traces", rank=rank, world_size=2)
        assert {name: mtimes(out / name) for name in ("sweep", "traces")} == before
    assert torch.equal(sweep.ablated, single.ablated) and list(traces) == [0, 1, 2]
    assert all(torch.equal(traces[i].entropy_rows, merged["traces"][i][1]) for i in range(3))
