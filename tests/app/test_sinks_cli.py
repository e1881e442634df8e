"""``lensprobe sinks`` on the tiny model: the files it writes hold the library's numbers; the conditions,
segments and steps asked for are the ones run; bad input exits with code 2 and one line, before the model
loads."""

import json

import pandas as pd
import pytest

from lensprobe.app.cli import main
from lensprobe.studies.filler import FillerSetup
from lensprobe.studies.sinks import attention_sinks

QUESTION = "What is 2+3?"


@pytest.fixture
def cli_on_tiny(tiny, monkeypatch):
    """``--model tiny`` resolves to the session's tiny model (the same weights, loaded once)."""
    monkeypatch.setattr("lensprobe.app.commands.sinks.load_cli_model",
                        lambda args: tiny if args.ModelOptions.model == "tiny" else pytest.fail("unexpected model"))
    return main


def test_sinks_writes_the_librarys_tables_and_figures(cli_on_tiny, tiny, tmp_path, capsys):
    out = tmp_path / "sinks"
    rc = cli_on_tiny(["sinks", "--model", "tiny", "--question", QUESTION, "--filler-count", "6", "--layers", "1",
                      "--max-new-tokens", "3", "--entries", "2", "--no-progress", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    files = ("sink_prompt.csv", "sink_head_means.csv", "sink_steps.csv", "sink_step_means.csv", "massive.csv",
             "sink_queries.csv", "sink_heatmap_first_token.html", "sink_heatmap_filler.html", "sink_steps.html",
             "massive_prompt.html", "activation_norms.html", "sinks.json", "plotly.min.js")
    for name in files:
        assert (out / name).is_file() and name in printed, name
    want = attention_sinks(tiny, QUESTION, conditions=("w/o", "w/ Mless"), setup=FillerSetup(count=6), layers=[1],
                           max_new_tokens=3, entries=2)
    got = pd.read_csv(out / "sink_prompt.csv")
    assert got[["condition", "layer", "head", "target"]].values.tolist() == \
        want.prompt[["condition", "layer", "head", "target"]].values.tolist()
    pd.testing.assert_series_equal(got["mass"], want.prompt["mass"], rtol=1e-9)
    steps = pd.read_csv(out / "sink_steps.csv")
    assert sorted(set(steps["step"])) == sorted(set(want.steps["step"])) and set(steps["layer"]) == {1}
    pd.testing.assert_series_equal(steps["mass"], want.steps["mass"], rtol=1e-6)
    massive = pd.read_csv(out / "massive.csv")
    assert set(massive["rank"]) == {0, 1} and massive["ratio"].tolist() == pytest.approx(want.massive["ratio"].tolist())
    meta = json.loads((out / "sinks.json").read_text())
    assert meta["conditions"] == ["w/o", "w/ Mless"] and meta["layers"] == [1] and meta["max_new_tokens"] == 3
    assert meta["targets"] == ["first token", "filler"] and "0-based" in meta["indexing"]
    assert meta["summary"]["w/ Mless"]["filler_first_layer"] == pytest.approx(
        float(want.head_means().query("condition == 'w/ Mless' and target == 'filler'")["mass"].iloc[0]))


def test_all_conditions_and_segments_reach_the_study(cli_on_tiny, tmp_path):
    out = tmp_path / "all"
    assert cli_on_tiny(["sinks", "--model", "tiny", "--question", QUESTION, "--all-conditions", "--layers", "0",
                        "--segments", "filler,question", "--filler-count", "4", "--max-new-tokens", "2",
                        "--no-progress", "--out", str(out)]) == 0
    table = pd.read_csv(out / "sink_prompt.csv")
    assert list(dict.fromkeys(table["condition"])) == ["w/o", "w/ Mless", "w/ Mful", "random sentence"]
    per = table.groupby("condition", sort=False)["target"].unique()
    assert sorted(per["w/o"]) == ["first token", "question"]
    assert sorted(per["random sentence"]) == ["filler", "first token", "question"]
    only = tmp_path / "only"
    assert cli_on_tiny(["sinks", "--model", "tiny", "--question", QUESTION, "--compare", "w/o", "--layers", "0",
                        "--max-new-tokens", "1", "--no-progress", "--out", str(only)]) == 0
    assert set(pd.read_csv(only / "sink_prompt.csv")["target"]) == {"first token"}  # no filler anywhere: no rows


@pytest.mark.parametrize(("argv", "message"), [
    (["--segments", "filler,,q"], "--segments: expected segment names"),
    (["--entries", "0"], "--entries"),
    (["--layers", "x"], "--layers"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
])
def test_bad_input_is_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr("lensprobe.app.commands.sinks.load_cli_model", lambda args: pytest.fail("the model loaded"))
    assert main(["sinks", "--model", "tiny", "--question", QUESTION, *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
