"""Hostile input, round four: a model whose weights hold a NaN is refused before any forward, naming the
weight, in every command (each loads through lensprobe.load_model) and in the library."""

import json
import re
import shlex

import pytest
import torch

import lensprobe as lp
from lensprobe.app import common
from lensprobe.app.cli import main
from lensprobe.core.errors import ModelLoadError
from lensprobe.core.models.testing import tiny_hf_model, tiny_model


@pytest.fixture(scope="module")
def nan_folder(tmp_path_factory):
    """A tiny Llama saved as a Hugging Face folder with one NaN in layer 1's query weights."""
    hf, tok = tiny_hf_model(seed=3)
    with torch.no_grad():
        hf.model.layers[1].self_attn.q_proj.weight[0, 0] = float("nan")
    folder = tmp_path_factory.mktemp("nan-model")
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture
def no_forward(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a forward ran on NaN weights")

    monkeypatch.setattr(torch.nn.Module, "__call__", refuse)


@pytest.mark.parametrize("command", ["attention --question hi --layers 0", "ablate --question hi --heads L0H0",
                                     "trace --question hi --max-new-tokens 2"])
def test_every_command_names_a_nan_weight_before_any_forward(nan_folder, command, tmp_path, capsys, no_forward):
    rc = main([*shlex.split(command), "--model", str(nan_folder), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc != 0 and "model.layers.1.self_attn.q_proj.weight holds 1 NaN or infinite value(s)" in err, err
    assert not (tmp_path / "out").exists()


def test_load_model_names_the_weight_of_a_model_given_loaded():
    model = tiny_model(seed=0)
    name, param = next(iter(model.named_parameters()))
    with torch.no_grad():
        param.view(-1)[3] = float("inf")
    shown = name.replace("._original_component", "")  # the Hugging Face name, not the bridge's wrapping
    with pytest.raises(ModelLoadError, match=rf"the weight {re.escape(shown)} holds 1 NaN or infinite"):
        lp.load_model(model)


def test_demo_into_a_folder_whose_listing_leaves_it_deletes_nothing_and_fails(tmp_path, capsys, monkeypatch):
    """``lensprobe demo --out X`` deleted what X/report.json listed outside X, with exit code 0."""
    def refuse(*args, **kwargs):
        raise AssertionError("the demo loaded a model before refusing the listing")

    monkeypatch.setattr(common, "tiny_model", refuse)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.csv").write_text("mine")
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text(json.dumps({"sections": [{"slug": "victim", "files": ["../victim/keep.csv"]}]}))
    rc = main(["demo", "--model", "tiny", "--quick", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "lists a file outside the report folder" in err and err.count("\n") == 1, err
    assert (victim / "keep.csv").read_text() == "mine"
