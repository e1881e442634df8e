"""The published numbers of the papers lensprobe reproduces, as data shipped in the package.

``lensprobe/evals/papers/arm-2510.01032.toml`` holds Tables 1, 2, 3a, 3b (= Table 6), 4, 5, 7 and 8 of
the meaningless-tokens paper (arXiv 2510.01032 v1) as printed; Table 9 (the ARM settings) is
:data:`~lensprobe.interventions.arm_presets.PAPER_TABLE9`. :func:`published_numbers` reads them as
one flat table, one :class:`PublishedNumber` per cell, each naming its table, model, benchmark
and the lensprobe condition its column corresponds to (``"w/o"``, ``"w/ Mless"``, ``"ARM"`` ...).
:func:`paper_models` gives the published configuration of each model the paper evaluates
(``lensprobe/evals/papers/arm-2510.01032-models.toml``, from each model's public ``config.json``).

Baselines differ between the paper's own tables (Llama-3.1-8B-Instruct on MATH-500 without
filler: 41.8 in Table 1, 35.4 in Table 5, 43.0 in Table 2): always show the table a number
comes from.
"""

import functools
import sys
from dataclasses import dataclass
from importlib import resources

from lensprobe.core.errors import LensprobeError
from lensprobe.core.lazy import pandas
from lensprobe.core.storage.nesting import parse_toml

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - Python 3.10
    pass

__all__ = ["PAPERS", "PROTOCOL_FIELDS", "PublishedNumber", "check_published_table", "paper_models", "published_numbers",
           "published_table", "table_protocol", "table_readings"]

PAPERS = {"2510.01032": "arm-2510.01032.toml"}
"""arXiv id -> the data file of its published numbers (in ``lensprobe/evals/papers``)."""
MODEL_FILES = {"2510.01032": "arm-2510.01032-models.toml"}
"""arXiv id -> the data file of its models' published configurations (in ``lensprobe/evals/papers``)."""


PROTOCOL_FIELDS = ("lensprobe", "format", "sampling", "runs", "metric", "samples", "source")
"""What every published table's ``protocol`` records (``max_new_tokens`` too where the table's numbers were
generated; ``runs_reading`` where the table does not state its runs)."""


@dataclass(frozen=True)
class PublishedNumber:
    """One cell of a paper's table.

    Attributes:
        arxiv: the paper's arXiv id.
        table: the table as printed (``"1"``, ``"3a"``).
        model: the model as the paper names it (``"Qwen2.5-Math-1.5B"``).
        benchmark: lensprobe's benchmark key (``"math500"``, ``"aime2024"`` ...).
        condition: the lensprobe condition of the column or row (``"w/o"``, ``"w/ Mless"``, ``"ARM"``,
            or the paper's own label where lensprobe has no such condition).
        value: percent as printed; ``None`` for a cell the paper prints as ``"-"``.
        text: the cell as lensprobe shows it: the number, or what the table's ``"-"`` means
            (Table 2: ``"< 5"``, below 5%; ``""`` where the table does not say).
    """

    arxiv: str
    table: str
    model: str
    benchmark: str
    condition: str
    value: float | None
    text: str = ""


@functools.cache
def _load(arxiv: str, files: tuple[tuple[str, str], ...] = tuple(PAPERS.items())) -> dict:
    names = dict(files)
    if arxiv not in names:
        raise LensprobeError(f"no published numbers for arXiv {arxiv!r}: lensprobe has {tuple(names)}.")
    text = resources.files("lensprobe.evals").joinpath("papers").joinpath(names[arxiv]).read_text(encoding="utf-8")
    return parse_toml(text, f"published numbers {names[arxiv]}")


def _cells(arxiv: str, table: str, spec: dict) -> list[PublishedNumber]:
    out = []
    for row in spec["rows"]:
        label, values = row[0], row[1:]
        if len(values) != len(spec["columns"]):
            raise LensprobeError(f"table {table} of {arxiv}: row {label!r} has {len(values)} cells for "
                                 f"{len(spec['columns'])} columns (a damaged data file).")
        for col, value in zip(spec["columns"], values, strict=True):
            cell = {"model": spec.get("model"), **col, spec["row"]: label}
            number = None if value == "-" else float(value)
            out.append(PublishedNumber(arxiv=arxiv, table=table, model=cell["model"], benchmark=cell["benchmark"],
                                       condition=cell.get("condition", ""), value=number,
                                       text=spec.get("dash", "") if number is None else f"{number:g}"))
    return out


