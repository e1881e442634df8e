"""The Python code blocks of README.md, CONTRIBUTING.md and docs/*.md run as tests (Sybil).

Every fenced block whose info string is exactly ``python`` is one test; the blocks of a page run in
order in one namespace (a page's first block loads the model the later ones use), in a fresh temporary
working folder, on one intra-op thread. A page whose blocks call ``lp.load_model(`` (the embedded
SmolLM2) is marked ``slow``, every block of it, so ``-m "not slow"`` runs a page whole or not at all;
the other pages run on the tiny random model (``lensprobe.core.models.testing.tiny_model``).

A block that only illustrates (it needs a GPU, the hub or a long run) is fenced as ``python notest``:
Sybil does not collect it (it is not a skipped test), ``tests/test_docs.py`` counts such blocks against
a recorded number, and the session summary prints both counts.

Converted models (the embedded SmolLM2, converted from its GGUF file on the first load) are kept in
pytest's cache folder (``.pytest_cache/d/lensprobe-models``), shared by every session and by the
processes tests start, never in the user's cache: see :func:`pytest_configure`.
"""

import os
import re
import tempfile
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

ROOT = Path(__file__).resolve().parent
DOC_PATTERNS = ("README.md", "CONTRIBUTING.md", "docs/*.md")
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def doc_pages() -> list[Path]:
    """The Markdown pages whose code blocks are tested, sorted."""
    return sorted(p for pattern in DOC_PATTERNS for p in ROOT.glob(pattern))


def fences(path: Path) -> list[tuple[str, str]]:
    """``(info string, body)`` of every fenced block of a page (not nested in another fence)."""
    return [(m["info"].strip(), m["body"]) for m in FENCE.finditer(path.read_text(encoding="utf-8"))]


def _is_slow(path: Path) -> bool:
    """Whether a tested block of the page calls ``lp.load_model(`` (in code, not in a comment)."""
    return any(info == "python" and "lp.load_model(" in line.split("#")[0]
               for info, body in fences(path) for line in body.splitlines())


def _setup(namespace):
    import torch

    namespace["__threads"] = torch.get_num_threads()
    namespace["__cwd"] = os.getcwd()
    torch.set_num_threads(1)  # small matrices, a shared 2-core machine: see tests/conftest.py
    os.chdir(tempfile.mkdtemp(prefix="lensprobe-docs-"))  # blocks write their figures and CSVs here


def _teardown(namespace):
    import torch

    os.chdir(namespace["__cwd"])
    torch.set_num_threads(namespace["__threads"])


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser()],  # info string exactly "python": "python notest" is not collected
    patterns=list(DOC_PATTERNS),
    path=str(ROOT),
    setup=_setup,
    teardown=_teardown,
    name="docs",
).pytest()


def pytest_configure(config):
    """Point ``$LENSPROBE_CACHE`` at a folder of pytest's cache (a temporary folder without pytest's
    cache plugin): the suite converts the embedded model once, not once per session, and never writes
    into the user's cache (``~/.cache/lensprobe``). The folder is keyed by content and versions like the
    user's, so environments with other package versions share it safely."""
    cache = getattr(config, "cache", None)
    folder = cache.mkdir("lensprobe-models") if cache is not None else Path(tempfile.mkdtemp(prefix="lensprobe-models-"))
    os.environ["LENSPROBE_CACHE"] = str(folder)


def pytest_collection_modifyitems(config, items):
    slow = {}
    for item in items:
        path = Path(str(item.path))
        if path.suffix == ".md":
            if path not in slow:
                slow[path] = _is_slow(path)
            if slow[path]:
                item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter):
    ran = [r for key in ("passed", "failed", "error") for r in terminalreporter.stats.get(key, [])
           if str(getattr(r, "fspath", "")).endswith(".md") or ".md::" in r.nodeid]
    if not ran:
        return
    illustrative = sum(info == "python notest" for page in doc_pages() for info, _ in fences(page))
    terminalreporter.write_line(f"doc code blocks: {len(ran)} run; {illustrative} illustrative blocks "
                                "(python notest) not collected")
