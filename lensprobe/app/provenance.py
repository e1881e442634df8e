"""What a reproduced number was computed under, and whether it can be compared with the paper's.

One source of these facts for ``lp.reproduce``'s ``table.md``, ``table.csv``, ``table.json`` and report:

- :func:`run_facts`: the facts of one evaluation run, read from what its folder's ``config.json``
  records (the model's weights digest, layers, heads, width and vocabulary; the generation settings as
  applied), what its rows record (the versions of lensprobe, torch, transformers and TransformerLens, the
  device and the dtype the rows were made with) and what neither holds (KV heads, parameters);
- :func:`arm_facts`: the ARM settings a condition ran with (as recorded) and where they come from;
- whether the model samples is read from its loaded generation config
  (:func:`~lensprobe.evals.running.config.model_samples`), the sampling as applied with
  :func:`~lensprobe.evals.running.config.applied_sampling`;
- :func:`verdict`: *comparable* only when the model's configuration equals the named paper model's
  published one (:func:`~lensprobe.evals.results.published.paper_models`), the whole benchmark ran without
  error rows, and runs, sampling, dtype, prompt and ARM settings are the protocol's; otherwise every
  reason.

Example:
    >>> facts = run_facts(model, lp.evals.read_config("repro/t1/runs/math500"), name="Qwen/Qwen2.5-Math-7B")
    >>> verdict(facts, {"problems": 2, "of": 500, "runs": 1, "errors": 0}, model)[0]
    False
"""

import dataclasses

from lensprobe.core.models.facts import ENVIRONMENT_PACKAGES, run_environment
from lensprobe.evals.results.benchdata import data_readings, data_reasons
from lensprobe.evals.results.published import paper_models, table_protocol, table_readings
from lensprobe.evals.running.config import EvalConfig, applied_sampling, with_format_defaults
from lensprobe.evals.running.protocols import PROTOCOLS, get_protocol
from lensprobe.interventions.arm import ARM
from lensprobe.interventions.arm_presets import NoPresetError, arm_preset, model_key

__all__ = ["BENCHMARK_TOTALS", "PAPER_DTYPE", "RUN_FACTS", "VERDICTS", "arm_facts", "fact_columns", "model_reasons",
           "parameter_text", "readings", "run_facts", "verdict", "verdict_text", "weights_text"]

BENCHMARK_TOTALS = {"math500": 500, "aime2024": 90, "aime2025": 30}
"""Problems in the authors' sets (their "AIME2024" is the 90 problems of AIME 2022-2024)."""
PAPER_DTYPE = "float32"
"""The authors load every model with ``from_pretrained`` and no ``torch_dtype``: fp32."""
CONFIG = (("n_layers", "layers"), ("n_heads", "heads"), ("n_kv_heads", "KV heads"), ("d_model", "width"),
          ("d_vocab", "vocabulary"))


def run_facts(model, config: dict, *, name: str, rows=None) -> dict:
    """The facts of one evaluation run: what ``config`` (a folder's ``config.json``) holds, the model's KV heads
    and parameter count, and what ``rows`` (its rows, a DataFrame) record of where they were made: the versions,
    device and dtype (:func:`~lensprobe.core.models.facts.run_environment`). Without ``rows`` (a run made now,
    e.g. lm-eval's) they are read from ``model`` and this process; rows written before they were recorded give
    "not recorded"; rows made under several give every value, ``" | "``-joined.

    Example:
        >>> run_facts(model, lp.evals.read_config("runs/x"), name="tiny")["model"]["n_layers"]
        2
    """
    settings = config["settings"]
    ident = settings.get("model") or {}
    gen = applied(settings.get("generation") or {})
    cfg = getattr(model, "cfg", None)
    kv = getattr(cfg, "n_key_value_heads", None) or ident.get("n_heads")
    env = _rows_environment(rows) if rows is not None else run_environment(model)
    return {
        "model": {"name": name, **{k: ident.get(k) for k in ("n_layers", "n_heads")}, "n_kv_heads": kv,
                  **{k: ident.get(k) for k in ("d_model", "d_vocab")}, "weights": ident.get("weights"),
                  "parameters": sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else None},
        "dtype": env["dtype"], "device": env["device"],
        "protocol": gen.protocol, "prompt_format": gen.prompt_format, "max_new_tokens": gen.max_new_tokens,
        "sampling": applied_sampling(model, gen), "seed": gen.seed, "n_samples": gen.n_samples,
        "run_hash": config.get("hash"), "versions": _versions(env["versions"]),
    }


NOT_RECORDED = "not recorded"
"""What a fact reads as when the rows were written before lensprobe recorded it."""


