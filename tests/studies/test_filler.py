"""The meaningless-token study on the tiny model: every number checked a second way (attention weights
of a separately built plain transformers model, averages written out here)."""

import math

import pytest
import torch

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.studies import filler as fs
from lensprobe.studies.token_classes import class_layers

QUESTION = "What is 12+7?"


def small_setup(*conditions, count=5):
    return fs.FillerSetup(conditions=conditions or fs.CONDITIONS, count=count)


def sel(df, **eq):
    """Rows of ``df`` whose columns equal the given values."""
    mask = True
    for col, value in eq.items():
        mask = mask & (df[col] == value)
    return df[mask]


def hf_attentions(hf, prompt):
    """Attention of every layer from plain transformers (independent of hooks): [layer][head, q, k]."""
    with torch.no_grad():
        out = hf(prompt.tokens, output_attentions=True)
    return [a[0] for a in out.attentions]


def received_by_hand(A):
    """Mean over i > j of A[i, j], with python loops, per head: list of lists (nan at the last key)."""
    H, n, _ = A.shape
    return [[(sum(A[h, i, j].item() for i in range(j + 1, n)) / (n - 1 - j)) if j < n - 1 else math.nan
             for j in range(n)] for h in range(H)]


def test_aligned_series_equals_direct_computation(tiny, tiny_hf):
    res = fs.attention_received_by_condition(tiny, QUESTION, layers=[0, 1], setup=small_setup("w/o", "w/ Mless"))
    p_with, p_without = res.prompts["w/ Mless"], res.prompts["w/o"]
    start, end = p_with.segments["filler"]
    s_start, s_end = p_with.segments["filler_sep"]
    keep = [i for i in range(len(p_with)) if not (start <= i < end or s_start <= i < s_end)]
    assert p_with.tokens[0, keep].tolist() == p_without.tokens[0].tolist()
    aligned = res.aligned()
    with_filler, without = hf_attentions(tiny_hf, p_with), hf_attentions(tiny_hf, p_without)
    for layer in (0, 1):
        direct = torch.tensor(received_by_hand(with_filler[layer]))[:, keep]
        base = torch.tensor(received_by_hand(without[layer]))
        for head in range(tiny.cfg.n_heads):
            for cond, want in (("w/ Mless", direct[head]), ("w/o", base[head])):
                rows = sel(aligned, condition=cond, layer=layer, head=head).sort_values("aligned_pos")
                assert rows["aligned_pos"].tolist() == list(range(len(p_without)))
                got = torch.tensor(rows["attention"].to_numpy(dtype=float), dtype=torch.float32)
                torch.testing.assert_close(got, want.float(), equal_nan=True, atol=1e-6, rtol=0)


def test_full_series_matches_hf_attentions_by_hand(tiny, tiny_hf):
    res = fs.attention_received_by_condition(tiny, QUESTION, layers=[1], heads=[2], setup=small_setup("w/ Mless"))
    p = res.prompts["w/ Mless"]
    want = received_by_hand(hf_attentions(tiny_hf, p)[1])[2]
    rows = res.table.sort_values("position")
    assert rows["position"].tolist() == list(range(len(p)))
    assert rows["token"].tolist() == p.str_tokens
    assert rows["segment"].tolist() == [p.segment_of(i) for i in range(len(p))]
    got = rows["attention"].tolist()
    for g, w in zip(got[:-1], want[:-1], strict=True):
        assert g == pytest.approx(w, abs=1e-6)
    assert math.isnan(got[-1])
    filler_rows = rows[rows["segment"].isin(["filler", "filler_sep"])]
    assert filler_rows["aligned_pos"].isna().all()
    assert set(rows["head_label"]) == {"L1H2"}


