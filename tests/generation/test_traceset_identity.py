"""Trace sets resume only a folder of the same run, identified by content: interventions that differ only
where their repr cannot tell are refused, and so is a folder the previous format wrote."""

import pytest
from identities import AddRow, Shift, old_folder, snapshot, two_tables

import lensprobe as lp


@pytest.fixture(scope="module")
def prompt(tiny):
    return lp.build_prompt(tiny, "What is 3*4?", system="Please reason step by step.")


def test_a_trace_set_of_another_intervention_is_refused(tiny, prompt, tmp_path):
    a, b = two_tables()
    first = lp.generation.trace_prompts(tiny, [prompt], max_new_tokens=3, interventions=[AddRow(a)], out=tmp_path / "t")
    again = lp.generation.trace_prompts(tiny, [prompt], max_new_tokens=3, interventions=[AddRow(a.clone())], out=tmp_path / "t")
    assert again[0].texts == first[0].texts
    before = snapshot(tmp_path / "t")
    with pytest.raises(lp.LensprobeError, match=r"\n  interventions\.0\.\S+: folder has "):
        lp.generation.trace_prompts(tiny, [prompt], max_new_tokens=3, interventions=[AddRow(b)], out=tmp_path / "t")
    assert snapshot(tmp_path / "t") == before
    lp.generation.trace_prompts(tiny, [prompt], max_new_tokens=3, interventions=[Shift(0.5)], out=tmp_path / "s")
    with pytest.raises(lp.LensprobeError, match=r"\n  interventions\.0\.\S+: folder has "):
        lp.generation.trace_prompts(tiny, [prompt], max_new_tokens=3, interventions=[Shift(0.25)], out=tmp_path / "s")


def test_a_trace_set_of_the_previous_format_is_refused_with_why(tiny, prompt, tmp_path):
    old = old_folder("traces", tmp_path)
    before = snapshot(old)
    with pytest.raises(lp.LensprobeError, match=r"written by an older lensprobe.*identity rule 2.*new output folder"):
        lp.generation.trace_prompts(tiny, [prompt], max_new_tokens=3, out=old)
    assert snapshot(old) == before
