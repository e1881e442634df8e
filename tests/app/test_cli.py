"""The lensprobe command: attention, ablate, sweep and trace (tiny model; attention also on the embedded
model), and clear errors with exit code 2. The demo command is in ``test_demo.py``."""

import argparse
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
from lensprobe.studies import heads as head_study

QUESTION = "What is 2+3?"


def received_by_hand(att: torch.Tensor) -> torch.Tensor:
    """[q, k] -> per key j the mean of att[i, j] over the queries i > j (NaN for the last key)."""
    n = att.shape[0]
    return torch.tensor([att[j + 1:, j].mean().item() if j < n - 1 else float("nan") for j in range(n)])


def check_attention_output(out, model, hf, heads):
    """The files of ``lensprobe attention``, and its numbers against the plain model's attention."""
    for name in ("attention_received_L0.html", "attention_view_L0.html", "attention_received.csv",
                 "attention_received.json", "plotly.min.js"):
        assert (out / name).is_file(), name
    page = (out / "attention_received_L0.html").read_text()
    assert not re.search(r"<script[^>]*\bsrc\s*=\s*[\"']https?:", page)  # plotly.js from the folder
    df = pd.read_csv(out / "attention_received.csv")
    assert set(df["condition"]) == {"w/o", "w/ Mless"} and set(df["layer"]) == {0}
    assert set(df["head_label"]) == {f"L0H{h}" for h in heads}
    summary = json.loads((out / "attention_received.json").read_text())
    assert summary["heads"] == heads and "0-based" in summary["indexing"]
    for cond, filler in (("w/o", None), ("w/ Mless", lp.Filler.meaningless())):
        prompt = lp.build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT, filler=filler)
        assert summary["filler_spans"][cond] == (list(prompt.segments["filler"]) if filler else None)
        with torch.inference_mode():
            layer0 = hf(prompt.tokens, output_attentions=True).attentions[0][0]  # [head, q, k]
        for head in heads:
            got = df.query("condition == @cond and head == @head").sort_values("position")["attention"]
            torch.testing.assert_close(torch.tensor(got.to_numpy(), dtype=torch.float32),
                                       received_by_hand(layer0[head]), equal_nan=True, atol=1e-6, rtol=0)
    return summary


