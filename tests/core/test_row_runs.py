"""Every row of a sharded run (ablation sweeps, activation patching, trace sets) records the run that wrote it
and the digest of the token ids it was computed from; a resumed run refuses a row of another run (a
``config.json`` replaced by another run's, a row edited) or of other token ids, naming the file and the row."""

import json
import re
import shutil

import pytest

import lensprobe as lp
from lensprobe.core.storage.jsonable import prompt_ids_digest
from lensprobe.core.storage.rowfiles import row_line
from lensprobe.generation.traces.sets import trace_engine


@pytest.fixture(scope="module")
def prompts(tiny):
    with_filler = lp.build_prompt(tiny, "What is 3*4?", system="Reason.", filler=lp.Filler.meaningless(count=4))
    without = lp.build_prompt(tiny, "What is 3*4?", system="Reason.")
    return with_filler, without


def sweep(tiny, prompts, out, n):
    return lp.ablation_sweep(tiny, prompts[1], "entropy", heads=["L0H0", "L0H1"], batch_size=n, progress=False,
                             out=out)


def patch(tiny, prompts, out, n):
    return lp.patch(tiny, prompts[0], prompts[1], "blocks.0.hook_resid_post", segments="question",
                    metric="entropy" if n == 2 else "attention:system", out=out)


def traces(tiny, prompts, out, n):
    return lp.generation.trace_prompts(tiny, [prompts[1]], max_new_tokens=n, out=out)


RUNS = {"ablation sweep": sweep, "patch": patch, "trace set": traces}


def rows_of(out):
    return [json.loads(line) for p in sorted(out.glob("shard-rank*.jsonl")) for line in p.read_text().splitlines()]


def rewrite_first_row(out, **changes):
    path = next(iter(sorted(out.glob("shard-rank*.jsonl"))))
    lines = path.read_text().splitlines()
    row = json.loads(lines[0])
    row.pop("row_digest", None)
    lines[0] = row_line({**row, **changes}).rstrip("\n")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("kind", RUNS)
def test_every_row_records_its_run_and_token_ids(tiny, prompts, tmp_path, kind):
    RUNS[kind](tiny, prompts, tmp_path / "a", 2)
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    rows = rows_of(tmp_path / "a")
    assert rows and {r["run"] for r in rows} == {config["hash"]}
    want = prompt_ids_digest(*prompts) if kind == "patch" else prompt_ids_digest(prompts[1])
    assert {r["ids"] for r in rows} == {want}


@pytest.mark.parametrize("kind", RUNS)
def test_rows_under_another_runs_config_json_are_refused(tiny, prompts, tmp_path, kind):
    """A folder whose config.json was replaced by another run's (other settings): its rows are not that run's."""
    run = RUNS[kind]
    first = run(tiny, prompts, tmp_path / "a", 2)
    run(tiny, prompts, tmp_path / "b", 3)
    shutil.copy(tmp_path / "b" / "config.json", tmp_path / "a" / "config.json")
    with pytest.raises(lp.LensprobeError, match=r"shard-rank0\.jsonl line 1 \(unit .*\) records run '\w+', but the "
                       r"folder's config\.json is run '\w+': rows of another run are never adopted: use a new output "
                       "folder, or delete this one"):
        run(tiny, prompts, tmp_path / "a", 3)
    shutil.copy(tmp_path / "b" / "config.json", tmp_path / "a" / "config.json")  # still refused, never adopted
    with pytest.raises(lp.LensprobeError, match="never adopted"):
        run(tiny, prompts, tmp_path / "a", 3)
    assert first is not None


@pytest.mark.parametrize("kind", RUNS)
def test_a_row_edited_to_another_run_hash_is_refused(tiny, prompts, tmp_path, kind):
    run = RUNS[kind]
    run(tiny, prompts, tmp_path / "a", 2)
    path = rewrite_first_row(tmp_path / "a", run="0123456789abcdef")
    with pytest.raises(lp.LensprobeError, match=re.escape(f"{path} line 1 (unit ") + r".*records run "
                       r"'0123456789abcdef', but the folder's config\.json is run"):
        run(tiny, prompts, tmp_path / "a", 2)


@pytest.mark.parametrize("kind", RUNS)
def test_a_row_of_other_token_ids_is_refused(tiny, prompts, tmp_path, kind):
    run = RUNS[kind]
    run(tiny, prompts, tmp_path / "a", 2)
    path = rewrite_first_row(tmp_path / "a", ids=prompt_ids_digest([1, 2, 3]))
    with pytest.raises(lp.LensprobeError, match=re.escape(f"{path} line 1 (unit ") + r".*was computed from token "
                       r"ids with digest '\w+', but this run's are '\w+' \(another tokenizer or prompt\)"):
        run(tiny, prompts, tmp_path / "a", 2)


def test_a_trace_set_records_the_engine_that_ran(tiny, prompts, tmp_path):
    got = traces(tiny, prompts, tmp_path / "t", 2)
    config = json.loads((tmp_path / "t" / "config.json").read_text())
    ran = got[0].meta["engine"]
    assert ran in ("hf", "bridge") and config["settings"]["engine"] == "auto"
    assert config["parts"]["engine"]["name"] == ran == trace_engine(tiny, lp.GenerationConfig(max_new_tokens=2))
    assert [r["result"]["engine"] for r in rows_of(tmp_path / "t")] == [ran]
    bridge = lp.generation.trace_prompts(tiny, [prompts[1]], max_new_tokens=2, engine="bridge", out=tmp_path / "b")
    assert bridge[0].meta["engine"] == "bridge"
    assert json.loads((tmp_path / "b" / "config.json").read_text())["parts"]["engine"]["name"] == "bridge"