def test_conditions_random_sentence_has_filler_token_count(tiny):
    res = fs.attention_received_by_condition(tiny, QUESTION, layers=[0], heads=[0], setup=small_setup(count=7))
    assert res.conditions == ("w/o", "w/ Mless", "w/ Mful", "random sentence")
    spans = {c: res.filler_span(c) for c in res.conditions}
    assert spans["w/o"] is None
    n = spans["w/ Mless"][1] - spans["w/ Mless"][0]
    assert spans["random sentence"][1] - spans["random sentence"][0] == n
    assert res.prompts["w/ Mless"].pieces["filler"] == " ".join(["/"] * 7)
    assert res.prompts["w/ Mful"].pieces["filler"] == " ".join(["he"] * 7)
    words = res.prompts["random sentence"].pieces["filler"].split()
    assert len(words) >= 2 and all(w.isalpha() for w in words)
    # every condition aligns to the same number of positions as the no-filler prompt
    counts = res.aligned().groupby("condition")["aligned_pos"].nunique()
    assert set(counts) == {len(res.prompts["w/o"])}


def test_condition_changes_and_ranking_by_hand(tiny):
    res = fs.attention_received_by_condition(tiny, QUESTION, layers=[0, 1], setup=small_setup("w/o", "w/ Mless", "random sentence"))
    ch = fs.condition_changes(res)
    assert set(ch["condition"]) == {"w/ Mless", "random sentence"}
    a = res.aligned()
    for cond in ("w/ Mless", "random sentence"):
        for layer in (0, 1):
            for head in range(tiny.cfg.n_heads):
                x = sel(a, condition=cond, layer=layer, head=head).sort_values("aligned_pos")["attention"]
                y = sel(a, condition="w/o", layer=layer, head=head).sort_values("aligned_pos")["attention"]
                pairs = [(u, v) for u, v in zip(x, y, strict=True) if not (math.isnan(u) or math.isnan(v))]
                want = sum(abs(u - v) for u, v in pairs) / len(pairs)
                got = sel(ch, condition=cond, layer=layer, head=head)["change"].item()
                assert got == pytest.approx(want, rel=1e-6)
    top = fs.heads_by_change(res, k=2)
    assert len(top) == 4 and set(top["layer"]) == {0, 1}
    for layer in (0, 1):
        mine = sel(ch, condition="w/ Mless", layer=layer).nlargest(2, "change")
        assert sorted(sel(top, layer=layer)["head"]) == sorted(mine["head"])
    full = fs.heads_by_change(res)
    assert full["change"].is_monotonic_decreasing
    with pytest.raises(lp.LensprobeError, match="was not run"):
        fs.heads_by_change(res, condition="w/ Mful")


@pytest.mark.unchecked
def test_bad_input_errors(tiny):
    with pytest.raises(lp.LensprobeError, match="unknown condition"):
        fs.FillerSetup(conditions=("w/o", "loud"))
    with pytest.raises(lp.LensprobeError, match="count: expected a whole number between 1 and 10,000,000, got 0"):
        fs.FillerSetup(count=0)
    with pytest.raises(lp.LensprobeError, match="placement"):
        fs.FillerSetup(placement="middle")
    with pytest.raises(lp.LensprobeError, match="out of range"):
        fs.attention_received_by_condition(tiny, QUESTION, layers=[5], setup=small_setup("w/o"))
    with pytest.raises(lp.LensprobeError, match="head 9 out of range"):
        fs.attention_received_by_condition(tiny, QUESTION, layers=[0], heads=[9], setup=small_setup("w/o"))
    assert fs.normalize_conditions(["w/o", "Mless", "Mful", "random sentence"]) == fs.CONDITIONS


