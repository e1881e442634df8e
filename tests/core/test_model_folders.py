"""Incomplete Hugging Face model folders are refused, naming the problem and the fix, where transformers
would load them with random weights (a missing tensor), fail with an error that names neither (a truncated
safetensors file, a tensor of another shape, no tokenizer) or the command line would end in a traceback
(an unknown model_type)."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.core.errors import ModelLoadError
from lensprobe.core.models.folders import check_loading_info

Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    from lensprobe.core.models.testing import tiny_hf_model

    hf, tok = tiny_hf_model(seed=1, n_layers=1)
    folder = tmp_path_factory.mktemp("whole")
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def copy_of(whole, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(whole, folder)
    return folder


def rewrite_weights(folder, change):
    weights = load_file(folder / "model.safetensors")
    change(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def edit_config(folder, change):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(change(config)))


def truncate(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def no_tokenizer(folder):
    for path in folder.iterdir():
        if path.name.startswith("tokenizer") or path.name in ("special_tokens_map.json", "chat_template.jinja"):
            path.unlink()


def sharded_with_a_shard_missing(folder):
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    weights = {k: "model-00001-of-00002.safetensors" for k in load_file(folder / "model-00001-of-00002.safetensors")}
    weights[Q_PROJ] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weights}))


def fifo_in_place(path):
    path.unlink()
    os.mkfifo(path)


CASES = [
    ("a missing tensor", lambda f: rewrite_weights(f, lambda w: w.pop(Q_PROJ)),
     rf"model lacks 1 weight tensor\(s\) of the model \({Q_PROJ}\): transformers would fill them with random numbers"),
    ("a tensor of another shape", lambda f: rewrite_weights(f, lambda w: w.update({Q_PROJ: torch.zeros(3, 3)})),
     rf"model: weight {Q_PROJ} has shape \[3, 3\] but the model's config.json asks for \[64, 64\]"),
    ("a truncated safetensors file", truncate,
     r"model.safetensors is truncated: its header describes \d+ bytes but the file has \d+; copy or download it"),
    ("a header longer than the file", lambda f: (f / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}"),
     r"model.safetensors is truncated or not a safetensors file: its header length \d+ does not fit in its 10 "),
    ("no tokenizer", no_tokenizer, r"model holds no tokenizer \(none of tokenizer.json, .*tokenizer.save_pretrained"),
    ("an unknown model_type", lambda f: edit_config(f, lambda c: {**c, "model_type": "nosuchmodel"}),
     r"config.json names model_type 'nosuchmodel', which transformers [\d.]+ does not know: .*pip install -U"),
    ("a config.json that is a list", lambda f: edit_config(f, lambda c: [c]),
     r"config.json holds a JSON list, not the model's settings"),
    ("a shard its index lists is missing", sharded_with_a_shard_missing,
     r"model lacks 1 of the 2 weight files its model.safetensors.index.json lists \(model-00002-of-00002"),
    ("no weights", lambda f: (f / "model.safetensors").unlink(), r"model holds no weights \(no model.safetensors"),
    ("a FIFO as tokenizer.json", lambda f: fifo_in_place(f / "tokenizer.json"),
     r"model file .*tokenizer.json is a FIFO \(named pipe\), not a regular file"),
    ("a FIFO as config.json", lambda f: fifo_in_place(f / "config.json"),
     r"config.json is a FIFO \(named pipe\), not a regular file"),
]


@pytest.mark.parametrize(("damage", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_damaged_folder_is_refused_naming_the_problem(whole, tmp_path, damage, message):
    folder = copy_of(whole, tmp_path)
    damage(folder)
    with pytest.raises(lp.LensprobeError, match=message):
        lp.load_model(folder, device="cpu")


@pytest.mark.parametrize("case", [CASES[0], CASES[5]], ids=[CASES[0][0], CASES[5][0]])
def test_the_command_line_says_it_in_one_line_with_exit_2(whole, tmp_path, capsys, case):
    folder = copy_of(whole, tmp_path)
    case[1](folder)
    assert main(["attention", "--model", str(folder), "--question", "What is 2+3?", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected error" not in err and str(folder) in err


def test_a_whole_folder_loads_and_extra_tensors_are_left_alone(whole, tmp_path):
    folder = copy_of(whole, tmp_path)
    rewrite_weights(folder, lambda w: w.update({"model.unused.weight": torch.zeros(2)}))
    model = lp.load_model(folder, device="cpu")
    assert model.cfg.n_layers == 1


def test_the_loading_report_names_missing_tensors_beyond_four_by_count():
    info = {"missing_keys": {f"w{i}" for i in range(6)}, "unexpected_keys": {"x"}, "mismatched_keys": [],
            "error_msgs": []}
    with pytest.raises(ModelLoadError, match=r"here lacks 6 weight tensor\(s\) of the model \(w0, w1, w2, w3 and 2 "
                                             r"more\)"):
        check_loading_info(info, "here")
    check_loading_info({**info, "missing_keys": set()}, "here")  # unexpected tensors alone: accepted
