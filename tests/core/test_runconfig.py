"""One settings file for every resumable run: ``config.json`` in one layout, written and checked by one
function (``lensprobe.core.storage.runconfig``), for evaluations, sweeps, patching and trace sets alike."""

import json

import pytest
from identities import old_folder, snapshot, two_files_folder

import lensprobe as lp
from lensprobe.core.storage.identity import IDENTITY_VERSION
from lensprobe.core.storage.jsonable import json_digest
from lensprobe.core.storage.runconfig import CONFIG_FILE, LAYOUT, open_run, read_run, run_hash
from lensprobe.core.storage.shards import ShardStore, run_sharded
from lensprobe.evals.problems.load import Problem
from lensprobe.evals.results.folder import read_config

LAYOUT_KEYS = ["layout", "kind", "hash", "settings", "parts", "labels", "digest"]
PROBLEMS = [Problem(id="q0", problem="What is 1+1?", answer="2", level=1, subject="S")]


def recorded(folder) -> dict:
    return json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))


@pytest.fixture
def prompt(tiny):
    return lp.build_prompt(tiny, "What is 3*4?", system="Please reason step by step.")


def test_every_kind_of_run_writes_the_same_layout(tiny, prompt, tmp_path):
    source = lp.build_prompt(tiny, "What is 5*6?", system="Please reason step by step.",
                             filler=lp.Filler.meaningless(count=5))
    lp.evaluate(tiny, PROBLEMS, "w/o", out=tmp_path / "eval", max_new_tokens=3, model_name="tiny", progress=False)
    lp.ablation_sweep(tiny, prompt, "entropy", heads=["L0H0"], progress=False, out=tmp_path / "sweep")
    lp.patch(tiny, source, prompt, ["blocks.0.hook_resid_post"], segments=["question"], metric="entropy",
             out=tmp_path / "patch")
    lp.generation.trace_prompts(tiny, [prompt], max_new_tokens=3, out=tmp_path / "traces")
    kinds = {}
    for name in ("eval", "sweep", "patch", "traces"):
        config = recorded(tmp_path / name)
        assert list(config) == LAYOUT_KEYS and config["layout"] == LAYOUT
        assert config["hash"] == run_hash(config["kind"], config["settings"])  # the hash is of what is written
        assert config["settings"]["identity"] == IDENTITY_VERSION
        assert config["settings"]["model"]["weights"] == recorded(tmp_path / "eval")["settings"]["model"]["weights"]
        assert not (tmp_path / name / "shards.json").exists()
        kinds[name] = config["kind"]
    assert kinds == {"eval": "evaluation", "sweep": "ablation sweep", "patch": "patch", "traces": "trace set"}
    evaluation = recorded(tmp_path / "eval")
    assert list(evaluation["parts"]) == ["w/o"] and evaluation["labels"] == {"model": "tiny"}
    assert {row["config_hash"] for row in lp.evals.load_results(tmp_path / "eval").to_dict("records")} == \
        {evaluation["hash"]}
    assert all(recorded(tmp_path / name)["parts"] == {} for name in ("sweep", "patch"))
    assert list(recorded(tmp_path / "traces")["parts"]) == ["engine"]  # the engine that ran, "auto" resolved


def test_one_check_lists_every_setting_that_differs_nested(tmp_path):
    settings = {"identity": IDENTITY_VERSION, "generation": {"max_new_tokens": 16, "seed": 0},
                "interventions": [{"c": 0.1}, {"c": 0.2}]}
    first = open_run(tmp_path, "evaluation", settings, parts={"w/o": {"hash": "a"}}, labels={"model": "m"})
    before = snapshot(tmp_path)
    other = {**settings, "generation": {"max_new_tokens": 32, "seed": 1}, "interventions": [{"c": 0.1}, {"c": 0.3}]}
    with pytest.raises(lp.LensprobeError) as err:
        open_run(tmp_path, "evaluation", other)
    assert str(err.value).splitlines() == [
        f"{tmp_path} holds results of another 'evaluation' run:",
        "  generation.max_new_tokens: folder has 16, this run has 32",
        "  generation.seed: folder has 0, this run has 1",
        "  interventions.1.c: folder has 0.2, this run has 0.3",
        "Use a new output folder, or delete this one to start over."]
    with pytest.raises(lp.LensprobeError, match="holds results of an 'evaluation' run, this is a 'patch' run"):
        open_run(tmp_path, "patch", settings)
    with pytest.raises(lp.LensprobeError, match=r"condition 'w/o' with a different definition:\n  prompt: folder has "
                                                r"'<missing>', this run has 'x'\nRename the condition"):
        open_run(tmp_path, "evaluation", settings, parts={"w/o": {"hash": "b", "prompt": "x"}}, part_name="condition")
    assert snapshot(tmp_path) == before  # a refused run changes nothing
    # the same settings resume: the folder is left as it was; a new part joins it, after the earlier ones
    assert open_run(tmp_path, "evaluation", {**settings, "generation": {"seed": 0, "max_new_tokens": 16.0}}) == first
    assert snapshot(tmp_path) == before
    grown = open_run(tmp_path, "evaluation", settings, parts={"w/ Mful": {"hash": "c"}}, labels={"model": "renamed"})
    assert list(grown["parts"]) == ["w/o", "w/ Mful"] and grown["labels"] == {"model": "m"}  # labels of the first run
    assert recorded(tmp_path) == {**grown, "digest": json_digest(grown)} and grown["hash"] == first["hash"]


