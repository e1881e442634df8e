"""``lensprobe patch-heads`` on the tiny model: the files it writes hold what the library computes, its figures
say what they show, and bad input is one line."""

import json

import pandas as pd
import pytest
import torch

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.studies.filler import FillerSetup

QUESTIONS = ("What is 12+7?", "What is 3*4?")


def test_patch_heads_writes_what_the_library_computes(tmp_path, capsys, tiny):
    out = tmp_path / "patched"
    rc = main(["patch-heads", "--model", "tiny", "--question", QUESTIONS[0], "--question", QUESTIONS[1], "--metric",
               "logprob", "--answer", "19", "--answer", "12", "--heads", "L0H0,L0H1,L1H2", "--heads-per-forward", "2",
               "--no-progress", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    for name in ("patched_heads.csv", "patched_heads_long.csv", "pairs.csv", "patched_heads_heatmap.html",
                 "patched_heads_share.html", "patch_heads.json"):
        assert (out / name).is_file(), name
    cond = FillerSetup().condition("w/ Mless")
    want = lp.patch_heads(tiny, list(QUESTIONS), filler=cond, metric="logprob", answers=["19", "12"],
                          heads="L0H0,L0H1,L1H2")
    long = pd.read_csv(out / "patched_heads_long.csv")
    torch.testing.assert_close(torch.tensor(long["change"].values, dtype=torch.float32), want.changes.reshape(-1),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(long["share"].values, dtype=torch.float32), want.shares.reshape(-1),
                               rtol=1e-4, atol=1e-6)
    pairs = pd.read_csv(out / "pairs.csv")
    assert list(pairs["corrupted"]) == pytest.approx(want.corrupted.tolist(), abs=1e-6)
    summary = json.loads((out / "patch_heads.json").read_text())
    assert summary["pairs"] == 2 and summary["compare"] == "w/ Mless" and summary["questions"] == list(QUESTIONS)
    assert summary["share"].startswith("(patched - clean) / (corrupted - clean)")
    assert summary["clean"] == pytest.approx(want.clean.tolist(), abs=1e-6)
    assert want.summary() in printed
    heat = " ".join((out / "patched_heads_heatmap.html").read_text().replace("\\u003cbr\\u003e", " ").split())
    assert "patched - clean, mean over 2 pairs" in heat and "ablated - baseline" not in heat
    assert "Share of the total effect" in (out / "patched_heads_share.html").read_text()


def test_segments_and_system_reach_the_library(tmp_path, capsys, tiny):
    out = tmp_path / "q"
    rc = main(["patch-heads", "--model", "tiny", "--question", QUESTIONS[0], "--no-system", "--patch-segments", "question",
               "--heads", "L1H2", "--no-progress", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    cond = FillerSetup(system=None).condition("w/ Mless")
    want = lp.patch_heads(tiny, QUESTIONS[0], filler=cond, heads="L1H2", segments=["question"])
    got = json.loads((out / "patch_heads.json").read_text())
    assert got["positions"] == [len(want.clean_positions)] and ["system", "not asked for"] not in got["unmatched"]
    assert got["clean"] == pytest.approx(want.clean.tolist(), abs=1e-6)
    assert float(pd.read_csv(out / "patched_heads_long.csv")["change"][0]) == pytest.approx(
        float(want.changes[0, 0]), abs=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["--compare", "w/o"], "--compare w/o has no filler"),
    (["--metric", "logprob"], "--metric logprob needs --answer TEXT"),
    (["--heads", "L0X1"], "not a head label"),
    (["--patch-segments", "bogus"], "segment 'bogus': this prompt has segments"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    rc = main(["patch-heads", "--model", "tiny", "--question", QUESTIONS[0], "--no-progress", "--out",
               str(tmp_path / "o"), *argv])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