def published_numbers(arxiv: str = "2510.01032") -> list[PublishedNumber]:
    """Every published number of the paper, table by table in the paper's order.

    Raises:
        LensprobeError: a paper lensprobe has no numbers for.

    Example:
        >>> [n.value for n in published_numbers() if n.table == "1" and n.model == "Qwen2.5-Math-7B"]
        [72.3, 74.6, 23.1, 23.3]
    """
    data = _load(arxiv)
    return [cell for table, spec in data["tables"].items() for cell in _cells(arxiv, table, spec)]


def published_table(table: str, arxiv: str = "2510.01032"):
    """One table of published numbers as a DataFrame (columns ``table``, ``model``, ``benchmark``,
    ``condition``, ``value``, ``text``).

    Raises:
        LensprobeError: the paper has no such table in lensprobe's data.

    Example:
        >>> published_table("3a").query("benchmark == 'math500'")["value"].tolist()
        [72.4, 75.0, 73.4, 43.0, 44.9, 45.8]
    """
    pd = pandas()
    data = _load(arxiv)
    check_published_table(table, arxiv)
    cells = _cells(arxiv, str(table), data["tables"][str(table)])
    return pd.DataFrame([{k: getattr(c, k) for k in ("table", "model", "benchmark", "condition", "value", "text")}
                         for c in cells])


def check_published_table(table: str, arxiv: str = "2510.01032") -> None:
    """Refuse a table the paper's published numbers in lensprobe's data do not hold (before anything runs).

    Raises:
        LensprobeError: no such paper or table, naming the tables there are.

    Example:
        >>> check_published_table("1")
    """
    tables = _load(arxiv)["tables"]
    if str(table) not in tables:
        raise LensprobeError(f"no table {table!r} in lensprobe's data of arXiv {arxiv}: use one of "
                             f"{tuple(tables)} (Table 9 is lensprobe.interventions.arm_presets).")


def paper_models(arxiv: str = "2510.01032") -> dict[str, dict]:
    """The published configuration of every model the paper evaluates, by lensprobe's model key
    (:func:`~lensprobe.interventions.arm_presets.model_key`: the name without organisation, lower
    case): ``hub`` (the model's hub name), ``n_layers``, ``n_heads``, ``n_kv_heads``, ``d_model``,
    ``d_vocab`` (from its public ``config.json``) and ``source`` (where they were read).

    Raises:
        LensprobeError: a paper lensprobe has no model configurations for.

    Example:
        >>> paper_models()["qwen2.5-math-7b"]["n_kv_heads"]
        4
    """
    return dict(_load(arxiv, tuple(MODEL_FILES.items()))["models"])


def table_protocol(table: str, arxiv: str = "2510.01032") -> dict:
    """How a published table's numbers were made, as shipped with them: ``lensprobe`` (lensprobe's protocol
    that runs it, ``"lm-eval"`` for lm-eval tasks), ``format``, ``sampling``, ``runs`` (averaged), ``metric``,
    ``samples`` (per problem), ``max_new_tokens``, ``source`` (where the paper or the authors' code says so), and
    ``runs_reading`` where the table does not state its runs.

    Raises:
        LensprobeError: no such paper or table, or a table without its protocol (a damaged data file).

    Example:
        >>> table_protocol("8")["sampling"], table_protocol("1")["runs"]
        ('temperature 0.5, top_p 0.95', 5)
    """
    check_published_table(table, arxiv)
    spec = _load(arxiv)["tables"][str(table)].get("protocol")
    if not isinstance(spec, dict) or set(PROTOCOL_FIELDS) - set(spec):
        raise LensprobeError(f"table {table} of {arxiv} has no complete protocol in lensprobe's data (it needs "
                             f"{PROTOCOL_FIELDS}): a damaged data file; reinstall lensprobe.")
    return dict(spec)


def table_readings(table: str, condition: str | None = None, arxiv: str = "2510.01032") -> list[str]:
    """lensprobe's readings of the paper a cell of ``table`` rests on: the table's own (every cell) and those of
    ``condition``'s cells, as shipped with the published numbers (``[]`` when there are none).

    Example:
        >>> table_readings("4")[0][:33]
        'Table 4 does not name its model: '
    """
    check_published_table(table, arxiv)
    spec = _load(arxiv)["tables"][str(table)].get("readings") or {}
    return [*spec.get("*", []), *(spec.get(condition, []) if condition is not None else [])]