def _rows_environment(rows) -> dict[str, str]:
    """The versions, device and dtype the ``rows`` record (every distinct value, in order of first use)."""
    out = {}
    for key in ("versions", "device", "dtype"):
        values = rows[key].dropna().astype(str).unique().tolist() if key in rows else []
        out[key] = " | ".join(values) if values else NOT_RECORDED
    return out


def _versions(text: str) -> dict[str, str]:
    """``{"lensprobe": "0.5.0", ...}`` from a rows' ``versions`` text (several runs' texts ``" | "``-joined)."""
    found: dict[str, list[str]] = {name: [] for name in ENVIRONMENT_PACKAGES}
    for one in text.split(" | "):
        for part in one.split(", "):
            name, _, version = part.partition(" ")
            if name in found and version not in found[name]:
                found[name].append(version)
    return {name: " | ".join(v) if v else NOT_RECORDED for name, v in found.items()}


def applied(generation: dict) -> EvalConfig:
    """The generation settings as applied, from their identity (the fields that differ from the defaults)."""
    return EvalConfig(**{k: v for k, v in generation.items() if not k.startswith(".")})


def arm_facts(part: dict, model, benchmark: str) -> dict | None:
    """The ARM a condition ran with, every setting as its folder records it (``part``: the condition's entry
    of ``config.json``, whose labels list each intervention's fields), where they come from (the preset's
    source, ``"code"`` or ``"paper"``, with the file or table of each value; or ``"given"``), and the authors'
    preset for ``model`` on ``benchmark`` from that source (``None`` when there is none). ``None`` for a
    condition without ARM.

    ``model`` is the loaded model (or its :class:`~lensprobe.core.models.facts.ModelFacts`): its preset is the one
    the run took, found by its configuration
    (:func:`~lensprobe.interventions.arm_presets.model_key`: :data:`~lensprobe.interventions.arm_presets.PRESET_ARCHITECTURES`
    first, its own name only when no configuration matches), never by the name the rows are recorded under.

    Example:
        >>> arm_facts(lp.evals.read_config("repro/t1/runs/math500")["parts"]["w/ Mless+ARM"], model, "math500")
    """
    found = [i for i in (part.get("labels") or {}).get("interventions") or [] if i.get("type") == "ARM"]
    if not found:
        return None
    ran = {k: v for k, v in found[0].items() if k not in _NOT_SETTINGS}
    source = found[0].get("source")
    try:
        preset = arm_preset(model, benchmark, "paper" if str(source).startswith("paper") else "code",
                            layer_defaults="layer defaults" in str(source))
        expected: dict | None = _arm_fields(preset.settings)
        origins = "; ".join(sorted(set(preset.sources.values())))
    except NoPresetError:
        expected, origins = None, "no preset for this model and benchmark"
    return {"settings": ran, "source": f"{source} ({origins})" if source else "given (arm= / --arm-*)",
            "preset": expected}


_NOT_SETTINGS = ("type", "seed", "per_row", "source")


def _arm_fields(settings: dict) -> dict:
    arm = ARM(**settings)
    return {f.name: getattr(arm, f.name) for f in dataclasses.fields(arm) if f.name not in _NOT_SETTINGS}


def verdict(facts: dict, cell: dict, model, *, paper_runs: int = 1, random: bool = False,
            table_models: tuple[str, ...] | None = None, table: str | None = None,
            arxiv: str = "2510.01032") -> tuple[bool, list[str]]:
    """``(comparable, reasons)`` for one cell: comparable only when nothing below differs from the published table's
    protocol and data; else every reason, in words.

    Args:
        facts: :func:`run_facts` of the run.
        cell: ``problems`` (run), ``of`` (the benchmark's total, ``None`` when unknown), ``runs``,
            ``errors`` (rows without a verdict) and ``arm`` (:func:`arm_facts` or ``None``); with ``benchmark``,
            ``data`` (:func:`~lensprobe.evals.results.benchdata.data_facts` of the problems run, ``None`` when not
            recorded), compared with the benchmark's published file.
        paper_runs: runs the paper averages (used without ``table``; with it, the table's own).
        random: whether the cell's rows depend on the seed (the model samples, or ARM draws).
        table_models: the models the compared table has numbers for (hub names); ``None``: not checked.
        model: the loaded model (the sampling applied is compared with its own generation config).
        table: the published table the cell sits beside: its protocol
            (:func:`~lensprobe.evals.results.published.table_protocol`) is what the run is compared with (prompt,
            sampling, samples per problem, metric, max new tokens, runs); ``None``: the run's own protocol.
        arxiv: the paper of ``table``.
    """
    reasons = model_reasons(facts["model"])
    keys = {model_key(m) for m in table_models or ()}
    if table_models is not None and not reasons and model_key(facts["model"]["name"]) not in keys:
        reasons.append(f"the table has no number for {facts['model']['name']} (it has {', '.join(table_models)})")
    if facts["dtype"] != PAPER_DTYPE:
        reasons.append(f"dtype {facts['dtype']}; the authors ran {PAPER_DTYPE}")
    published = table_protocol(table, arxiv) if table is not None else None
    reasons += _protocol_reasons(facts, model, published, table)
    if "benchmark" in cell:
        reasons += data_reasons(cell["benchmark"], cell.get("data"), arxiv)
    if cell["of"] is None or cell["problems"] != cell["of"]:
        reasons.append(f"{cell['problems']} problems run of the benchmark's {cell['of'] or 'unknown number'}")
    if cell["errors"]:
        reasons.append(f"{cell['errors']} error row(s) without a verdict, so {cell['errors']} sample(s) fewer are "
                       "graded")
    runs = published["runs"] if published is not None else paper_runs
    if random and cell["runs"] != runs:
        whose = f"Table {table}" if table is not None else "the paper"
        reasons.append(f"{cell['runs']} run(s) of a cell that varies with the seed; {whose} averages {runs}")
    arm = cell.get("arm")
    if arm is not None and arm["settings"] != arm["preset"]:
        reasons.append(f"ARM settings {_settings_text(arm['settings'])} are not the authors' preset for this model "
                       f"and benchmark ({_settings_text(arm['preset']) if arm['preset'] else 'none'})")
    return not reasons, reasons


