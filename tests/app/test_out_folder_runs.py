"""Two runs into one ``--out`` folder never mix their files: a second run while the first writes is refused
(naming the folder and the fix), and a finished rerun with other settings leaves no page of the earlier run."""

import json

import pandas as pd
import pytest

from lensprobe.app.cli import main
from lensprobe.core.storage.outfolder import FOLDER_LOCK, PAGES_FILE

SWEEP = ["sweep", "--model", "tiny", "--question", "What is 12+7?", "--heads-per-forward", "4"]


@pytest.fixture
def on_tiny(tiny, monkeypatch):
    for module in ("heads", "attention", "attribution"):
        monkeypatch.setattr(f"lensprobe.app.commands.{module}.load_cli_model", lambda args: tiny)


def test_a_second_sweep_into_a_folder_being_written_is_refused_and_the_files_stay_one_runs(
        on_tiny, tmp_path, monkeypatch, capsys):
    """Two sweeps into one folder used to leave sweep.json of one beside sweep.csv of the other."""
    out = tmp_path / "sw"
    import lensprobe.app.commands.heads as heads

    real, second = heads.ablation_sweep, []

    def sweep_while_another_starts(*args, **kwargs):  # the first run is mid-way when the second starts
        second.append(main([*SWEEP, "--metric", "attention:system", "--out", str(out)]))
        return real(*args, **kwargs)

    monkeypatch.setattr(heads, "ablation_sweep", sweep_while_another_starts)
    assert main([*SWEEP, "--heads", "L0H0,L0H1,L1H2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert second == [2]
    assert (f"lensprobe: error: {out} is being written by another run (pid " in err
            and "so this lensprobe sweep would mix its files with that run's: wait for it to finish, or give this "
                "run another output folder (--out)." in err)
    summary = json.loads((out / "sweep.json").read_text())
    table = pd.read_csv(out / "sweep_long.csv")
    assert summary["metric"] == "entropy" and summary["heads_swept"] == 3  # the first run's, and only its
    assert table["label"].tolist() == ["L0H0", "L0H1", "L1H2"]
    assert not (out / FOLDER_LOCK).exists()  # released when the run ended
    monkeypatch.setattr(heads, "ablation_sweep", real)
    assert main([*SWEEP, "--heads", "L0H0", "--out", str(out)]) == 0  # a later run may write the folder
    assert json.loads((out / "sweep.json").read_text())["heads_swept"] == 1


def test_a_rerun_with_other_settings_leaves_no_page_of_the_earlier_run(on_tiny, tmp_path, capsys):
    out = tmp_path / "attn"
    attention = ["attention", "--model", "tiny", "--question", "What is 3+4?", "--heads", "0,1", "--out", str(out)]
    assert main([*attention, "--layers", "0,1"]) == 0
    first = {p.name for p in out.iterdir()}
    assert {"attention_received_L0.html", "attention_view_L0.html", "attention_received_L1.html"} <= first
    assert main([*attention, "--layers", "1"]) == 0
    second = {p.name for p in out.iterdir()}
    assert second == first - {"attention_received_L0.html", "attention_view_L0.html"}
    listed = json.loads((out / PAGES_FILE).read_text())
    assert listed["written_by"] == "lensprobe attention" and "attention_received_L0.html" not in listed["files"]
    assert json.loads((out / "attention_received.json").read_text())["layers"] == [1]
    # a file the user put in the folder is never listed, so never deleted
    (out / "notes.txt").write_text("mine")
    assert main([*attention, "--layers", "0"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and not (out / "attention_received_L1.html").exists()


def test_an_attribution_rerun_without_verification_removes_the_earlier_verification(on_tiny, tmp_path, capsys):
    out = tmp_path / "att"
    attribute = ["attribute", "--model", "tiny", "--question", "What is 3+4?", "--method", "atp", "--out", str(out)]
    assert main([*attribute, "--verify", "2"]) == 0
    assert (out / "verification.csv").is_file() and (out / "attribution_scatter.html").is_file()
    assert main([*attribute, "--verify", "0"]) == 0
    assert not (out / "verification.csv").exists() and not (out / "attribution_scatter.html").exists()
    assert "verification" not in json.loads((out / "attribution.json").read_text())


def test_a_run_that_fails_before_writing_leaves_no_folder_or_lock(on_tiny, tmp_path, capsys):
    out = tmp_path / "new"
    assert main([*SWEEP, "--heads", "L7H0", "--out", str(out)]) == 2  # the tiny model has 2 layers
    assert not out.exists()
