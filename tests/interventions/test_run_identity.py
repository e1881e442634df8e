"""Ablation sweeps and patching resume only a folder of the same run, identified by content: a run whose
intervention or metric differs only where its repr cannot tell is refused, and so is a folder the previous
format wrote."""

import pytest
from identities import AddRow, Shift, logprob_of, old_folder, snapshot, two_tables

import lensprobe as lp

SYSTEM = "Please reason step by step."


@pytest.fixture(scope="module")
def prompts(tiny):
    return (lp.build_prompt(tiny, "What is 3*4?", system=SYSTEM),
            lp.build_prompt(tiny, "What is 5*6?", system=SYSTEM, filler=lp.Filler.meaningless(count=5)))


def sweep(tiny, prompt, out, **kw):
    return lp.ablation_sweep(tiny, prompt, kw.pop("metric", "entropy"), heads=["L0H0", "L0H1"], progress=False,
                             out=out, **kw)


def test_a_sweep_of_another_intervention_or_metric_is_refused(tiny, prompts, tmp_path):
    a, b = two_tables()
    first = sweep(tiny, prompts[0], tmp_path / "t", interventions=[AddRow(a)])
    again = sweep(tiny, prompts[0], tmp_path / "t", interventions=[AddRow(a.clone())])  # the same content resumes
    assert again.table.equals(first.table)
    before = snapshot(tmp_path / "t")
    with pytest.raises(lp.LensprobeError, match=r"\n  interventions\.0\.\S+: folder has "):
        sweep(tiny, prompts[0], tmp_path / "t", interventions=[AddRow(b)])
    sweep(tiny, prompts[0], tmp_path / "s", interventions=[Shift(0.5)])
    with pytest.raises(lp.LensprobeError, match=r"\n  interventions\.0\.\S+: folder has "):
        sweep(tiny, prompts[0], tmp_path / "s", interventions=[Shift(0.25)])
    sweep(tiny, prompts[0], tmp_path / "m", metric=logprob_of(3))
    with pytest.raises(lp.LensprobeError, match=r"metric\.closure\.token_id: folder has 3, this run has 4"):
        sweep(tiny, prompts[0], tmp_path / "m", metric=logprob_of(4))
    assert snapshot(tmp_path / "t") == before


def test_a_patch_of_another_metric_is_refused(tiny, prompts, tmp_path):
    def run(metric, out):
        return lp.patch(tiny, prompts[1], prompts[0], ["blocks.0.hook_resid_post"], segments=["question"],
                        metric=metric, out=out)

    first = run(logprob_of(3), tmp_path)
    assert run(logprob_of(3), tmp_path).to_dataframe().equals(first.to_dataframe())
    before = snapshot(tmp_path)
    with pytest.raises(lp.LensprobeError, match=r"metric\.closure\.token_id: folder has 3, this run has 4"):
        run(logprob_of(4), tmp_path)
    assert snapshot(tmp_path) == before


def test_folders_of_the_previous_format_are_refused_with_why(tiny, prompts, tmp_path):
    old = old_folder("sweep", tmp_path)
    before = snapshot(old)
    with pytest.raises(lp.LensprobeError, match=r"written by an older lensprobe, which identified runs by repr\(\) "
                                                r"and the model's name.*Rerun into a new output folder"):
        sweep(tiny, prompts[0], old)
    assert snapshot(old) == before  # nothing reused, nothing recomputed into it
    old = old_folder("patch", tmp_path)
    before = snapshot(old)
    with pytest.raises(lp.LensprobeError, match="written by an older lensprobe.*not reused"):
        lp.patch(tiny, prompts[1], prompts[0], ["blocks.0.hook_resid_post"], segments=["question"],
                 metric="entropy", out=old)
    assert snapshot(old) == before