def readings(facts: dict, *, benchmark: str, condition: str, table: str | None, random: bool = False,
             arxiv: str = "2510.01032") -> list[str]:
    """What a cell's comparison rests on that the paper does not say and lensprobe reads into it (the table's and
    the condition's readings, shipped with the published numbers; the benchmark's data; the runs a table does not
    state, for a cell that varies with the seed), and whether the weights were verified: every item a sentence.

    Example:
        >>> readings(facts, benchmark="math500", condition="w/o", table="4")[0][:33]
        'Table 4 does not name its model: '
    """
    out = [*table_readings(table, condition, arxiv)] if table is not None else []
    out += data_readings(benchmark, arxiv)
    if table is not None and random and table_protocol(table, arxiv).get("runs_reading"):
        out.append(table_protocol(table, arxiv)["runs_reading"])
    weights = weights_text(facts["model"])
    return out + ([weights] if weights else [])


def weights_text(model: dict) -> str:
    """For a model named after one of the paper's: whether its weights digest was compared with the published
    checkpoint's (``weights_sha256`` in the paper's model data; none ships yet, so: not verified). ``""`` for
    another model (its name already makes it not comparable)."""
    paper = paper_models().get(model_key(model["name"]))
    if paper is None:
        return ""
    if paper.get("weights"):
        same = paper["weights"] == model.get("weights")
        return "" if same else (f"the weights digest {model.get('weights')} is not {paper['hub']}'s published "
                                f"{paper['weights']}")
    return (f"the weights were not verified: lensprobe ships no digest of {paper['hub']}'s published weights to "
            f"compare the run's ({model.get('weights') or 'not recorded'}) with; several of the paper's models share "
            "one configuration")


VERDICTS = ("comparable", "comparable, on lensprobe's reading", "not comparable")
"""The words of ``run: comparable``."""


def verdict_text(comparable: bool, rests_on: list[str]) -> str:
    """``"comparable"``, ``"comparable, on lensprobe's reading"`` (it rests on a reading or unverified weights) or
    ``"not comparable"``."""
    return VERDICTS[2] if not comparable else VERDICTS[1] if rests_on else VERDICTS[0]


def model_reasons(model: dict) -> list[str]:
    """Why ``model`` (a :func:`run_facts` ``model`` entry) is not the paper's model it is named after; ``[]`` when it is."""
    key = model_key(model["name"])
    published = paper_models()
    if key not in published:
        return [f"{model['name']} is not one of the paper's models ({', '.join(m['hub'] for m in published.values())})"]
    paper = published[key]
    diff = [f"{label} {model[k]} (published {paper[k]})" for k, label in CONFIG if model[k] != paper[k]]
    if diff:
        return [f"the model is named {paper['hub']}, but its configuration differs from the published one: "
                + ", ".join(diff)]
    return []


