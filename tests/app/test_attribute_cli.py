"""``lensprobe attribute`` on the tiny model: the files it writes hold what the library computes."""

import json

import pandas as pd
import pytest
import torch

import lensprobe as lp
from lensprobe.app.cli import build_parser, main
from lensprobe.app.commands.heads import prompt_of

QUESTION = "What is 12+7?"


def test_attribute_writes_estimates_verification_and_figures(tmp_path, capsys, tiny):
    out = tmp_path / "att"
    rc = main(["attribute", "--model", "tiny", "--question", QUESTION, "--metric", "entropy", "--method", "atp*",
               "--verify", "3", "--random-heads", "2", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "top estimates:" in printed and "3 top, 2 sampled" in printed
    for name in ("attribution.csv", "attribution_heatmap.html", "verification.csv", "attribution_scatter.html",
                 "attribution.json"):
        assert (out / name).is_file(), name
    args = build_parser().parse_args(["attribute", "--question", QUESTION, "--out", str(out)])
    prompt = prompt_of(tiny, args, QUESTION)
    want = lp.attribute_heads(tiny, prompt, "entropy", method="atp*")
    got = pd.read_csv(out / "attribution.csv")
    torch.testing.assert_close(torch.tensor(got["estimate"].values, dtype=torch.float32),
                               want.estimates[0], rtol=1e-5, atol=1e-9)
    ver = pd.read_csv(out / "verification.csv")
    assert list(ver["chosen"]) == ["top"] * 3 + ["sample"] * 2
    summary = json.loads((out / "attribution.json").read_text())
    assert summary["method"] == "atp*" and summary["verification"]["top"] == 3
    assert 0.0 <= summary["verification"]["recall"] <= 1.0 and summary["verification"]["recall_kind"] == "sampled"
    assert summary["verification"]["recall_note"].startswith("top-3 recall >= ") and "from 2 random heads" in printed


@pytest.mark.parametrize("argv, message", [
    (["--metric", "logit_diff"], "--tokens A,B"),
    (["--metric", "logprob"], "--answer"),
    (["--ablation", "mean"], "--reference"),
    (["--heads", "L0X1"], "not a head label"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    rc = main(["attribute", "--model", "tiny", "--question", QUESTION, "--out", str(tmp_path / "o"), *argv])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_find_heads_writes_what_the_library_finds(tmp_path, capsys, tiny):
    out = tmp_path / "heads"
    rc = main(["find-heads", "--model", "tiny", "--question", QUESTION, "--question", "What is 3*4?", "--top", "3",
               "--flag", "0.5", "--step", "2", "--refine", "1", "--random-heads", "1", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    for name in ("find_heads.csv", "per_prompt.csv", "find_heads_scatter.html", "find_heads_heatmap.html",
                 "find_heads.json"):
        assert (out / name).is_file(), name
    args = build_parser().parse_args(["find-heads", "--question", QUESTION, "--out", str(out)])
    prompts = [prompt_of(tiny, args, q) for q in (QUESTION, "What is 3*4?")]
    want = lp.find_heads(tiny, prompts, "entropy", top=3, flag=0.5, step=2, refine=1, sample=1)
    got = pd.read_csv(out / "find_heads.csv")
    assert list(got["head_label"]) == list(want.table["head_label"]) and list(got["why"]) == list(want.table["why"])
    torch.testing.assert_close(torch.tensor(got["exact"].values, dtype=torch.float32),
                               torch.tensor(want.table["exact"].values, dtype=torch.float32), rtol=1e-5, atol=1e-7)
    per = pd.read_csv(out / "per_prompt.csv")
    assert [list(per[per["prompt"] == p]["head_label"]) for p in range(2)] == want.per_prompt
    summary = json.loads((out / "find_heads.json").read_text())
    assert [r["head_label"] for r in summary["found"]] == list(want.found["head_label"])
    assert summary["settings"] == {"metric": "entropy", "ablation": "zero", "top": 3, "flag": 0.5, "step": 2,
                                   "refine": 1, "sample": 1, "batch_size": 32, "tokens": None}
    assert summary["cost"]["total"] == pytest.approx(want.cost["total"]) and want.summary() in printed
    # 8 heads: the search's plan costs at least the sweep, so both ran the sweep, and say so alike
    assert summary["method"] == want.method == "sweep" and "ran the exact sweep instead" in printed
    assert summary["recall_note"] == want.recall_text() and summary["planned"] == pytest.approx(want.planned)


@pytest.mark.parametrize("argv, message", [
    (["--flag", "-1"], "argument --flag: expected a number (inf allowed) >= 0"),
    (["--top", "0"], "argument --top: expected a whole number >= 1"),
    (["--ablation", "mean"], "--reference"),
    (["--metric", "logprob"], "--answer"),
])
def test_find_heads_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    rc = main(["find-heads", "--model", "tiny", "--question", QUESTION, "--out", str(tmp_path / "o"), *argv])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
