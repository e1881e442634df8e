"""Verifying an attribution by exact ablation: every exact value equals a single lp.ablate_heads run
under the attribution's settings; agreement statistics by hand."""

import pytest
import torch

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.core.measures.measure import NextTokenEntropy, measure_once
from lensprobe.experiments.attribution import attribute_heads
from lensprobe.experiments.verify import agreement, verify_attribution


@pytest.fixture(scope="module")
def prompts(tiny):
    a = lp.build_prompt(tiny, "What is 12+7?", system="Please reason step by step.",
                        filler=lp.Filler.meaningless(count=5))
    b = lp.build_prompt(tiny, "What is 3*4?", system="Please reason step by step.")
    return [a, b]


def single(model, prompt, ablation):
    return float(measure_once(model, NextTokenEntropy(), prompt, ablation)[0] - measure_once(model, NextTokenEntropy(), prompt)[0])


def test_exact_values_equal_single_ablations(tiny, prompts):
    ref = prompts[1]
    att = attribute_heads(tiny, prompts, "entropy", method="atp*", ablation="mean", reference=[ref],
                          positions=slice(4, None))
    ver = verify_attribution(tiny, prompts, "entropy", att, top=3, sample=2, seed=1, batch_size=2)
    assert list(ver.table["chosen"]) == ["top"] * 3 + ["sample"] * 2
    top3 = att.top(3)["head_label"].tolist()
    assert ver.table["head_label"].tolist()[:3] == top3
    assert ver.table["exact"].abs().max() > 1e-4
    for row in ver.table.itertuples():
        want = sum(single(tiny, p, lp.ablate_heads([(row.layer, row.head)], method="mean", reference=[ref],
                                                     positions=slice(4, None))) for p in prompts) / 2
        # abs: the float32 rounding of two entropies of several nats, computed in a batch of two rows
        # here and one row alone there (about 1e-6; the smallest exact values are near 3e-4)
        assert row.exact == pytest.approx(want, rel=1e-3, abs=1e-5)
        assert row.error == pytest.approx(row.estimate - row.exact)


def test_kv_groups_verified_with_group_ablations(tiny, prompts):
    att = attribute_heads(tiny, prompts[0], "entropy", unit="kv")
    ver = verify_attribution(tiny, prompts[0], "entropy", att, top=None)
    for row in ver.table.itertuples():
        want = single(tiny, prompts[0], lp.interventions.ablate_kv_group((row.layer, row.kv_head)))
        assert row.exact == pytest.approx(want, rel=1e-4, abs=1e-7)


def test_agreement_by_hand():
    estimate = torch.tensor([3.0, -1.0, 0.5, 2.0])
    exact = torch.tensor([2.5, -0.2, -3.0, 1.0])
    got = agreement(estimate, estimate.abs(), exact, 2)
    # top-2 by score: units 0, 3; by |exact|: units 2, 0 -> recall 1/2
    assert got["recall"] == 0.5
    # ranks: estimate (4, 1, 2, 3), exact (4, 2, 1, 3): d^2 = 0+1+1+0 -> 1 - 6*2/(4*15) = 0.8
    assert got["spearman"] == pytest.approx(0.8)
    # |estimate| ranks (4, 2, 1, 3), |exact| ranks (3, 1, 4, 2): d^2 = 1+1+9+1 -> 1 - 6*12/60 = -0.2
    assert got["spearman_abs"] == pytest.approx(-0.2)


def test_misses_are_sampled_heads_that_beat_the_top(tiny, prompts):
    att = attribute_heads(tiny, prompts[0], "entropy")
    exact = lp.ablation_sweep(tiny, prompts[0], "entropy", progress=False).changes[0]
    ver = verify_attribution(tiny, prompts[0], "entropy", att, top=2, sample=6)
    cut = exact.abs().sort(descending=True).values[1]  # all 8 heads verified: the 2nd largest |exact|
    want = {lbl for i, lbl in enumerate(att.labels) if abs(float(exact[i])) >= cut}
    assert set(ver.misses["head_label"]) == want - set(att.top(2)["head_label"])
    assert ver.recall == pytest.approx(1 - len(ver.misses) / 2)
    with pytest.raises(LensprobeError, match="same prompts"):
        verify_attribution(tiny, prompts, "entropy", att)
    with pytest.raises(LensprobeError, match="top must be"):
        verify_attribution(tiny, prompts[0], "entropy", att, top=0)


def test_recall_is_never_stated_where_it_cannot_be_known(tiny, prompts):
    """The top candidates alone always agree with themselves: recall over them is 1.00 by construction."""
    att = attribute_heads(tiny, prompts[0], "entropy")
    exact = lp.ablation_sweep(tiny, prompts[0], "entropy", progress=False).changes[0]
    alone = verify_attribution(tiny, prompts[0], "entropy", att, top=3, sample=0)
    assert alone.recall_kind == "unknown" and alone.recall != alone.recall  # nan
    assert "recall 1.00" not in alone.summary()
    assert "top-3 recall not measured: none of the 5 heads outside the top 3 was checked" in alone.summary()
    # a random sample of the rest: a lower bound estimated from the share that beats the weakest candidate
    some = verify_attribution(tiny, prompts[0], "entropy", att, top=3, sample=3, seed=2)
    picked = list(att.top(3)["head_label"])
    weakest = min(abs(float(exact[att.labels.index(lbl)])) for lbl in picked)
    sampled = some.table[some.table["chosen"] == "sample"]["head_label"]
    beat = sum(abs(float(exact[att.labels.index(lbl)])) > weakest for lbl in sampled)
    low, high = lp.evals.wilson_interval(beat, 3)
    assert some.recall_kind == "sampled" and (some.sampled, some.outside, some.beat) == (3, 5, beat)
    assert some.recall == pytest.approx(min(1.0, max(0.0, 1 - (beat / 3) * 5 / 3)))
    assert some.recall_low == pytest.approx(min(1.0, max(0.0, 1 - high * 5 / 3)))
    assert some.recall_high == pytest.approx(min(1.0, max(0.0, 1 - low * 5 / 3)))
    assert f"from 3 random heads of the 5 outside the top 3, {beat} of which beat a top candidate" in some.summary()
    # every head verified: the true top-3 is known, and the recall is exact
    full = verify_attribution(tiny, prompts[0], "entropy", att, top=3, sample=5)
    truth = set(torch.argsort(exact.abs(), descending=True, stable=True)[:3].tolist())
    chosen = {att.labels.index(lbl) for lbl in picked}
    assert full.recall_kind == "exact" and full.recall == pytest.approx(len(truth & chosen) / 3)
    assert "(exact: every head verified)" in full.summary()
