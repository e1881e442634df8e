"""The data is part of the verdict: which problem file a benchmark's cell ran, by content, against the benchmark's
published file.

``lensprobe/evals/papers/arm-2510.01032-data.toml`` ships, per benchmark the paper evaluates, its published problem
file: the number of problems, the size and the SHA-256 of the file's bytes, and where it comes from (MATH-500:
lensprobe's own copy; AIME: the AIME 2022-2024 and AIME 2025 files; the authors' own AIME 2024 Parquet file is not
published, its digest is ``"unknown"``). :func:`load_benchmark` reads a benchmark's problems (lensprobe's MATH-500
copy, or a file given) and records what it read (:func:`data_facts`: path, size, problems, SHA-256);
:func:`data_reasons` says why those problems are not the benchmark's published ones (``[]`` when they are).

Problem ids come from the benchmark named, never from the file's name: a file without ids read as ``aime2024``
gives ``aime2024-0`` ..., whatever it is called.

Example:
    >>> problems, facts = load_benchmark("math500")
    >>> data_reasons("math500", facts)
    []
"""

import dataclasses
import functools
import os
from importlib import resources
from pathlib import Path

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.files import DATA_LIMIT, check_file, file_sha256
from lensprobe.core.storage.nesting import parse_toml
from lensprobe.evals.problems.load import Problem, load_math500, load_problems, math500_path

__all__ = ["DATA_FILES", "data_facts", "data_readings", "data_reasons", "load_benchmark", "published_data"]

DATA_FILES = {"2510.01032": "arm-2510.01032-data.toml"}
"""arXiv id -> the data file of its benchmarks' published problem files (in ``lensprobe/evals/papers``)."""


@functools.cache
def published_data(arxiv: str = "2510.01032") -> dict[str, dict]:
    """The published problem file of every benchmark the paper evaluates (with a problem file lensprobe can run):
    ``name``, ``problems``, ``size``, ``sha256``, ``file``, ``source`` (and for AIME 2024 the authors' own file,
    ``authors_file`` and ``authors_sha256``, ``"unknown"``, and lensprobe's ``reading``).

    Raises:
        LensprobeError: a paper lensprobe has no data for.

    Example:
        >>> published_data()["aime2025"]["problems"]
        30
    """
    if arxiv not in DATA_FILES:
        raise LensprobeError(f"no benchmark data for arXiv {arxiv!r}: lensprobe has {tuple(DATA_FILES)}.")
    text = resources.files("lensprobe.evals").joinpath("papers").joinpath(DATA_FILES[arxiv]).read_text(encoding="utf-8")
    return dict(parse_toml(text, f"benchmark data {DATA_FILES[arxiv]}")["benchmarks"])


def data_facts(path: str | os.PathLike, problems: int) -> dict:
    """What a cell's problems were read from: ``path`` (the file as given, resolved), ``size`` (bytes),
    ``problems`` (the problems the file holds) and ``sha256`` (of the file's bytes).

    Example:
        >>> data_facts(lp.evals.math500_path(), 500)["sha256"][:8]
        '35dc4108'
    """
    path = Path(path).expanduser().resolve()
    size = check_file(path, "problem file", DATA_LIMIT)
    return {"path": str(path), "size": size, "problems": problems, "sha256": file_sha256(path, "problem file")}


def load_benchmark(benchmark: str, path: str | os.PathLike | None = None) -> tuple[list[Problem], dict]:
    """The problems of ``benchmark`` and what they were read from (:func:`data_facts`).

    Args:
        benchmark: lensprobe's benchmark key (``"math500"``, ``"aime2024"``, ``"aime2025"``).
        path: the problem file (JSONL or Parquet); ``None``: lensprobe's MATH-500 copy (``math500`` only).

    Problems without an id of their own are named after the benchmark (``"aime2024-0"`` ...), never after the file.

    Raises:
        LensprobeError: no file for a benchmark lensprobe does not ship, or a file that cannot be read.

    Example:
        >>> problems, facts = load_benchmark("aime2024", "aime2025.jsonl")
        >>> problems[0].id
        'aime2024-0'
    """
    if path is None:
        if benchmark != "math500":
            raise LensprobeError(f"lensprobe ships no problems of {benchmark}: give its problem file.")
        problems = load_math500()
        return problems, data_facts(math500_path(), len(problems))
    path = Path(path).expanduser()
    problems = load_problems(path)
    stem = f"{path.stem}-"
    problems = [dataclasses.replace(p, id=f"{benchmark}-{p.id.removeprefix(stem)}")
                if p.id == f"{stem}{i}" else p for i, p in enumerate(problems)]
    return problems, data_facts(path, len(problems))


def data_reasons(benchmark: str, facts: dict | None, arxiv: str = "2510.01032") -> list[str]:
    """Why the problems a cell ran (``facts``: :func:`data_facts`) are not ``benchmark``'s published file; ``[]``
    when their digest is the published one.

    Example:
        >>> data_reasons("aime2024", {"path": "a.jsonl", "size": 10, "problems": 30, "sha256": "dee9..."})[0][:40]
        'the problems file a.jsonl (30 problems, '
    """
    known = published_data(arxiv)
    if facts is None:
        return [f"the problems file {benchmark} ran is not recorded, so the data cannot be checked"]
    spec = known.get(benchmark)
    if spec is not None and facts["sha256"] == spec["sha256"]:
        return []
    what = (f"the problems file {facts['path']} ({facts['problems']} problems, {facts['size']:,} bytes, SHA-256 "
            f"{facts['sha256'][:16]}...)")
    if spec is None:
        return [f"{what}: lensprobe knows no published file of {benchmark}, so the data cannot be checked"]
    other = next((k for k, s in known.items() if s["sha256"] == facts["sha256"]), None)
    also = f"; it is the published file of {known[other]['name']} ({other})" if other else ""
    return [f"{what} is not {spec['name']}'s published file (SHA-256 {spec['sha256'][:16]}..., {spec['problems']} "
            f"problems: {spec['source']}){also}"]


def data_readings(benchmark: str, arxiv: str = "2510.01032") -> list[str]:
    """lensprobe's readings the benchmark's data rests on (AIME 2024: which set the authors' "AIME2024" is)."""
    spec = published_data(arxiv).get(benchmark) or {}
    return [spec["reading"]] if spec.get("reading") else []