def test_rows_without_their_settings_file_are_refused_for_every_kind(tmp_path):
    with ShardStore(tmp_path / "s", "demo", {"v": 1}) as store:
        store.record("a", 1.0)
    (tmp_path / "s" / CONFIG_FILE).unlink()
    rows = (tmp_path / "s" / "shard-rank0.jsonl").read_bytes()
    with pytest.raises(lp.LensprobeError, match=r"holds result rows \(shard-rank0\.jsonl line 1, \.\.\.\) but no "
                                                r"config\.json: .* neither counted nor resumed"):
        run_sharded(["a", "b"], len, out=tmp_path / "s", kind="demo", settings={"v": 2})
    assert not (tmp_path / "s" / CONFIG_FILE).exists() and (tmp_path / "s" / "shard-rank0.jsonl").read_bytes() == rows
    with pytest.raises(lp.LensprobeError, match="holds no config.json: is it an evaluation output folder"):
        read_config(tmp_path / "empty")


def test_a_folder_of_another_kind_is_named_when_read(tiny, prompt, tmp_path):
    lp.ablation_sweep(tiny, prompt, "entropy", heads=["L0H0"], progress=False, out=tmp_path / "sweep")
    with pytest.raises(lp.LensprobeError, match=r"holds an 'ablation sweep' run, not an 'evaluation'"):
        lp.evals.load_results(tmp_path / "sweep")
    with pytest.raises(lp.LensprobeError, match="holds results of an 'ablation sweep' run, this is an 'evaluation' run"):
        lp.evaluate(tiny, PROBLEMS, "w/o", out=tmp_path / "sweep", max_new_tokens=3, progress=False)
    assert read_run(tmp_path / "sweep")["kind"] == "ablation sweep"


@pytest.mark.parametrize("damage", ["[1, 2]", '{"layout": 1, "kind": "demo", '])
def test_a_damaged_settings_file_is_refused_with_the_fix(tmp_path, damage):
    run_sharded(["a"], len, out=tmp_path, kind="demo", settings={"v": 1})
    (tmp_path / CONFIG_FILE).write_text(damage, encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match=r"config\.json (is not|lacks).*use a new output folder, or delete this "
                                                "one to start over"):
        run_sharded(["a"], len, out=tmp_path, kind="demo", settings={"v": 1})


def test_a_settings_file_edited_or_without_its_digest_is_refused(tmp_path):
    """config.json is checked whole: an edit anywhere (here a label, never compared) breaks its digest; a file
    without one is an older lensprobe's. Neither message offers a repair that could adopt another run's rows."""
    run_sharded(["a"], len, out=tmp_path, kind="demo", settings={"v": 1})
    config = recorded(tmp_path)
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**config, "labels": {"model": "x"}}), encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match=r"config\.json does not match its digest: it was edited or damaged "
                                                r"since it was written.*Use a new output folder, or delete this one"):
        run_sharded(["a"], len, out=tmp_path, kind="demo", settings={"v": 1})
    del config["digest"]
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match=r"config\.json has no digest of its content: it was written by an "
                                                r"older lensprobe.*Rerun into a new output folder") as refused:
        read_run(tmp_path)
    assert "copy" not in str(refused.value)


def test_a_settings_file_of_another_layout_is_refused(tmp_path):
    config = open_run(tmp_path, "demo", {"v": 1})
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**config, "layout": LAYOUT + 1}), encoding="utf-8")
    with pytest.raises(lp.LensprobeError, match=rf"older lensprobe \(config\.json of another layout; this lensprobe "
                                                rf"writes layout {LAYOUT}\).*Rerun into a new output folder"):
        open_run(tmp_path, "demo", {"v": 1})


def test_folders_of_the_two_files_layout_are_refused_with_why(tiny, prompt, tmp_path):
    sweep = two_files_folder("sweep", tmp_path)
    before = snapshot(sweep)
    with pytest.raises(lp.LensprobeError, match=r"written by an older lensprobe, which kept a run's settings in "
                                                r"shards\.json; this lensprobe keeps every run's in config\.json "
                                                r"\(layout 1\).*Rerun into a new output folder"):
        lp.ablation_sweep(tiny, prompt, "entropy", heads=["L0H0", "L0H1"], progress=False, out=sweep)
    assert snapshot(sweep) == before
    evaluation = two_files_folder("eval", tmp_path)
    before = snapshot(evaluation)
    with pytest.raises(lp.LensprobeError, match=r"older lensprobe \(config\.json of an older layout.*Rerun into a new "
                                                "output folder"):
        lp.evaluate(tiny, PROBLEMS, "w/o", out=evaluation, max_new_tokens=3, progress=False)
    assert snapshot(evaluation) == before
    assert read_config(evaluation)["kind"] == "evaluation"
    with pytest.raises(lp.LensprobeError, match=r"results-rank0\.jsonl line 1 has no row_digest: it was written by an "
                                                r"older lensprobe.*Rerun into a new output folder"):
        lp.evals.load_results(evaluation)  # its rows cannot be checked whole: refused, never counted


def test_repr_era_folders_still_get_the_identity_message(tiny, prompt, tmp_path):
    sweep = old_folder("sweep", tmp_path)
    with pytest.raises(lp.LensprobeError, match=r"identified runs by repr\(\) and the model's name"):
        lp.ablation_sweep(tiny, prompt, "entropy", heads=["L0H0", "L0H1"], progress=False, out=sweep)
