"""The package layout: the public API, one version, heavy libraries on first use, the CLI's old spellings."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.app.common import filler_condition
from lensprobe.core.hooks.attach import ActivationRecorder, AttentionRecorder, intervene
from lensprobe.core.hooks.forward import as_tokens
from lensprobe.core.lazy import HEAVY, heavy

ROOT = Path(__file__).resolve().parents[1]


def test_version_is_the_projects():
    """One version, set in ``lensprobe/core/version.py``: the package's metadata is built from it."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    from lensprobe.core import version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lensprobe.core.version.__version__"}
    assert lp.__version__ is version.__version__ == "0.5.0"
    assert re.fullmatch(r"\d+\.\d+\.\d+", lp.__version__)
    assert re.search(r"^## 0\.5\.0\b", (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8"), re.M)


def test_every_public_name_exists():
    assert len(set(lp.__all__)) == len(lp.__all__)
    for name in lp.__all__:
        assert getattr(lp, name) is not None, name
    assert callable(lp.evals.accuracy) and callable(lp.generation.schedule.every) and lp.Condition is lp.prompts.Condition


@pytest.mark.slow  # launches a Python process
def test_import_lensprobe_loads_no_heavy_library():
    code = ("import sys, lensprobe\n"
            "print([m for m in ('plotly', 'pandas', 'circuitsvis', 'pyarrow', 'datasets', 'math_verify') "
            "if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_heavy_imports_only_the_listed_libraries():
    assert heavy("pandas").DataFrame is not None and "pandas" in HEAVY
    with pytest.raises(ValueError, match="import it at the top"):
        heavy("json")


def test_as_tokens_one_row(tiny):
    assert as_tokens(tiny, [1, 2, 3], one_row=True).shape == (1, 3)
    with pytest.raises(lp.LensprobeError, match="one prompt at a time"):
        as_tokens(tiny, torch.tensor([[1, 2], [3, 4]]), one_row=True)


def test_recorders_record_the_same_way(tiny):
    p = lp.build_prompt(tiny, "What is 12+7?")
    att = AttentionRecorder(layers=[1])
    act = ActivationRecorder(["blocks.1.attn.hook_pattern"])
    summed = ActivationRecorder(["blocks.1.attn.hook_pattern"], reduce=lambda a: a.sum(-1))
    with intervene(tiny, att, act, summed):
        tiny(p.tokens)
    torch.testing.assert_close(att.patterns[1], act.acts["blocks.1.attn.hook_pattern"])
    torch.testing.assert_close(summed.acts["blocks.1.attn.hook_pattern"], torch.ones(1, 4, len(p)))


def test_cli_filler_takes_canonical_names_and_old_spellings(capsys):
    parse = filler_condition()  # the same four conditions in every command
    assert [parse(s) for s in ("none", "meaningless", "Mful", "w/ Mless", "random")] == [
        "w/o", "w/ Mless", "w/ Mful", "w/ Mless", "random sentence"]
    assert main(["attention", "--question", "x", "--compare", "loud"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'loud'" in err and "w/ Mless" in err and "meaningless" in err
    assert main(["ablate", "--heads", "L0H1", "--question", "x", "--filler", "loud", "--out", "o"]) == 2
    assert "invalid choice: 'loud'" in capsys.readouterr().err
