"""Study recipes: what ``lensprobe reproduce`` runs, as TOML data files (shipped ones and your own).

A recipe names the paper and table (or figure) it reproduces, the models the authors used, and
either an evaluation (``kind = "table"``: benchmarks x conditions under a protocol, compared with
the published numbers of ``table``, when the paper prints them), lm-eval tasks x conditions (``kind =
"lm-eval"``: :mod:`lensprobe.app.reproduce_lmeval`) or a study (``kind = "figure"``: one of
:data:`~lensprobe.app.reproduce_figures.FIGURES`). The shipped recipes are in
``lensprobe/app/recipes/``; :func:`list_recipes` lists them and :func:`load_recipe` reads one by
name or from a file path. Fields (every one checked when read)::

    name = "arm-table1"                 # defaults to the file name
    title = "Table 1: w/o vs w/ Mless"
    kind = "table"                      # or "figure", or "lm-eval"
    arxiv = "2510.01032"
    table = "1"                         # the published table compared with (kind = "table"; absent: the
                                        #   paper publishes a figure only, so the shape is compared by eye)
    figure = "token-class-attention"    # the study drawn (kind = "figure")
    protocol = "arm-math500"            # lp.evals.PROTOCOLS
    benchmarks = ["math500", "aime2024"]
    conditions = ["w/o", "w/ Mless"]    # built-in names, "ARM", or names defined below
    models = ["Qwen/Qwen2.5-Math-1.5B"] # the authors' models (the docs' GPU commands)
    runs = 5                            # runs the paper averages (the default of --runs)
    curve = "filler length"             # also draw accuracy against each condition's filler length (x axis)
    best_of = "majority"                # add "Best-of-N (N=n)" rows: the majority answer of each problem's
                                        #   n samples (n: the protocol's n_samples), per condition
    notes = "..."                       # shown in the table's Markdown and the report
    kind = "lm-eval"                    # benchmarks are lm-eval tasks, run by lensprobe.evals.lmeval:
    metrics = {gsm8k = "exact_match"}   #   the metric read per task (default "acc")
    sources = {gsm8k = "openai/gsm8k"}  #   where each task's data comes from (shown when it is missing)
    [settings]                          # how it runs: ReproduceConfig's fields (the command line's
    limit = 50                          #   --limit, --max-new-tokens, ... given win)
    [define."w/ Mless ?"]               # a condition: a built-in one with other filler settings
    base = "w/ Mless"
    symbol = "?"                        # also: count, word, placement

A name is letters, digits, ``.``, ``_`` and ``-`` (it names the default output folder). A ``define`` may
not take a built-in condition's name (``w/o``, ``w/ Mless``, ``ARM`` ...); one that takes the name of a
shipped recipe's condition with another definition is renamed ``"<name> (own definition)"``, so it is
never shown beside the published number of the paper's condition.
"""

import dataclasses
import os
import re
import sys
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from lensprobe.core.checks import choice, count
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.given import Given
from lensprobe.core.prompts.assembly import PLACEMENTS
from lensprobe.core.prompts.conditions import paper_conditions
from lensprobe.core.prompts.fillers import MAX_FILLER_COUNT
from lensprobe.core.storage.files import read_text
from lensprobe.core.storage.nesting import parse_toml
from lensprobe.evals.results.published import check_published_table
from lensprobe.evals.running.protocols import PROTOCOLS
from lensprobe.interventions.arm_presets import benchmark_key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["KINDS", "Recipe", "ReproduceConfig", "list_recipes", "load_recipe"]

KINDS = ("table", "figure", "lm-eval")
_FIELDS = {"name", "title", "kind", "arxiv", "table", "figure", "protocol", "benchmarks", "conditions", "models",
           "runs", "notes", "define", "settings", "curve", "best_of", "metrics", "sources"}
BEST_OF = ("majority",)
"""How a ``best_of`` recipe picks the best of a problem's N samples (see :mod:`lensprobe.app.reproduce_samples`)."""


