"""Sharding in one process: rank 1 then rank 0 of a two-process run (the library and the sweep and
trace commands) merge into the single-process result bit for bit, reruns compute nothing, and bad
folders, ranks and stalls fail clearly."""

import json

import pytest
import torch

import lensprobe as lp
import lensprobe.core.storage.shards as shards
from lensprobe.core.storage.rowfiles import read_row_file
from lensprobe.core.storage.shards import (
    ShardStore,
    check_shard,
    my_units,
    run_sharded,
    shard_info,
)
from lensprobe.core.storage.store import atomic_file, atomic_write_json
from lensprobe.generation.loop import trace_generation

SHARD_VARS = ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE")


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    for var in SHARD_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def prompts(tiny):
    system = "Please reason step by step."
    return [lp.build_prompt(tiny, "What is 12+7?", system=system, filler=lp.Filler.meaningless(count=5)),
            lp.build_prompt(tiny, "What is 3*4?", system=system, filler=lp.Filler.meaningless(count=5)),
            lp.build_prompt(tiny, "What is 3*4?", system=system)]


def shard_units(path) -> dict:
    """The units in one rank's shard file: unit -> result."""
    return {row["unit"]: row["result"] for _, row in read_row_file(path)}


def mtimes(folder) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


# ----- the unit logic -------------------------------------------------------------------------
def test_my_units_takes_every_nth_unit_from_its_rank():
    units = [f"u{i}" for i in range(10)]
    for world in (1, 3, 4, 12):
        shares = [my_units(units, r, world) for r in range(world)]
        for r, share in enumerate(shares):
            assert share == [u for i, u in enumerate(units) if i % world == r]
        assert sorted(u for share in shares for u in share) == sorted(units)  # each unit exactly once
    with pytest.raises(lp.LensprobeError, match="bad shard: rank 2 of world size 2"):
        my_units(units, 2, 2)


def test_shard_info_reads_torchrun_then_mpi_variables(monkeypatch):
    assert shard_info() == (0, 1)
    monkeypatch.setenv("PMI_RANK", "2")
    monkeypatch.setenv("PMI_SIZE", "3")
    assert shard_info() == (2, 3)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert shard_info() == (1, 4)  # torchrun's variables win
    assert check_shard(None, None, "out") == (1, 4)
    assert check_shard(0, 1, None) == (0, 1)  # explicit values win over the environment
    with pytest.raises(lp.LensprobeError, match=r"needs an output folder \(out=...\)"):
        check_shard(None, None, None)
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(lp.LensprobeError, match="RANK='one' / WORLD_SIZE='4' are not integers"):
        shard_info()
    assert lp.evals.running.harness.shard_info is shards.shard_info  # its old home still works


def test_ranks_merge_into_the_single_run_and_a_rerun_computes_nothing(tmp_path):
    units = [f"u{i}" for i in range(7)]
    calls: list[str] = []

    def compute(unit: str) -> dict:
        calls.append(unit)
        return {"square": int(unit[1:]) ** 2, "third": int(unit[1:]) / 3}

    expected = {u: {"square": i * i, "third": i / 3} for i, u in enumerate(units)}
    part = run_sharded(units, compute, out=tmp_path, kind="demo", settings={"v": 1}, rank=1, world_size=2)
    assert part == {u: expected[u] for u in ("u1", "u3", "u5")}
    merged = run_sharded(units, compute, out=tmp_path, kind="demo", settings={"v": 1}, rank=0, world_size=2)
    assert merged == expected and list(merged) == units
    assert sorted(calls) == sorted(units)  # every unit computed once, by one rank
    assert shard_units(tmp_path / "shard-rank1.jsonl") == part

    before, n_calls = mtimes(tmp_path), len(calls)
    again = run_sharded(units, compute, out=tmp_path, kind="demo", settings={"v": 1}, rank=0, world_size=1)
    assert again == expected and len(calls) == n_calls and mtimes(tmp_path) == before
    assert run_sharded(units, compute, out=None, kind="demo", settings={}) == expected  # in memory


def test_a_folder_of_another_run_is_refused(tmp_path):
    run_sharded(["a"], len, out=tmp_path, kind="demo", settings={"v": 1, "w": [1, 2]})
    run_sharded(["a"], len, out=tmp_path, kind="demo", settings={"v": 1, "w": (1, 2)})  # same as JSON
    with pytest.raises(lp.LensprobeError, match=r"another 'demo' run:\n  v: folder has 1, this run has 2\nUse a new output folder"):
        run_sharded(["a"], len, out=tmp_path, kind="demo", settings={"v": 2, "w": [1, 2]})
    with pytest.raises(lp.LensprobeError, match="holds results of a 'demo' run, this is a 'sweep' run"):
        run_sharded(["a"], len, out=tmp_path, kind="sweep", settings={"v": 1, "w": [1, 2]})
    with pytest.raises(lp.LensprobeError, match="unit names must be unique"):
        run_sharded(["a", "a"], len, out=tmp_path, kind="demo", settings={"v": 1, "w": [1, 2]})


