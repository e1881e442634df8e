"""Evaluations resume only a folder of the same run, identified by content: a condition whose intervention
differs only where its repr cannot tell is refused, settings that do not change results (batch size) are
not part of the identity, and a folder the previous format wrote is refused."""

import json

import pytest
from identities import AddRow, Shift, old_folder, snapshot, two_tables

import lensprobe as lp
from lensprobe.evals.problems.load import Problem

PROBLEMS = [Problem(id="q0", problem="What is 1+1?", answer="2", level=1, subject="S")]


def run(tiny, conditions, out, **settings):
    return lp.evaluate(tiny, PROBLEMS, conditions, out=out, max_new_tokens=3, progress=False, **settings)


def test_a_condition_of_another_intervention_is_refused(tiny, tmp_path):
    a, b = two_tables()
    first = run(tiny, [lp.Condition("steered", interventions=(AddRow(a),))], tmp_path)
    again = run(tiny, [lp.Condition("steered", interventions=(AddRow(a.clone()),))], tmp_path)
    assert list(again["generation"]) == list(first["generation"])  # same content: resumed
    before = snapshot(tmp_path)
    with pytest.raises(lp.LensprobeError, match=r"generation.batch_size: folder has \d+, this run has 3"):
        run(tiny, [lp.Condition("steered", interventions=(AddRow(a.clone()),))], tmp_path, batch_size=3)
    with pytest.raises(lp.LensprobeError, match="already holds condition 'steered' with a different definition"):
        run(tiny, [lp.Condition("steered", interventions=(AddRow(b),))], tmp_path)
    with pytest.raises(lp.LensprobeError, match="already holds condition 'steered' with a different definition"):
        run(tiny, [lp.Condition("steered", interventions=(Shift(0.5),))], tmp_path)
    assert snapshot(tmp_path) == before


def test_the_model_name_is_a_label_beside_the_identity(tiny, tmp_path):
    run(tiny, "w/o", tmp_path, model_name="mine")
    run(tiny, "w/o", tmp_path, model_name="renamed")  # the same weights: the same run
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["labels"] == {"model": "mine"} and "name" not in config["settings"]["model"]
    assert config["settings"]["identity"] == 2 and len(config["settings"]["model"]["weights"]) == 16


def test_an_evaluation_of_the_previous_format_is_refused_with_why(tiny, tmp_path):
    old = old_folder("eval", tmp_path)
    before = snapshot(old)
    with pytest.raises(lp.LensprobeError, match=r"written by an older lensprobe, which identified runs by repr\(\) "
                                                r"and the model's name.*Rerun into a new output folder"):
        run(tiny, "w/o", old)
    assert snapshot(old) == before
    with pytest.raises(lp.LensprobeError, match="has no row_digest: it was written by an older lensprobe"):
        lp.evals.load_results(old)  # its rows carry no digest of their content: never taken as numbers
    assert snapshot(old) == before


class Opaque:
    """An intervention with no attributes to describe it by (slots) and no declared identity."""

    __slots__ = ("by",)

    def __init__(self, by: float):
        self.by = by

    def hooks(self, model):
        return [("blocks.0.hook_resid_post", lambda act, hook: act + self.by)]


def test_what_cannot_be_identified_is_refused_for_a_folder_and_runs_in_memory(tiny, tmp_path):
    cond = lp.Condition("opaque", interventions=(Opaque(0.5),))
    with pytest.raises(lp.LensprobeError, match=r"cannot identify .*Opaque at condition 'opaque' "
                                                r"interventions\[0\]: .*__lensprobe_identity__"):
        run(tiny, [cond], tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing left behind
    rows = lp.evaluate(tiny, PROBLEMS, [cond], max_new_tokens=3, progress=False)  # nothing to resume: it runs
    assert len(rows) == 1 and rows["config_hash"].isna().all()