def test_attention_on_the_tiny_model(tmp_path, capsys, tiny, tiny_hf):
    out = tmp_path / "attn"
    rc = main(["attention", "--model", "tiny", "--question", QUESTION, "--layers", "0", "--heads", "0,3",
               "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert str(out.resolve()) in printed and "attention_received_L0.html" in printed
    summary = check_attention_output(out, tiny, tiny_hf, [0, 3])
    assert summary["model"] == "lensprobe-tiny-llama"


def test_attention_on_embedded_model(tmp_path, capsys, smol, smol_hf):
    out = tmp_path / "attn"
    rc = main(["attention", "--question", QUESTION, "--layers", "0", "--heads", "0,4", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert str(out.resolve()) in printed and "attention_received_L0.html" in printed
    summary = check_attention_output(out, smol, smol_hf, [0, 4])
    assert summary["model"].startswith("SmolLM2-135M-Instruct")


def test_bad_filler_is_a_usage_error(capsys):
    assert main(["attention", "--question", "x", "--compare", "loud"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'loud'" in err and "meaningless" in err


def test_bad_heads_and_missing_question(capsys):
    assert main(["attention", "--question", "x", "--heads", "a,b"]) == 2
    assert "'a' is not a head label" in capsys.readouterr().err
    assert main(["attention"]) == 2
    assert "--question" in capsys.readouterr().err


def test_layer_out_of_range_is_one_clear_line(tmp_path, capsys):
    rc = main(["attention", "--model", "tiny", "--question", "x", "--layers", "2", "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "layer 2 out of range: model has 2 layers (0-1)" in err
    assert "Traceback" not in err
    assert main(["attention", "--model", "tiny", "--question", "x", "--heads", "4", "--out", str(tmp_path)]) == 2
    assert "head 4 out of range" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.slow  # launches a Python process
def test_missing_model_file_exit_code_2_from_console_script(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lensprobe.app.cli", "attention", "--model", str(tmp_path / "nope.gguf"),
         "--question", "x", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "lensprobe: error:" in proc.stderr and "not found" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_parsers():
    assert int_list("0,1,7") == [0, 1, 7] and int_list(" 3 ") == [3]
    assert layer_list("all") is None and layer_list("2,5") == [2, 5]
    with pytest.raises(argparse.ArgumentTypeError, match="expected comma-separated integers such as 0,1,7, got 'x'"):
        int_list("x")
    assert main(["--version"]) == 0


# ----- ablate and sweep -------------------------------------------------------------------------
@pytest.fixture()
def cli_on_tiny(tiny, monkeypatch):
    monkeypatch.setattr("lensprobe.app.commands.heads.load_cli_model", lambda args: tiny)
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
    code = cli_on_tiny(["sweep", "--metric", "entropy", "--question", "What is 12+7?", "--heads-per-forward", "3",
                        "--out", str(out)])
    assert code == 0
    table = pd.read_csv(out / "sweep.csv", index_col="layer")
    p = lp.build_prompt(tiny, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    res = lp.ablation_sweep(tiny, p, "entropy", progress=False)
    assert table.to_numpy() == pytest.approx(res.table.to_numpy(), abs=1e-5)
    assert (out / "sweep_heatmap.html").is_file() and json.loads((out / "sweep.json").read_text())["heads_swept"] == 8


@pytest.mark.parametrize("metric, extra", [("logit_diff", ["--tokens", "5,9"]), ("attention:system", [])])
def test_cli_sweep_takes_every_metric_of_the_vocabulary(cli_on_tiny, tiny, tmp_path, metric, extra):
    out = tmp_path / "sw"
    code = cli_on_tiny(["sweep", "--metric", metric, *extra, "--question", "What is 12+7?", "--heads", "L0H1,L1H2",
                        "--out", str(out)])
    assert code == 0
    table = pd.read_csv(out / "sweep.csv", index_col="layer")
    p = lp.build_prompt(tiny, "What is 12+7?", system=lp.MATH_SYSTEM_PROMPT)
    res = lp.ablation_sweep(tiny, p, metric, heads=["L0H1", "L1H2"], tokens=(5, 9) if extra else None, progress=False)
    assert table.to_numpy() == pytest.approx(res.table.to_numpy(), abs=1e-5, nan_ok=True)


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


# ----- trace -----------------------------------------------------------------------------------
def test_cli_trace_writes_traces_summary_and_figure(tmp_path, capsys):
    out = tmp_path / "trace"
    rc = main(["trace", "--model", "tiny", "--question", "What is 2+3?", "--max-new-tokens", "12",
               "--think", "fusion,pause,none", "--schedule", "first:2+every:4", "--out", str(out)])
    assert rc == 0
    cap = capsys.readouterr()
    assert "tok/s" in cap.err  # the progress bar reports tokens per second
    names = {"trace-latentfusion-alpha-0-6.parquet", "trace-pause.parquet", "trace-no-thinking.parquet",
             "summary.csv", "texts.csv", "trace.html", "plotly.min.js"}
    assert names <= {p.name for p in out.iterdir()}
    fusion = lp.generation.load_trace(out / "trace-latentfusion-alpha-0-6.parquet")
    assert fusion.thinking.nonzero().flatten().tolist() == [0, 1, 3, 7, 11]
    assert fusion.meta["thinking"]["alpha"] == 0.6 and set(fusion.attention) == {"system", "question", "thinking"}
    none = lp.generation.load_trace(out / "trace-no-thinking.parquet")
    assert not none.thinking.any() and "thinking" not in none.attention
    summary = pd.read_csv(out / "summary.csv")
    ent = summary.query("condition == 'Pause' and metric == 'entropy'").sort_values("step")["mean"]
    pause = lp.generation.load_trace(out / "trace-pause.parquet")
    assert ent.tolist() == pytest.approx(pause.entropy[: len(ent)].tolist(), abs=1e-5)
    assert set(summary.query("metric == 'attention'")["condition"]) == {"LatentFusion (alpha=0.6)", "Pause"}
    assert "trace.html" in cap.out


def test_cli_trace_json_and_bad_input(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["trace", "--model", "tiny", "--question", "Hi", "--max-new-tokens", "3", "--think", "none",
                 "--format", "json", "--out", str(out)]) == 0
    body = json.loads((out / "trace-no-thinking.json").read_text())
    assert body["format"] == "lensprobe.generation.GenerationTrace" and body["n_rows"] == 1
    capsys.readouterr()
    assert main(["trace", "--model", "tiny", "--question", "Hi", "--think", "bogus", "--out", str(out)]) == 2
    assert "unknown thinking setting 'bogus'" in capsys.readouterr().err
    assert main(["trace", "--model", "tiny", "--question", "Hi", "--schedule", "every:x", "--out", str(out)]) == 2
    assert "cannot read schedule part" in capsys.readouterr().err
    assert main(["trace", "--model", "tiny", "--question", "Hi", "--max-new-tokens", "100000",
                 "--out", str(out)]) == 2
    assert "exceeds the model's context" in capsys.readouterr().err


def test_cli_trace_records_hook_points_per_step(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["trace", "--model", "tiny", "--question", "Hi", "--max-new-tokens", "4", "--think", "none",
                 "--record", "blocks.*.hook_resid_post", "--out", str(out)]) == 0
    assert "2 hook points recorded per step" in capsys.readouterr().out
    trace = lp.generation.load_trace(out / "trace-no-thinking.parquet")
    assert sorted(trace.activations) == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert trace.activations["blocks.1.hook_resid_post"].shape == (trace.lengths[0], 64)
    assert main(["trace", "--model", "tiny", "--question", "Hi", "--max-new-tokens", "4", "--think", "none",
                 "--record", "blocks.0.hook_nothing", "--out", str(tmp_path / "u")]) == 2
    assert "no hook point of this model is named 'blocks.0.hook_nothing'" in capsys.readouterr().err


def test_device_and_dtype_arguments_reach_load_model():
    import torch

    from lensprobe.app.common import add_model_argument, load_cli_model
    from lensprobe.app.parsing import new_parser

    parser = new_parser()
    add_model_argument(parser)
    args = parser.parse_args(["--model", "tiny", "--device", "meta", "--dtype", "bf16"])
    model = load_cli_model(args, progress=False)
    assert {(p.device.type, p.dtype) for p in model.parameters()} == {("meta", torch.bfloat16)}
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "int8"])
