"""Head studies: attention on one head over prompt + generated tokens, figures, report section, CLI."""

import json

import pandas as pd
import pytest
import torch

import lensprobe as lp
from lensprobe.app.sections import heads as head_sections
from lensprobe.studies import heads as head_study
from lensprobe.studies.filler import FillerSetup, aligned_positions, condition_prompts


def hf_pattern(model, tokens, layer):
    """[batch, head, q, k] attention weights of plain transformers' (eager) attention module."""
    got = {}

    def keep(mod, args, kwargs, out):
        got["w"] = out[1].detach().clone()

    h = model.original_model.model.layers[layer].self_attn.register_forward_hook(keep, with_kwargs=True)
    try:
        with torch.inference_mode():
            model.original_model(tokens)
    finally:
        h.remove()
    return got["w"]


def test_head_attention_over_generation_by_hand(tiny):
    setup = FillerSetup(system="Please reason step by step.", count=5)
    generated = {"none": [40, 41, 42], "meaningless": [50, 51]}
    table = head_study.head_attention_over_generation(
        tiny, "What is 12+7?", "L1H3", conditions=("none", "meaningless"), setup=setup, generated=generated)
    prompts = condition_prompts(tiny, "What is 12+7?",
                                FillerSetup(conditions=("none", "meaningless"), system=setup.system, count=5))
    for cond, p in prompts.items():
        new = generated[cond]
        tokens = torch.cat([p.tokens, torch.tensor([new])], dim=1)
        att = hf_pattern(tiny, tokens, layer=1)[0, 3]  # [q, k]
        n = att.shape[0]
        want = [att[j + 1:, j].mean().item() if j < n - 1 else float("nan") for j in range(n)]
        rows = table[table["condition"] == cond].sort_values("position")
        got = rows["attention"].tolist()
        assert len(got) == n
        assert all((abs(a - b) <= 1e-5) or (a != a and b != b) for a, b in zip(got, want, strict=True))
        kept = aligned_positions(p)
        gen_rows = rows[rows["segment"] == "generated"]
        assert gen_rows["aligned_pos"].tolist() == list(range(len(kept), len(kept) + len(new)))
        assert rows["aligned_pos"].isna().sum() == len(p) - len(kept)  # the filler span is not aligned


def test_head_attention_over_generation_generates(tiny):
    table = head_study.head_attention_over_generation(tiny, "What is 12+7?", (0, 1), max_new_tokens=3)
    for cond in ("none", "meaningless"):
        gen = table[(table["condition"] == cond) & (table["segment"] == "generated")]
        assert 1 <= len(gen) <= 3


def test_figures_draw_the_table(tiny):
    res = lp.attention_received(tiny, "What is 12+7?", layers=[0], heads=[2],
                                setup=FillerSetup(conditions=("none", "meaningless", "meaningful"), count=4))
    fig = lp_viz().head_attention_figure(res, 0, 2)
    assert [t.name for t in fig.data] == ["w/o filler", "Mless", "Mful"]
    aligned = res.aligned()
    mless = aligned[aligned["condition"] == "meaningless"].sort_values("aligned_pos")
    assert list(fig.data[1].y) == pytest.approx(mless["attention"].tolist(), nan_ok=True)
    assert "L0H2" in fig.layout.title.text and "layer 1" in fig.layout.title.text


def lp_viz():
    import lensprobe.viz as viz

    return viz


def test_ablation_effect_and_next_token_figure(tiny):
    p = lp.build_prompt(tiny, "What is 12+7?")
    eff = head_study.ablation_effect(tiny, p, lp.ablate_heads("L1H1"), top_k=5)
    clean = lp.forward(tiny, p)[0, -1]
    after = lp.forward(tiny, p, lp.ablate_heads("L1H1"))[0, -1]
    assert eff.summary["entropy_clean"] == pytest.approx(lp.entropy(clean).item(), abs=1e-6)
    assert eff.summary["entropy_ablated"] == pytest.approx(lp.entropy(after).item(), abs=1e-6)
    assert eff.summary["max_abs_logit_change"] == pytest.approx((after - clean).abs().max().item(), abs=1e-6)
    assert set(clean.topk(5).indices.tolist()) <= set(eff.tokens["token_id"])
    fig = lp_viz().next_token_figure(eff)
    assert list(fig.data[0].y) == pytest.approx(eff.tokens["p_clean"].tolist())


