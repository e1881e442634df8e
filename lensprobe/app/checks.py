"""Checks on command-line values that are not configuration fields, run before any model loads: argparse
types for the command line's own inputs (counts, lists, text, folders, filler and benchmark names) and the
checks every command shares (text arguments, devices). A configuration field is checked by its class's
``__post_init__`` while the command line is read. A bad value is one line and exit code 2 with the fix.

Every check here needs no model; what depends on the model (a layer beyond its depth, a prompt
beyond its context) is checked right after it loads, before any work.
"""

import argparse
import dataclasses
from pathlib import Path

from lensprobe.core.errors import LensprobeError
from lensprobe.core.models.devices import check_device
from lensprobe.core.prompts.conditions import BUILTIN_CONDITIONS, canonical_condition_name
from lensprobe.core.prompts.text import blank, surrogate_at
from lensprobe.interventions.arm_presets import benchmark_key

__all__ = ["FILLER_ALIASES", "benchmark_arg", "check_common", "check_text_arguments", "filler_condition",
           "head_list", "int_list", "out_folder", "positive_int", "str_list", "text", "whole"]

def whole(low: int = 1, high: int | None = None):
    """An argparse type: a whole number in ``[low, high]`` (ASCII digits only: ``'٣'`` is refused)."""
    def parse(value: str) -> int:
        stripped = value.strip()
        try:
            if not stripped.isascii():
                raise ValueError
            number = int(stripped)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if number < low or (high is not None and number > high):
            bound = f"between {low} and {high:,}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"expected a whole number {bound}, got {value}")
        return number

    parse.__name__ = "whole number"
    return parse


positive_int = whole(1)
"""A whole number >= 1 (``--batch-size``, ``--bins``, ``--smooth``, ...)."""

def int_list(text: str) -> list[int]:
    """Parse ``"0,1,7"`` (or ``"3"``) into distinct whole numbers >= 0, for ``--layers``/``--heads``/``--levels``."""
    parts = [v for v in text.replace(" ", "").split(",") if v != ""]
    if not all(v.isascii() and v.isdigit() for v in parts):
        bad = next((v for v in parts if v.lstrip("-").isascii() and v.lstrip("-").isdigit()), None)
        if bad is not None:
            raise argparse.ArgumentTypeError(f"{bad} is negative: layers and heads are counted from 0")
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 0,1,7, got {text!r}")
    values = [int(v) for v in parts]
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer, e.g. 0")
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{twice[0]} is given twice in {text!r}: name each once")
    return values


def str_list(text: str) -> list[str]:
    """Parse ``"Algebra, Geometry"`` into ``["Algebra", "Geometry"]``."""
    return [v.strip() for v in text.split(",") if v.strip()]


def text(value: str) -> str:
    """An argparse type: text that is not empty or only spaces (``--question``) or invisible characters."""
    if not value.strip():
        raise argparse.ArgumentTypeError("expected text, got an empty string")
    if blank(value):
        raise argparse.ArgumentTypeError(f"expected text, got only invisible characters ({value.encode('unicode_escape').decode()}: "
                                         "zero-width spaces, U+FEFF, ...)")
    return value


def head_list(value: str) -> str:
    """An argparse type: a head list with at least one label (``--heads ""`` would ablate nothing)."""
    if not value.replace(",", "").strip():
        raise argparse.ArgumentTypeError(f"expected at least one head, e.g. L0H1, got {value!r} (an empty list "
                                         "would ablate nothing; to run without ablation leave the flag out)")
    return value


def out_folder(value: str) -> Path:
    """An argparse type: a folder path, not empty (``--out ""`` would write into the current folder)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("expected a folder path, got an empty string (use --out . for the current "
                                         "folder)")
    return Path(value)


def _values(args: argparse.Namespace) -> list[tuple[str, object]]:
    """``(name, value)`` of every field of the configuration objects in ``args`` and of the plain values beside
    them (a field's name, not a flat namespace: two objects may hold fields of one name)."""
    out: list[tuple[str, object]] = []
    for dest, value in vars(args).items():
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
        else:
            out.append((dest, value))
    return out


def check_text_arguments(args: argparse.Namespace) -> None:
    """Refuse any argument holding bytes that are not UTF-8 (they reach Python as lone surrogates).

    Raises:
        LensprobeError: names the argument and where the bad bytes are.
    """
    for dest, value in _values(args):
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(item, (str, Path)):
                continue
            at = surrogate_at(str(item))
            if at is not None:
                name = dest if dest == "dirs" else "--" + dest.replace("_", "-")
                raise LensprobeError(f"{name} holds bytes that are not UTF-8 text (at character {at}: "
                                     f"{str(item).encode('utf-8', 'surrogateescape')[at:at + 4]!r}): pass it as "
                                     "UTF-8 (rename a file or folder with such a name).")


def check_common(args: argparse.Namespace) -> None:
    """The checks every command shares, before its model loads: text arguments, ``--device``,
    and ``--system`` given with ``--no-system``.

    Raises:
        LensprobeError: the first bad value.
    """
    check_text_arguments(args)
    model, system = getattr(args, "ModelOptions", None), getattr(args, "SystemOptions", None)
    if model is not None and model.device is not None:
        check_device(model.device)
    if system is not None and system.no_system and system.system is not None:
        raise LensprobeError("--no-system and --system were both given: drop one (--no-system runs without a "
                             "system prompt).")


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


def benchmark_arg(text: str) -> str:
    """An argparse ``type``: a benchmark name as lensprobe's key (``MATH-500`` -> ``math500``)."""
    try:
        return benchmark_key(text)
    except LensprobeError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
