"""The hostile-input harness's parts: every public function and every command, enumerated from the public
API and the command's parser; hostile values by family (paths that are not files, text with control
tokens and invisible characters, numbers at and beyond bounds, wrong types, deep or huge nesting); a
sandbox folder each call runs in; a per-call time limit (tests/test_hostile_harness.py runs them)."""

import argparse
import contextlib
import importlib
import inspect
import os
import signal
import tempfile
import time
from pathlib import Path

from hypothesis import strategies as st

import lensprobe as lp

NAMESPACES = ("models", "prompts", "interventions", "metrics", "generation", "experiments", "studies", "evals", "viz")
ROOT = Path(__file__).resolve().parents[1]
CALL_LIMIT = 20
"""Seconds one call may take: a call still running then is a hang."""
DEEP = 100_000
"""Depth of the deep texts and files (a file's nesting costs nothing to make)."""
DEEP_OBJECTS = 5_000
"""Depth of deep Python lists and dicts: five times Python's recursion limit."""
MODEL_PARAMETERS = {("load_model", "name")}
"""Parameters besides ``model`` that name the model (always the tiny test model, never the embedded one)."""
FAMILIES = ("paths", "text", "numbers", "types", "nesting")
"""The hostile families; each maps to the parameter kinds it attacks (``None``: every parameter)."""
ATTACKS = {"paths": {"path"}, "text": {"text"}, "numbers": {"number"}, "types": None, "nesting": None}
FILES = ("folder", "fifo", "loop", "missing", "garbage", "deep.json")
"""The sandbox's paths that are not usable files: a folder, a FIFO, a symlink loop, a missing file, a file
of garbage bytes, JSON nested 100,000 deep."""
CONTROL = ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "\u200b", "\ufeff", "\u202e", "\ud800", "\x00", "\n", "")


class Hung(BaseException):
    """A call outlived :data:`CALL_LIMIT` (a ``BaseException``: no ``except Exception`` swallows it)."""


def public_functions() -> dict[str, object]:
    """Every public function, by its public path (a shortcut's path is its namespace's)."""
    found: dict[int, tuple[str, object]] = {}
    for ns in NAMESPACES:
        module = importlib.import_module(f"lensprobe.{ns}")
        for name in module.__all__:
            found.setdefault(id(getattr(module, name)), (f"lp.{ns}.{name}", getattr(module, name)))
    for name in lp.__all__:
        found.setdefault(id(getattr(lp, name)), (f"lp.{name}", getattr(lp, name)))
    return {path: obj for path, obj in sorted(found.values()) if inspect.isfunction(obj)}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return dict(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)


def kind(name: str, annotation: object, function: str = "") -> str:
    """A parameter's kind from its name and annotation: model, path, number, text or other."""
    text = str(annotation)
    if name == "model" or (function, name) in MODEL_PARAMETERS:
        return "model"
    if "Path" in text or name in ("out", "path", "paths", "folder") or name.endswith(("_dir", "_path", "_file")):
        return "path"
    if "str" in text:
        return "text"
    if ("int" in text or "float" in text) and "bool" not in text.replace("| bool", ""):
        return "number"
    return "other"


def parameters(fn) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def targets(fn, family: str) -> list[str]:
    """The parameters of ``fn`` that ``family`` attacks (the model never: it stays the tiny test model)."""
    wanted = ATTACKS[family]
    kinds = {p.name: kind(p.name, p.annotation, fn.__name__) for p in parameters(fn)}
    return [name for name, k in kinds.items() if k != "model" and (wanted is None or k in wanted)]


def prepare(sandbox: Path) -> None:
    """The :data:`FILES` in ``sandbox``."""
    (sandbox / "folder").mkdir()
    os.mkfifo(sandbox / "fifo")
    os.symlink("loop", sandbox / "loop")
    (sandbox / "garbage").write_bytes(bytes(range(256)) * 4)
    (sandbox / "deep.json").write_text("[" * DEEP + "]" * DEEP)


def deep_list(depth: int) -> list:
    out: list = []
    for _ in range(depth):
        out = [out]
    return out