def test_report_section_quick(tiny, tmp_path):
    from lensprobe.viz.report import write_report

    sections = head_sections.build_section(tiny, quick=True)
    assert len(sections) == 4
    sweep, attention, single, patching = sections
    assert len(sweep.figures) == 2 and sweep.tables["sweep_long"].shape[0] == 2 * 8
    assert len(attention.figures) == 2
    assert set(single.tables["single_ablations"]["condition"]) == {"w/o filler", "Mless", "Mful"}
    df = patching.tables["patching"]
    assert len(df) == 3 * 3 + 1 and df["kl"].min() >= 0
    (heat,) = patching.figures[0].data  # hook x segment shares, as in the table
    cells = df[df["site"] != "all sites"].set_index(["hook", "segment"])["share"]
    assert [v for row in heat.z for v in row] == pytest.approx(
        [cells[(h, s)] for h in heat.y for s in heat.x], nan_ok=True)
    index = write_report(tmp_path, sections)
    assert index.is_file() and "Head ablation sweep" in index.read_text(encoding="utf-8")


@pytest.fixture()
def cli_on_tiny(tiny, monkeypatch):
    monkeypatch.setattr("lensprobe.app.commands.heads.load_cli_model", lambda name: tiny)
    from lensprobe.app.cli import main

    return main


def test_cli_ablate(cli_on_tiny, tiny, tmp_path, capsys):
    out = tmp_path / "abl"
    code = cli_on_tiny(["ablate", "--heads", "L0H1,L1H2", "--question", "What is 12+7?", "--out", str(out)])
    assert code == 0
    info = json.loads((out / "ablation.json").read_text())
    p = lp.build_prompt(tiny, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    eff = head_study.ablation_effect(tiny, p, lp.ablate_heads("L0H1,L1H2"))
    assert info["heads"] == ["L0H1", "L1H2"]
    assert info["entropy_ablated"] == pytest.approx(eff.summary["entropy_ablated"], abs=1e-6)
    for name in ("next_tokens.csv", "next_tokens.html", "attention_L0H1.html", "attention_L1H2.html"):
        assert (out / name).is_file()
    assert "entropy" in capsys.readouterr().out


def test_cli_sweep(cli_on_tiny, tiny, tmp_path):
    out = tmp_path / "sw"
    code = cli_on_tiny(["sweep", "--metric", "entropy", "--question", "What is 12+7?", "--batch-size", "3",
                        "--out", str(out)])
    assert code == 0
    table = pd.read_csv(out / "sweep.csv", index_col="layer")
    p = lp.build_prompt(tiny, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    res = lp.ablation_sweep(tiny, p, "entropy", progress=False)
    assert table.to_numpy() == pytest.approx(res.table.to_numpy(), abs=1e-5)
    assert (out / "sweep_heatmap.html").is_file() and json.loads((out / "sweep.json").read_text())["heads_swept"] == 8


def test_cli_bad_heads(cli_on_tiny, tmp_path, capsys):
    code = cli_on_tiny(["ablate", "--heads", "L0X3", "--question", "q", "--out", str(tmp_path)])
    assert code == 2
    assert "'L0X3' is not a head label" in capsys.readouterr().err
    code = cli_on_tiny(["sweep", "--heads", "L0H9", "--out", str(tmp_path)])
    assert code == 2
    assert "0-3" in capsys.readouterr().err
    code = cli_on_tiny(["ablate", "--heads", "L0H1", "--question", "q", "--method", "mean", "--out", str(tmp_path)])
    assert code == 2
    assert "--reference" in capsys.readouterr().err