def test_filler_vs_random_two_models(tiny, tiny_hf, twin_of):
    other = tiny_model(seed=1)
    fr = lp.studies.filler_vs_random([tiny, other], QUESTION, layer=1, head=3, setup=small_setup(count=6))
    models = list(dict.fromkeys(fr.table["model"]))
    assert len(models) == 2 and models[0] != models[1]
    for m, hf in zip(models, (tiny_hf, twin_of(other)), strict=True):
        rows = fr.table[fr.table["model"] == m]
        by_cond = {c: g.sort_values("position") for c, g in rows.groupby("condition")}
        assert set(by_cond) == {"w/ Mless", "random sentence"}
        assert len(by_cond["w/ Mless"]) == len(by_cond["random sentence"])  # same length, same span
        start, end = fr.spans[m]
        for c, g in by_cond.items():
            assert g.loc[g["segment"] == "filler", "position"].tolist() == list(range(start, end))
            p = fr.prompts[m][c]
            want = torch.tensor(received_by_hand(hf_attentions(hf, p)[1])[3], dtype=torch.float32)
            got = torch.tensor(g["attention"].to_numpy(dtype=float), dtype=torch.float32)
            torch.testing.assert_close(got, want, equal_nan=True, atol=1e-6, rtol=0)
        assert set(rows["head_label"]) == {"L1H3"}


def test_token_class_attention_by_hand(tiny, tiny_hf):
    grid = lp.studies.ascii_grid(3, 6, seed=2)
    q = "Count:\n" + grid
    prompts = {"w/o": lp.build_prompt(tiny, q), "Mless": lp.build_prompt(tiny, q, filler=lp.Filler.meaningless(count=4))}
    df = lp.studies.compare_token_class_attention({g: (tiny, p) for g, p in prompts.items()}, layers=[1, 0])
    assert list(df.columns) == ["group", "layer", "layer_label", "token_class", "attention", "n_tokens"]
    names = ["# (hash)", "* (star)", "whitespace"]
    for g, p in prompts.items():
        toks = p.str_tokens
        member = {
            "# (hash)": [bool(t.strip()) and set(t.strip()) <= {"#"} for t in toks],
            "* (star)": [bool(t.strip()) and set(t.strip()) <= {"*"} for t in toks],
            "whitespace": [bool(t) and t.isspace() for t in toks],
        }
        atts = hf_attentions(tiny_hf, p)
        for layer in (0, 1):
            A = atts[layer]  # [head, q, k]
            total = 0.0
            for name in names:
                cols = [j for j, m in enumerate(member[name]) if m]
                want = A[:, :, cols].sum(-1).mean().item() if cols else 0.0
                row = sel(df, group=g, layer=layer, token_class=name)
                assert row["attention"].item() == pytest.approx(want, abs=1e-6)
                assert row["n_tokens"].item() == len(cols)
                total += want
            other = sel(df, group=g, layer=layer, token_class="other")
            assert other["attention"].item() == pytest.approx(1 - total, abs=1e-6)
            assert other["n_tokens"].item() == len(toks) - sum(sum(member[n]) for n in names)
    assert set(df["layer_label"]) == {"L0", "L1"}


def test_ascii_grid_shape_and_alphabet():
    g = lp.studies.ascii_grid(5, 7, seed=3)
    rows = g.split("\n")
    assert len(rows) == 5 and all(len(r) == 7 for r in rows)
    assert set(g) <= set("#* \n")
    assert g == lp.studies.ascii_grid(5, 7, seed=3) and g != lp.studies.ascii_grid(5, 7, seed=4)
    with pytest.raises(lp.LensprobeError, match="grid needs rows > 0 and cols > 0, got 0x3"):
        lp.studies.ascii_grid(0, 3)


def test_labels(tiny):
    assert lp.core.hooks.heads.head_label(0, 13) == "L0H13"
    assert lp.model_label(tiny) == "lensprobe-tiny-llama"

    class Cfg:
        model_name = "/root/.cache/lensprobe/SmolLM2-135M-Instruct.Q4_1-ad7981e02a59"

    class M:
        cfg = Cfg()

    assert lp.model_label(M()) == "SmolLM2-135M-Instruct.Q4_1"
    assert class_layers(tiny) == [0, 1]
