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
               "--verify", "3", "--sample", "2", "--out", str(out)])
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