def _protocol_reasons(facts: dict, model, published: dict | None = None, table: str | None = None) -> list[str]:
    """Every way the run's protocol differs from ``published`` (a table's protocol; ``None``: the run's own)."""
    name = facts["protocol"]
    want = published["lensprobe"] if published is not None else name
    reasons = [] if name else [f"prompt format {facts['prompt_format']!r} without the authors' protocol (their raw "
                                "prompt and grading)"]
    whose = f"Table {table}'s" if table is not None else "the authors'"
    if published is not None and want not in PROTOCOLS:  # lm-eval tasks: not a generation protocol
        return reasons + ([f"protocol {name}; {whose} numbers come from {published['format']} ({published['source']})"]
                          if name else [])
    if name and want and name != want:
        reasons.append(f"protocol {name}; {whose} is {want} ({published['format'] if published else ''} prompt, "
                       f"sampling {published['sampling'] if published else ''}, {published['metric'] if published else ''})")
        if get_protocol(name).system != get_protocol(want).system:
            reasons.append(f"instruction {get_protocol(name).system!r}; {whose} is {get_protocol(want).system!r}")
        k, theirs_k = get_protocol(name).k, get_protocol(want).k
        if k != theirs_k:
            reasons.append(f"metric pass@{k or 1}; {whose} is {published['metric'] if published else f'pass@{theirs_k or 1}'}")
    theirs = EvalConfig(**with_format_defaults(model, {"protocol": want} if want else {"prompt_format": "paper"}))
    if facts["max_new_tokens"] != theirs.max_new_tokens:
        reasons.append(f"max_new_tokens {facts['max_new_tokens']}; {whose} is {theirs.max_new_tokens}")
    samples = facts.get("n_samples", 1)
    if samples != theirs.n_samples:
        reasons.append(f"{samples} sample(s) per problem; {whose} is {theirs.n_samples}")
    wanted = applied_sampling(model, theirs)
    diff = [f"{f}={v} (theirs {wanted.get(f)})" for f, v in facts["sampling"].items() if wanted.get(f) != v]
    if diff:
        how = (f"{whose} ({published['sampling']}, on the model's generation config)" if published is not None
               else "the model's own generation config as the authors ran it")
        reasons.append("sampling " + ", ".join(diff) + ": not " + how)
    return reasons


def _settings_text(settings: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def parameter_text(n: int) -> str:
    """``1_540_000_000`` -> ``"1.5B"``, ``135_000_000`` -> ``"135M"``, ``71_424`` -> ``"0.071M"``."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e6:.2g}M"


RUN_FACTS = ("run: model", "run: model configuration", "run: parameters", "run: weights digest", "run: dtype",
             "run: device", "run: prompt format", "run: max new tokens", "run: sampling", "run: lensprobe",
             "run: torch", "run: transformers", "run: TransformerLens")
"""The columns of :func:`fact_columns` that are the same for every cell of a run (the others are the cell's own)."""


def fact_columns(facts: dict, cell: dict, reasons: list[str]) -> dict:
    """One cell's facts and verdict as ``"run: ..."`` text columns (``table.csv``, the Markdown and the report)."""
    m, arm = facts["model"], cell.get("arm")
    config = (f"{m['n_layers']} layers, {m['n_heads']} heads, {m['n_kv_heads']} KV heads, width {m['d_model']}, "
              f"vocabulary {m['d_vocab']}")
    fmt = facts["prompt_format"] + (f" (protocol {facts['protocol']})" if facts["protocol"] else " (no protocol)")
    return {
        "run: model": m["name"], "run: model configuration": config,
        "run: parameters": parameter_text(m["parameters"]) if m["parameters"] else "",
        "run: weights digest": m["weights"], "run: dtype": facts["dtype"], "run: device": facts["device"],
        "run: prompt format": fmt, "run: max new tokens": facts["max_new_tokens"],
        "run: sampling": _settings_text({k: v for k, v in facts["sampling"].items() if v is not None}),
        "run: lensprobe": facts["versions"]["lensprobe"], "run: torch": facts["versions"]["torch"],
        "run: transformers": facts["versions"]["transformers"],
        "run: TransformerLens": facts["versions"]["transformer_lens"],
        "run: problems": f"{cell['problems']} of {cell['of'] or 'an unknown number'}",
        "run: seeds": ", ".join(str(s) for s in cell["seeds"]), "run: error rows": cell["errors"],
        "run: ARM": _settings_text(arm["settings"]) if arm else "", "run: ARM source": arm["source"] if arm else "",
        **_data_columns(cell.get("data")),
        "run: why not comparable": "; ".join(reasons), "run: readings": "; ".join(cell.get("readings", [])),
    }


def _data_columns(data: dict | str | None) -> dict:
    """The problems file a cell ran: its path, size and problems, and its SHA-256 (an lm-eval cell: its task file)."""
    if isinstance(data, str):
        return {"run: problems file": data, "run: problems file SHA-256": ""}
    if data is None:
        return {"run: problems file": "", "run: problems file SHA-256": ""}
    return {"run: problems file": f"{data['path']} ({data['problems']} problems, {data['size']} bytes)",
            "run: problems file SHA-256": data["sha256"]}
