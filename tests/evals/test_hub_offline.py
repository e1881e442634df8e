"""``--data hub`` without network: one line and exit 2, at once (no retry lines), naming the dataset and
the fix (download it elsewhere and pass a local JSONL). The hub endpoint is an unroutable local address,
so these tests never touch the network."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import lensprobe as lp
from lensprobe.evals.problems import hub

VENV_BIN = Path(sys.executable).parent
DEAD = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


def test_the_eval_command_offline_is_one_line_without_retries(tmp_path):
    env = {**os.environ, "HF_ENDPOINT": DEAD, "HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "127.0.0.1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env.pop("HF_HUB_OFFLINE", None), env.pop("HF_DATASETS_OFFLINE", None)
    proc = subprocess.run([str(VENV_BIN / "lensprobe"), "eval", "--model", "tiny", "--data", "hub", "--limit", "1",
                           "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=600)
    err = proc.stderr
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("lensprobe: error:"), err
    assert "Retry" not in err and "thrown while requesting" not in err, err
    assert "HuggingFaceH4/MATH-500" in err and "--data" in err and ".jsonl" in err, err
    assert not (tmp_path / "out").exists()


def test_an_unreachable_endpoint_is_seen_as_such():
    assert hub.hub_reachable(DEAD) is False


def test_an_unreachable_hub_fails_at_once_naming_the_dataset_and_the_fix(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(hub, "hub_endpoint", lambda: DEAD)
    with pytest.raises(lp.LensprobeError, match=r"could not load 'HuggingFaceH4/MATH-500'.*unreachable.*"
                                                r"download it on a machine with network access"):
        hub.load_hub_dataset("HuggingFaceH4/MATH-500", "test", fix="download it on a machine with network access",
                             cache_dir=str(tmp_path / "cache"))  # an empty cache: nothing to fall back on
    assert "Retry" not in capsys.readouterr().err