def test_rank_0_names_the_ranks_that_stall(tmp_path):
    units = [f"u{i}" for i in range(5)]
    run_sharded(units, len, out=tmp_path, kind="demo", settings={}, rank=2, world_size=3)  # rank 1 never runs
    with pytest.raises(lp.LensprobeError, match=r"rank 1 of 3 did not finish 2 unit\(s\) \(e.g. 'u1'\)"):
        run_sharded(units, len, out=tmp_path, kind="demo", settings={}, rank=0, world_size=3, stall_timeout=0.1)


def test_one_rank_is_run_by_one_process_at_a_time(tmp_path):
    with ShardStore(tmp_path, "demo", {}, rank=0):
        with pytest.raises(lp.LensprobeError, match="rank 0 of .* is being run by another process"):
            ShardStore(tmp_path, "demo", {}, rank=0)
        ShardStore(tmp_path, "demo", {}, rank=1).close()  # another rank is fine
    ShardStore(tmp_path, "demo", {}, rank=0).close()  # released on exit


def test_atomic_file_leaves_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "r.json"
    atomic_write_json(path, {"a": 0.1})
    with pytest.raises(RuntimeError, match="disk gone"), atomic_file(path) as tmp:
        tmp.write_text('{"a": 0.')
        raise RuntimeError("disk gone")
    assert json.loads(path.read_text()) == {"a": 0.1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left
    run_sharded(["b"], len, out=tmp_path, kind="demo", settings={})
    (tmp_path / "shard-rank0.jsonl").write_text('{"unit": "a", "result": 1\n')  # edited by hand
    with pytest.raises(lp.LensprobeError, match="shard-rank0.jsonl line 1 is not valid JSON"):
        run_sharded(["a"], len, out=tmp_path, kind="demo", settings={})


# ----- the entry points ---------------------------------------------------------------------
def test_sharded_sweep_equals_the_single_run_bit_for_bit(tiny, prompts, tmp_path):
    kw = dict(metric="entropy", batch_size=3, progress=False)
    single = lp.ablation_sweep(tiny, prompts[:2], **kw)
    part = lp.ablation_sweep(tiny, prompts[:2], **kw, out=tmp_path, rank=1, world_size=2)
    merged = lp.ablation_sweep(tiny, prompts[:2], **kw, out=tmp_path, rank=0, world_size=2)
    assert torch.equal(merged.baseline, single.baseline) and torch.equal(merged.ablated, single.ablated)
    assert merged.table.equals(single.table)
    # 8 heads + the baseline row in batches of 3: units (prompt, batch) 0..5, rank 1 has 1, 3, 5
    rows = [None, *sorted(single.heads)]
    for p in range(2):
        for k, head in enumerate(rows):
            mine = (p * 3 + k // 3) % 2 == 1
            value = part.baseline[p] if head is None else part.ablated[p, single.heads.index(head)]
            want = single.baseline[p] if head is None else single.ablated[p, single.heads.index(head)]
            assert (torch.equal(value, want) if mine else bool(value.isnan())), (p, head)

    before = mtimes(tmp_path)
    again = lp.ablation_sweep(tiny, prompts[:2], **kw, out=tmp_path)
    assert torch.equal(again.ablated, single.ablated) and mtimes(tmp_path) == before  # nothing recomputed
    with pytest.raises(lp.LensprobeError, match="batch_size: folder has 3, this run has 4"):
        lp.ablation_sweep(tiny, prompts[:2], "entropy", batch_size=4, progress=False, out=tmp_path)
    with pytest.raises(lp.LensprobeError, match="needs an output folder"):
        lp.ablation_sweep(tiny, prompts[:2], **kw, rank=0, world_size=2)


def test_sharded_patch_equals_the_single_run(tiny, prompts, tmp_path):
    source = lp.build_prompt(tiny, "What is 5*6?", system="Please reason step by step.",
                             filler=lp.Filler.meaningless(count=5))
    hooks = ["blocks.0.hook_resid_post", "blocks.0.attn.hook_z"]
    kw = dict(segments=["question", "system"], metric="logprob", answer="12")

    def run(**more):
        return lp.patch(tiny, source, prompts[2], hooks, **kw, **more)

    single = run(out=tmp_path / "single").to_dataframe()
    part = run(out=tmp_path / "sharded", rank=1, world_size=2)
    merged = run(out=tmp_path / "sharded", rank=0, world_size=2)
    assert merged.to_dataframe().equals(single)  # the same two-row forward per site: bit for bit
    assert list(part.to_dataframe()["site"]) == list(single["site"][1::2])  # sites 1 and 3 of 0..4
    # Without out all sites share one batch: the same numbers up to float rounding of the batch size.
    batched = run().to_dataframe()
    assert list(batched["site"]) == list(single["site"]) and len(single) == 5  # 4 sites + all at once
    for col in ("clean", "patched", "change", "kl"):
        torch.testing.assert_close(torch.tensor(single[col].values), torch.tensor(batched[col].values),
                                   atol=2e-5, rtol=1e-5)
    assert single["change"].abs().max() > 1e-3 and single["kl"].max() > 1e-5  # patching matters here


def test_sharded_trace_set_equals_one_trace_per_prompt(tiny, prompts, tmp_path):
    kw = dict(max_new_tokens=6, track={"system": "system"})
    part = lp.generation.trace_prompts(tiny, prompts, out=tmp_path, rank=1, world_size=2, **kw)
    merged = lp.generation.trace_prompts(tiny, prompts, out=tmp_path, rank=0, world_size=2, **kw)
    assert list(part) == [1] and list(merged) == [0, 1, 2]
    for i, p in enumerate(prompts):
        want = trace_generation(tiny, p, **kw)
        got = merged[i]
        assert torch.equal(got.token_ids_rows, want.token_ids_rows) and got.texts == want.texts
        assert torch.equal(got.entropy_rows, want.entropy_rows)
        assert torch.equal(got.attention_rows["system"], want.attention_rows["system"])
        assert torch.equal(lp.generation.load_trace(tmp_path / f"traces/trace-{i:05d}.parquet").entropy_rows, want.entropy_rows)
    assert torch.equal(part[1].entropy_rows, merged[1].entropy_rows)

    before = mtimes(tmp_path)
    again = lp.generation.trace_prompts(tiny, prompts, out=tmp_path, **kw)
    assert mtimes(tmp_path) == before and torch.equal(again[2].entropy_rows, merged[2].entropy_rows)
    with pytest.raises(lp.LensprobeError, match="generation.max_new_tokens: folder has 6, this run has 7"):
        lp.generation.trace_prompts(tiny, prompts, out=tmp_path, max_new_tokens=7, track={"system": "system"})
    named = lp.generation.trace_prompts(tiny, {"sum": prompts[0], "product": prompts[2]}, **kw)  # in memory
    assert list(named) == ["sum", "product"] and named["product"].texts == merged[2].texts
    with pytest.raises(lp.LensprobeError, match="needs an output folder"):
        lp.generation.trace_prompts(tiny, prompts, rank=1, world_size=2, **kw)


# ----- the commands -----------------------------------------------------------------------------
def test_sweep_and_trace_commands_take_their_share_from_the_environment(tiny, tmp_path, monkeypatch, capsys):
    from lensprobe.app.cli import main

    for command in ("heads", "trace"):
        monkeypatch.setattr(f"lensprobe.app.commands.{command}.load_cli_model", lambda name: tiny)
    sweep = ["sweep", "--question", "What is 12+7?", "--question", "What is 3*4?", "--heads-per-forward", "4"]
    # "/" is one token of the tiny vocabulary: the thinking settings use it, the model is not changed
    trace = ["trace", "--question", "What is 2+3?", "--max-new-tokens", "5", "--think", "fusion,pause,none",
             "--token", "/", "--schedule", "every:2"]
    for args in (sweep, trace):
        assert main([*args, "--out", str(tmp_path / f"{args[0]}-single")]) == 0
        for rank in ("1", "0"):
            monkeypatch.setenv("RANK", rank)
            monkeypatch.setenv("WORLD_SIZE", "2")
            assert main([*args, "--out", str(tmp_path / f"{args[0]}-sharded")]) == 0
            if rank == "1":
                assert "rank 1 of 2" in capsys.readouterr().out
                assert not (tmp_path / f"{args[0]}-sharded" / "summary.csv").exists()
        monkeypatch.delenv("RANK")
        monkeypatch.delenv("WORLD_SIZE")
    single, sharded = tmp_path / "sweep-single", tmp_path / "sweep-sharded"
    assert (sharded / "sweep.csv").read_text() == (single / "sweep.csv").read_text()
    units = shard_units(sharded / "shards" / "shard-rank1.jsonl")
    assert sorted(units) == ["prompt 0 batch 1", "prompt 1 batch 0", "prompt 1 batch 2"]  # of 2 x 3 units
    single, sharded = tmp_path / "trace-single", tmp_path / "trace-sharded"
    assert (sharded / "summary.csv").read_text() == (single / "summary.csv").read_text()
    for name in ("trace-pause.parquet", "trace-latentfusion-alpha-0-6.parquet", "trace-no-thinking.parquet"):
        a, b = lp.generation.load_trace(single / name), lp.generation.load_trace(sharded / name)
        assert torch.equal(a.entropy_rows, b.entropy_rows) and a.texts == b.texts
    assert lp.generation.load_trace(single / "trace-pause.parquet").thinking.any()  # the thinking settings did think
    assert {u: r["file"] for u, r in shard_units(sharded / "shards" / "shard-rank1.jsonl").items()} == {
        "Pause": "traces/trace-00001.parquet"}