def values(family: str, kind_: str = "other") -> st.SearchStrategy:
    """Hostile Python values of ``family`` (paths are names in the sandbox, made absolute by the runner)."""
    if family == "paths":
        return st.sampled_from(FILES).map(lambda name: ("sandbox", name))
    if family == "text":
        return st.lists(st.sampled_from(CONTROL + ("What is 2+3?", "L0H1", "w/o")), min_size=0, max_size=4).map("".join)
    if family == "numbers":
        return st.sampled_from((0, -1, 10**18, 2**63, float("nan"), float("inf"), -float("inf"), 1e308))
    if family == "types":
        return st.sampled_from(("3", True, [1], {"a": 1}, b"x", 2.5, ("sandbox", "folder"), object()))
    return st.sampled_from(("deep list", "deep dict", "huge list", "deep text"))


def materialise(value, sandbox: Path):
    """A drawn value made real: sandbox paths absolute, nesting built now (hypothesis keeps it small)."""
    if isinstance(value, tuple) and value[:1] == ("sandbox",):
        return sandbox / value[1]
    if value == "deep list":
        return deep_list(DEEP_OBJECTS)
    if value == "deep dict":
        out: dict = {}
        for _ in range(DEEP_OBJECTS):
            out = {"a": out}
        return out
    if value == "huge list":
        return [0] * 10**6
    if value == "deep text":
        return "[" * DEEP + "]" * DEEP
    return value


CLI_VALUES = {
    "paths": st.sampled_from(FILES).map(lambda name: ("sandbox", name)),
    "text": values("text"),
    "numbers": st.sampled_from(("0", "-1", "99999999999999999999", "1e400", "nan", "inf", "-inf")),
    "types": st.sampled_from(("abc", "[1]", "", "true", "3.5", "{}")),
    "nesting": st.sampled_from(("deep text", ("sandbox", "deep.json"))),
}
"""Hostile command-line values by family (strings, or sandbox paths)."""


def option_kind(action: argparse.Action) -> str:
    """A command-line option's kind, as :func:`kind` for a parameter."""
    names = " ".join([action.dest, *action.option_strings]).lower()
    if "model" in names:
        return "path"
    if any(w in names for w in ("out", "file", "dir", "data", "path", "recipe", "folder")):
        return "path"
    if action.type in (int, float) or getattr(action.type, "__name__", "") in ("positive_int", "int", "float"):
        return "number"
    return "text"


@contextlib.contextmanager
def time_limit(what: str):
    """Raise :class:`Hung` in a call running longer than :data:`CALL_LIMIT` (pytest-timeout's own alarm,
    if any, is put back with the time it had left)."""
    def on_alarm(signum, frame):
        raise Hung(f"{what} still ran after {CALL_LIMIT} s")

    start = time.monotonic()
    old = signal.signal(signal.SIGALRM, on_alarm)
    left, _ = signal.setitimer(signal.ITIMER_REAL, CALL_LIMIT)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if left:
            signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - start), 0.01))


def watched() -> list[Path]:
    """Folders a call must not write in: the repository, its tests and code, home, its cache folder."""
    home = Path.home()
    return [ROOT, ROOT / "tests", ROOT / "lensprobe", ROOT.parent / "shared", home, home / ".cache"]


def snapshot() -> set[str]:
    out = set()
    for folder in watched():
        with contextlib.suppress(OSError):
            out.update(str(folder / name) for name in os.listdir(folder))
    return out


@contextlib.contextmanager
def sandbox_run(root: Path, monkeypatch):
    """A fresh sandbox folder under ``root``, the working directory (temporary files and lensprobe's cache
    inside it); yields it; fails if a file appeared outside it."""
    box = Path(tempfile.mkdtemp(dir=root))
    prepare(box)
    before = snapshot()
    with monkeypatch.context() as m:
        m.chdir(box)
        m.setenv("LENSPROBE_CACHE", str(box / "cache"))
        m.setenv("TMPDIR", str(box))
        m.setattr(tempfile, "tempdir", str(box))
        yield box
    appeared = snapshot() - before
    assert not appeared, f"files written outside the call's folder: {sorted(appeared)}"