@dataclass(frozen=True)
class ReproduceConfig(Given):
    """How :func:`~lensprobe.app.reproduce.reproduce` runs a recipe: a recipe's ``[settings]`` table and
    ``lensprobe reproduce``'s options are read into this one class (the options given win). ``None``:
    not given (the protocol's, or :func:`~lensprobe.app.reproduce.reproduce`'s default).

    Example:
        >>> ReproduceConfig(limit=5, quick=True).given()
        {'limit': 5, 'quick': True}
    """

    # the command line gives these four through the option classes several commands share (app/option_groups.py)
    limit: int | None = field(default=None, metadata={"cmd": False})
    max_new_tokens: int | None = field(default=None, metadata={"cmd": False})
    batch_size: int | None = field(default=None, metadata={"cmd": False})
    runs: int | None = None
    """seeded runs, seeds 0 to N-1, reported as their mean and standard deviation (default: the runs the paper
    averages, the recipe's runs, 5 for Table 1); a cell that cannot vary with the seed (the run's protocol or
    format decodes greedily, whatever the model's generation config, and no intervention draws) runs once"""
    quick: bool | None = field(default=None, metadata={"cmd": False})
    benchmark_data: list[str] | None = field(default=None, metadata={
        "custom_args": {"action": "append", "metavar": "BENCHMARK=FILE", "nargs": None}})
    """problem file of a benchmark lensprobe does not ship, e.g. aime2024=aime_2022_2024.jsonl (repeatable; an
    lm-eval recipe: TASK=task.yaml); benchmarks without data are skipped with a note. A recipe's [settings] may
    still call it data"""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("limit", "max_new_tokens", "batch_size", "runs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise SettingError(name, f"expected a whole number >= 1, got {value!r}")
        if self.quick is not None and not isinstance(self.quick, bool):
            raise SettingError("quick", f"expected true or false, got {self.quick!r}")
        seen: set[str] = set()
        for value in self.benchmark_data or []:
            if not isinstance(value, str) or not value.partition("=")[1] or not value.partition("=")[2]:
                raise SettingError("benchmark_data", f"{{setting}} takes BENCHMARK=FILE (e.g. aime2024=aime_2022_2024.jsonl), got {value!r}")
            name = value.partition("=")[0].strip().lower()
            if name in seen:  # one file per benchmark: the last would silently win
                raise SettingError("benchmark_data", f"{{setting}} names {name} twice: give one file per benchmark")
            seen.add(name)

    def over(self, other: "ReproduceConfig") -> "ReproduceConfig":
        """``other`` with the settings given here on top (a command line's over a recipe's)."""
        return replace(other, **self.given())
_DEFINE_FIELDS = {"base", "symbol", "count", "word", "placement"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
OWN = " (own definition)"
"""Appended to a defined condition that takes a shipped recipe's condition name with another definition."""


@dataclass(frozen=True)
class Recipe:
    """One study recipe (see the module docs for the fields).

    Example:
        >>> r = load_recipe("arm-table1")
        >>> r.benchmarks, r.conditions
        (('math500', 'aime2024'), ('w/o', 'w/ Mless'))
    """

    name: str
    title: str
    kind: str
    arxiv: str = "2510.01032"
    table: str | None = None
    figure: str | None = None
    protocol: str | None = None
    benchmarks: tuple[str, ...] = ()
    conditions: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    runs: int = 1
    notes: str = ""
    define: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = ""
    settings: ReproduceConfig = field(default_factory=ReproduceConfig)
    curve: str | None = None
    best_of: str | None = None
    metrics: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def _shipped() -> dict[str, Any]:
    folder = resources.files("lensprobe.app").joinpath("recipes")
    return {f.name[:-5]: f for f in folder.iterdir() if f.name.endswith(".toml")}


def list_recipes() -> list[Recipe]:
    """The recipes shipped with lensprobe, sorted by name.

    Example:
        >>> [r.name for r in list_recipes()][:2]
        ['arm-fig-filler-per-head', 'arm-fig-filler-vs-random']
    """
    return [load_recipe(name) for name in sorted(_shipped())]


def load_recipe(name_or_path: str | os.PathLike) -> Recipe:
    """A shipped recipe by name, or a recipe file (a path ending in ``.toml``).

    Raises:
        LensprobeError: an unknown name, a file that is missing or not valid TOML, or a field
            that is unknown or wrong (the message names it and says what is allowed).

    Example:
        >>> load_recipe("arm-table5").define["w/ Mless ?"]["symbol"]
        '?'
        >>> load_recipe("my-recipes/table1-math-only.toml")
    """
    text_name = str(name_or_path)
    shipped = _shipped()
    if text_name in shipped:
        text, where, default = shipped[text_name].read_text(encoding="utf-8"), f"recipe {text_name!r}", text_name
    elif text_name.endswith(".toml"):
        path = Path(text_name).expanduser()
        if not path.exists():
            raise LensprobeError(f"recipe file {path} does not exist: give a .toml file or one of {sorted(shipped)}.")
        text, where, default = read_text(path, "recipe file"), str(path), path.stem
    else:
        raise LensprobeError(f"unknown recipe {text_name!r}: use one of {sorted(shipped)} (lensprobe reproduce "
                             "--list) or a path to your own .toml recipe.")
    try:
        data = parse_toml(text, str(where))
    except tomllib.TOMLDecodeError as err:
        raise LensprobeError(f"{where} is not valid TOML ({err}): fix the file.") from None
    return _recipe(data, where, default)


def _recipe(data: dict, where: str, default_name: str) -> Recipe:
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise LensprobeError(f"{where}: unknown field(s) {unknown}; a recipe has {sorted(_FIELDS)}.")
    kind = data.get("kind", "table")
    if kind not in KINDS:
        raise LensprobeError(f"{where}: kind must be one of {KINDS}, got {kind!r}.")
    protocol = data.get("protocol")
    if protocol is not None and protocol not in PROTOCOLS:
        raise LensprobeError(f"{where}: unknown protocol {protocol!r}; use one of {tuple(PROTOCOLS)}.")
    lists = {}
    for key in ("benchmarks", "conditions", "models"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise LensprobeError(f"{where}: {key} must be a list of strings, got {value!r}.")
        lists[key] = tuple(value)
    try:  # an lm-eval recipe's benchmarks are lm-eval task names
        benchmarks = lists["benchmarks"] if kind == "lm-eval" else tuple(benchmark_key(b) for b in lists["benchmarks"])
    except LensprobeError as err:
        raise LensprobeError(f"{where}: {err}") from None
    if kind != "figure" and (not benchmarks or not lists["conditions"]):
        raise LensprobeError(f"{where}: a table recipe needs benchmarks and conditions (and table, the published "
                             "table compared with, unless the paper shows these numbers as a figure only).")
    if kind == "figure" and not data.get("figure"):
        raise LensprobeError(f"{where}: a figure recipe needs figure (the study it draws).")
    _check_extras(data, kind, protocol, benchmarks, where)
    runs = data.get("runs", 1)
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise LensprobeError(f"{where}: runs must be a positive integer, got {runs!r}.")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise LensprobeError(f"{where}: name {name!r} must be letters, digits, '.', '_' and '-' (it names the output "
                             "folder): e.g. name = \"my-table1\".")
    _check_shipped_name(name, data, where)
    define, conditions = _own_names(_defines(data.get("define", {}), where), lists["conditions"], where)
    return Recipe(name=name, title=str(data.get("title", default_name)), kind=kind,
                  arxiv=str(data.get("arxiv", "2510.01032")), table=_opt(data.get("table")),
                  figure=_opt(data.get("figure")), protocol=protocol, benchmarks=benchmarks,
                  conditions=conditions, models=lists["models"], runs=runs,
                  notes=str(data.get("notes", "")), define=define, source=where,
                  settings=_settings(data.get("settings", {}), where), curve=data.get("curve"),
                  best_of=data.get("best_of"), metrics=dict(data.get("metrics", {})),
                  sources=dict(data.get("sources", {})))


def _check_shipped_name(name: str, data: dict, where: str) -> None:
    """Refuse a recipe file that takes a shipped recipe's name with other content: its table would pass for the
    shipped run's (and a folder holding the shipped run would take it for its own)."""
    shipped = _shipped().get(name)
    if shipped is None or where == f"recipe {name!r}":
        return
    theirs = tomllib.loads(shipped.read_text(encoding="utf-8"))
    if {k: v for k, v in data.items() if k != "name"} != {k: v for k, v in theirs.items() if k != "name"}:
        raise LensprobeError(f"{where}: its name {name!r} is a shipped recipe's, but its content differs from the "
                             f"shipped one: give it a name of its own (name = \"my-{name}\"), or run the shipped "
                             f"recipe by its name.")


def _check_extras(data: dict, kind: str, protocol: str | None, benchmarks: tuple[str, ...], where: str) -> None:
    """The fields of one kind: ``curve`` and ``best_of`` (table), ``metrics`` and ``sources`` (lm-eval)."""
    for key in ("curve", "best_of"):
        if data.get(key) is not None and (kind != "table" or not isinstance(data[key], str) or not data[key]):
            raise LensprobeError(f"{where}: {key} is a table recipe's text field, got {data[key]!r}.")
    if data.get("best_of") not in (None, *BEST_OF):
        raise LensprobeError(f"{where}: best_of must be one of {BEST_OF}, got {data['best_of']!r}.")
    if data.get("best_of") and (not protocol or PROTOCOLS[protocol].settings.get("n_samples", 1) < 2):
        raise LensprobeError(f"{where}: best_of needs a protocol that draws several samples per problem (n_samples > 1, "
                             "e.g. protocol = \"arm-math500-t0.5\"), got protocol " + repr(protocol) + ".")
    for key in ("metrics", "sources"):
        value = data.get(key, {})
        if value and kind != "lm-eval":
            raise LensprobeError(f"{where}: {key} is a field of lm-eval recipes (kind = \"lm-eval\").")
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()) \
                or set(value) - set(benchmarks):
            raise LensprobeError(f"{where}: {key} must be a table of {list(benchmarks)} -> text, got {value!r}.")
    if kind == "table" and data.get("table") is not None:  # refused now, not after the evaluation ran
        try:
            check_published_table(str(data["table"]), str(data.get("arxiv", "2510.01032")))
        except LensprobeError as err:
            raise LensprobeError(f"{where}: {err}") from None


def _settings(table: Any, where: str) -> ReproduceConfig:
    """A recipe's ``[settings]`` as a :class:`ReproduceConfig` (the class the command line fills too)."""
    fields = {f.name for f in dataclasses.fields(ReproduceConfig)}
    if isinstance(table, dict) and "data" in table and "benchmark_data" not in table:  # its name until 0.x
        table = {("benchmark_data" if k == "data" else k): v for k, v in table.items()}
    if not isinstance(table, dict) or set(table) - fields:
        raise LensprobeError(f"{where}: settings must be a table of {sorted(fields)}, got {table!r}.")
    try:
        return ReproduceConfig(**table)
    except LensprobeError as err:
        raise LensprobeError(f"{where}: settings.{err}") from None


def _opt(value) -> str | None:
    return None if value is None else str(value)


def _defines(define: Any, where: str) -> dict[str, dict[str, Any]]:
    if not isinstance(define, dict):
        raise LensprobeError(f"{where}: define must be a table of conditions, got {define!r}.")
    builtin = set(paper_conditions(prompt_format="paper"))
    for name, spec in define.items():
        if name in builtin or name == "ARM" or name.endswith("+ARM"):
            raise LensprobeError(f"{where}: define.{name!r} takes the name of a built-in condition, which the published "
                                 "numbers are matched on: give your definition a name of its own (e.g. "
                                 f"{name + ' (mine)'!r}).")
        if not isinstance(spec, dict) or "base" not in spec:
            raise LensprobeError(f"{where}: define.{name!r} needs base (a built-in condition such as 'w/ Mless').")
        unknown = sorted(set(spec) - _DEFINE_FIELDS)
        if unknown:
            raise LensprobeError(f"{where}: define.{name!r} has unknown field(s) {unknown}; use {sorted(_DEFINE_FIELDS)}.")
        try:
            _check_define(spec)
        except SettingError as err:
            raise LensprobeError(f"{where}: define.{name!r}.{err}") from None
    return dict(define)


def _check_define(spec: dict[str, Any]) -> None:
    """A ``define`` table's values by type and range (``count = true`` is no count, ``count = 1e9`` no filler)."""
    for key in ("base", "symbol", "word"):
        if key in spec and (not isinstance(spec[key], str) or not spec[key].strip()):
            raise SettingError(key, f"expected a non-empty string, got {spec[key]!r}")
    if "count" in spec:
        count("count", spec["count"], 1, MAX_FILLER_COUNT)
    choice("placement", spec.get("placement", "between"), PLACEMENTS)


def _own_names(define: dict[str, dict[str, Any]], conditions: tuple[str, ...], where: str
               ) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """Rename (``"<name> (own definition)"``) each defined condition that a shipped recipe defines otherwise."""
    shipped: dict[str, dict] = {}
    for file in _shipped().values():
        if str(file) != where:
            shipped.update(tomllib.loads(file.read_text(encoding="utf-8")).get("define", {}))
    renamed = {n: n + OWN for n, spec in define.items() if n in shipped and shipped[n] != spec}
    return ({renamed.get(n, n): spec for n, spec in define.items()},
            tuple(renamed.get(c, c) for c in conditions))
