"""What every ``lensprobe`` subcommand shares: the ``--model`` and prompt arguments, loading the
model (with a progress bar), parsing lists, writing figures and listing written files."""

import argparse
from collections.abc import Sequence
from pathlib import Path

from tqdm.auto import tqdm

from lensprobe.core.conditions import BUILTIN_CONDITIONS, canonical_condition_name
from lensprobe.core.models import load_model
from lensprobe.core.prompts import MATH_SYSTEM_PROMPT
from lensprobe.core.testing import tiny_model

TEST_MODEL = "tiny"
"""``--model tiny``: lensprobe's tiny random test model (seeded; answers are gibberish)."""

MODEL_HELP = ("model path (.gguf or HF folder) or hub name; default: the embedded SmolLM2-135M-Instruct; "
              f"'{TEST_MODEL}': a tiny random test model")


def int_list(text: str) -> list[int]:
    """Parse ``"0,1,7"`` (or ``"3"``) into ints, for ``--layers``/``--heads``."""
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 0,1,7, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer, e.g. 0")
    return values


def layer_list(text: str) -> list[int] | None:
    """Like :func:`int_list`, and ``"all"`` for every layer (``None``)."""
    return None if text.strip().lower() == "all" else int_list(text)


def str_list(text: str) -> list[str]:
    """Parse ``"Algebra, Geometry"`` into ``["Algebra", "Geometry"]``."""
    return [v.strip() for v in text.split(",") if v.strip()]


FILLER_ALIASES = ("none", "meaningless", "meaningful", "random")
"""The older ``--filler`` spellings, still accepted (``none`` is ``w/o``, ``meaningless`` is ``w/ Mless``, ...)."""


def filler_condition(choices: tuple[str, ...] = tuple(BUILTIN_CONDITIONS)):
    """An argparse ``type`` for ``--filler``: a built-in condition among ``choices``, any spelling,
    returned in its canonical spelling (``"meaningless"`` -> ``"w/ Mless"``)."""
    def parse(text: str) -> str:
        name = canonical_condition_name(text)
        if name not in choices:
            old = [a for a in FILLER_ALIASES if canonical_condition_name(a) in choices]
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r} (choose from {', '.join(repr(c) for c in choices)}; "
                f"or the older {', '.join(old)})")
        return name

    parse.__name__ = "filler condition"
    return parse


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """``--model``: a path, hub name, ``tiny``, or nothing for the embedded model."""
    parser.add_argument("--model", default=None, help=MODEL_HELP)


def add_system_arguments(parser: argparse.ArgumentParser) -> None:
    """``--system`` (default: the paper's MATH prompt) and ``--no-system``."""
    parser.add_argument("--system", default=MATH_SYSTEM_PROMPT,
                        help="system prompt (default: the paper's MATH prompt)")
    parser.add_argument("--no-system", action="store_true", help="no system prompt")


def system_of(args) -> str | None:
    """The system prompt the ``--system``/``--no-system`` arguments ask for."""
    return None if args.no_system else args.system


def load_cli_model(name: str | None, *, progress: bool = True):
    """``--model``: ``tiny`` (test model), or anything :func:`lensprobe.load_model` takes."""
    with tqdm(total=1, desc="loading model", leave=False, disable=not progress) as bar:
        model = tiny_model(seed=0) if name == TEST_MODEL else load_model(name)
        bar.update()
    return model


def write_figure(fig, path: Path) -> Path:
    """Write a plotly figure as HTML, with ``plotly.min.js`` once beside it (works offline)."""
    fig.write_html(path, include_plotlyjs="directory", full_html=True)
    return path


def print_files(out: Path, files: Sequence[Path]) -> None:
    """List the files a command wrote (``plotly.min.js`` included when it is there)."""
    files = list(files)
    if (out / "plotly.min.js").exists() and out / "plotly.min.js" not in files:
        files.append(out / "plotly.min.js")
    print(f"wrote {len(files)} files to {out.resolve()}:")
    for f in files:
        print(f"  {f.name}")
