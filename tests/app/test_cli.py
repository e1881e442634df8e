"""The lensprobe command: attention and demo on the embedded model, and clear errors with exit code 2."""

import json
import re
import subprocess
import sys

import pandas as pd
import pytest
import torch

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.app.common import int_list, layer_list

QUESTION = "What is 2+3?"


def test_attention_on_embedded_model(tmp_path, capsys, smol):
    out = tmp_path / "attn"
    rc = main(["attention", "--question", QUESTION, "--layers", "0", "--heads", "0,4", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert str(out.resolve()) in printed and "attention_received_L0.html" in printed
    for name in ("attention_received_L0.html", "attention_view_L0.html", "attention_received.csv",
                 "attention_received.json", "plotly.min.js"):
        assert (out / name).is_file(), name
    page = (out / "attention_received_L0.html").read_text()
    assert not re.search(r"<script[^>]*\bsrc\s*=\s*[\"']https?:", page)  # plotly.js from the folder

    df = pd.read_csv(out / "attention_received.csv")
    assert set(df["condition"]) == {"none", "meaningless"} and set(df["layer"]) == {0}
    assert set(df["head_label"]) == {"L0H0", "L0H4"}
    # the numbers equal a direct computation on the same prompt
    prompt = lp.build_prompt(smol, QUESTION, system=lp.MATH_SYSTEM_PROMPT, filler=lp.Filler.meaningless())
    want = lp.average_attention_received(lp.attention_patterns(smol, prompt, [0])[0])[4]
    got = df.query("condition == 'meaningless' and head == 4").sort_values("position")["attention"]
    torch.testing.assert_close(torch.tensor(got.to_numpy(), dtype=torch.float32), want, equal_nan=True)

    summary = json.loads((out / "attention_received.json").read_text())
    assert summary["model"].startswith("SmolLM2-135M-Instruct")
    assert summary["filler_spans"]["meaningless"] == list(prompt.segments["filler"])
    assert summary["heads"] == [0, 4] and "0-based" in summary["indexing"]


def test_bad_filler_is_a_usage_error(capsys):
    assert main(["attention", "--question", "x", "--filler", "loud"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'loud'" in err and "meaningless" in err


def test_bad_heads_and_missing_question(capsys):
    assert main(["attention", "--question", "x", "--heads", "a,b"]) == 2
    assert "comma-separated integers" in capsys.readouterr().err
    assert main(["attention"]) == 2
    assert "--question" in capsys.readouterr().err


def test_layer_out_of_range_is_one_clear_line(tmp_path, capsys, monkeypatch, smol):
    monkeypatch.setattr("lensprobe.app.common.load_model", lambda name=None, **kw: smol)  # reuse the loaded model
    rc = main(["attention", "--question", "x", "--layers", "30", "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "layer 30 out of range: model has 30 layers (0-29)" in err
    assert "Traceback" not in err
    assert main(["attention", "--question", "x", "--heads", "9", "--out", str(tmp_path)]) == 2
    assert "(0-8)" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


def test_missing_model_file_exit_code_2_from_console_script(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lensprobe.app.cli", "attention", "--model", str(tmp_path / "nope.gguf"),
         "--question", "x", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "lensprobe: error:" in proc.stderr and "not found" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    assert str((out / "index.html").resolve()) in capsys.readouterr().out
    page = (out / "index.html").read_text(encoding="utf-8")
    for title in ("Meaningless tokens", "random sentence", "token class", "Layer 0 attention"):
        assert title in page
    assert "SmolLM2-135M-Instruct" in page and "0-based" in page
    assert not re.search(r"<script[^>]*\bsrc\s*=", page)
    manifest = json.loads((out / "report.json").read_text())
    files = [f for s in manifest["sections"] for f in s["files"]]
    assert len(files) >= 6
    for f in files:
        path = out / f
        if f.endswith(".csv"):
            assert len(pd.read_csv(path)) > 0
        else:
            json.loads(path.read_text())


def test_parsers():
    assert int_list("0,1,7") == [0, 1, 7] and int_list(" 3 ") == [3]
    assert layer_list("all") is None and layer_list("2,5") == [2, 5]
    with pytest.raises(Exception, match="integers"):
        int_list("x")
    assert main(["--version"]) == 0
