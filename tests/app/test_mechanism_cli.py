"""``lensprobe mechanism`` on the tiny model: the files it writes match the library's numbers; bad input
exits with code 2 and one line."""

import json

import pandas as pd
import pytest

from lensprobe.app.cli import main
from lensprobe.studies.mechanism import filler_affine_fit, mechanism_prompts

QUESTION = "What is 2+3?"


@pytest.fixture
def cli_on_tiny(tiny, monkeypatch):
    """``--model tiny`` resolves to the session's tiny model (the same weights, loaded once)."""
    monkeypatch.setattr("lensprobe.app.commands.mechanism.load_cli_model",
                        lambda args: tiny if args.ModelOptions.model == "tiny" else pytest.fail(f"unexpected model {args.ModelOptions.model}"))
    return main


def test_mechanism_writes_tables_and_figures(cli_on_tiny, tiny, tmp_path, capsys):
    out = tmp_path / "mech"
    rc = cli_on_tiny(["mechanism", "--model", "tiny", "--question", QUESTION, "--heads", "0,2", "--filler-count", "9",
                      "--bins", "20", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    files = ("affine_fit.csv", "affine_fit_summary.csv", "activation_histogram.csv", "activation_summary.csv",
             "affine_fit_L0.html", "activation_histogram_L0.html", "mechanism.json", "plotly.min.js")
    for name in files:
        assert (out / name).is_file() and name in printed, name
    fit = pd.read_csv(out / "affine_fit.csv")
    ps = mechanism_prompts(tiny, QUESTION, count=9)
    want = filler_affine_fit(tiny, ps["w/ Mless"], ps["w/o"], heads=[0, 2])
    assert fit["head_label"].tolist() == want["head_label"].tolist()
    pd.testing.assert_series_equal(fit["lambda"], want["lambda"], rtol=1e-9)
    summary = pd.read_csv(out / "activation_summary.csv")
    assert summary["condition"].tolist() == ["w/o", "w/ Mless", "w/o + ARM"]
    hist = pd.read_csv(out / "activation_histogram.csv")
    counts = hist.groupby("condition", sort=False)["count"].sum()
    assert len(hist) == 3 * 20 and counts.tolist() == summary["n"].tolist()
    meta = json.loads((out / "mechanism.json").read_text())
    assert meta["layer"] == 0 and meta["heads"] == [0, 2] and "0-based" in meta["indexing"]
    assert meta["arm"].startswith("ARM(layer=0, c=0.1, percentile=95")  # no preset for the tiny model
    page = (out / "affine_fit_L0.html").read_text()
    assert "L0H0" in page and "L0H2" in page and "lensprobe-tiny-llama" in page


def test_mechanism_without_arm_and_bad_input(cli_on_tiny, tmp_path, capsys):
    out = tmp_path / "noarm"
    assert cli_on_tiny(["mechanism", "--model", "tiny", "--question", QUESTION, "--no-arm", "--where", "hook_post",
                        "--eps", "0.01", "--out", str(out)]) == 0
    summary = pd.read_csv(out / "activation_summary.csv")
    assert summary["condition"].tolist() == ["w/o", "w/ Mless"] and (summary["eps"] == 0.01).all()
    capsys.readouterr()
    # the real --model tiny path, no stand-in
    assert main(["mechanism", "--model", "tiny", "--question", QUESTION, "--layer", "2",
                 "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("lensprobe: error: layer 2 out of range: model has 2 layers")
    assert not (tmp_path / "bad").exists()
    assert cli_on_tiny(["mechanism", "--model", "tiny", "--question", QUESTION, "--heads", "4",
                        "--out", str(tmp_path / "bad")]) == 2
    assert "head 4 out of range" in capsys.readouterr().err
    assert main(["mechanism", "--model", "tiny", "--question", QUESTION, "--where", "gate"]) == 2
    assert "invalid choice: 'gate'" in capsys.readouterr().err


def test_demo_section_on_the_tiny_model(tiny, tmp_path):
    from lensprobe.app.sections.mechanism import TITLE, build_demo_section
    from lensprobe.viz.report import write_report

    sec = build_demo_section(tiny, quick=True)
    assert sec.title == TITLE and len(sec.figures) == 2
    assert set(sec.tables) == {"affine_fit", "affine_fit_summary", "activation_histogram", "activation_summary"}
    assert sec.tables["activation_summary"]["condition"].tolist() == ["w/o", "w/ Mless", "w/o + ARM"]
    assert sec.data["study"]["layer"] == 0 and "eps" in sec.intro
    page = write_report(tmp_path / "report", [sec]).read_text(encoding="utf-8")
    assert "Mechanism" in page and "0-based" in page
