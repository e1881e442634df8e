"""What a reproduced number was computed under, and whether it can be compared with the paper's.

One source of these facts for ``lp.reproduce``'s ``table.md``, ``table.csv``, ``table.json`` and report:

- :func:`run_facts`: the facts of one evaluation run, read from what its folder's ``config.json``
  records (the model's weights digest, dtype, layers, heads, width and vocabulary; the generation
  settings as applied) and what the folder does not hold (KV heads, device, parameters, versions);
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
import importlib.metadata

from lensprobe.core.version import __version__
from lensprobe.evals.results.published import paper_models
from lensprobe.evals.running.config import EvalConfig, applied_sampling, with_format_defaults
from lensprobe.interventions.arm import ARM
from lensprobe.interventions.arm_presets import NoPresetError, arm_preset, model_key

__all__ = ["BENCHMARK_TOTALS", "PAPER_DTYPE", "RUN_FACTS", "arm_facts", "fact_columns", "model_reasons",
           "parameter_text", "run_facts", "verdict"]

BENCHMARK_TOTALS = {"math500": 500, "aime2024": 90, "aime2025": 30}
"""Problems in the authors' sets (their "AIME2024" is the 90 problems of AIME 2022-2024)."""
PAPER_DTYPE = "float32"
"""The authors load every model with ``from_pretrained`` and no ``torch_dtype``: fp32."""
CONFIG = (("n_layers", "layers"), ("n_heads", "heads"), ("n_kv_heads", "KV heads"), ("d_model", "width"),
          ("d_vocab", "vocabulary"))


def run_facts(model, config: dict, *, name: str) -> dict:
    """The facts of one evaluation run: what ``config`` (a folder's ``config.json``) holds, and the model's KV heads, device and parameter count, lensprobe's and transformers' versions.

    Example:
        >>> run_facts(model, lp.evals.read_config("runs/x"), name="tiny")["model"]["n_layers"]
        2
    """
    settings = config["settings"]
    ident = settings.get("model") or {}
    gen = applied(settings.get("generation") or {})
    cfg = getattr(model, "cfg", None)
    kv = getattr(cfg, "n_key_value_heads", None) or ident.get("n_heads")
    return {
        "model": {"name": name, **{k: ident.get(k) for k in ("n_layers", "n_heads")}, "n_kv_heads": kv,
                  **{k: ident.get(k) for k in ("d_model", "d_vocab")}, "weights": ident.get("weights"),
                  "parameters": sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else None},
        "dtype": str(ident.get("dtype", "")).removeprefix("torch."),
        "device": _device(model),
        "protocol": gen.protocol, "prompt_format": gen.prompt_format, "max_new_tokens": gen.max_new_tokens,
        "sampling": applied_sampling(model, gen), "seed": gen.seed,
        "run_hash": config.get("hash"),
        "versions": {"lensprobe": __version__, "transformers": importlib.metadata.version("transformers")},
    }


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
            table_models: tuple[str, ...] | None = None) -> tuple[bool, list[str]]:
    """``(comparable, reasons)`` for one cell: comparable only when nothing below differs from the paper's
    protocol; else every reason, in words.

    Args:
        facts: :func:`run_facts` of the run.
        cell: ``problems`` (run), ``of`` (the benchmark's total, ``None`` when unknown), ``runs``,
            ``errors`` (rows without a verdict) and ``arm`` (:func:`arm_facts` or ``None``).
        paper_runs: runs the paper averages for this table.
        random: whether the cell's rows depend on the seed (the model samples, or ARM draws).
        table_models: the models the compared table has numbers for (hub names); ``None``: not checked.
        model: the loaded model (the sampling applied is compared with its own generation config).
    """
    reasons = model_reasons(facts["model"])
    keys = {model_key(m) for m in table_models or ()}
    if table_models is not None and not reasons and model_key(facts["model"]["name"]) not in keys:
        reasons.append(f"the table has no number for {facts['model']['name']} (it has {', '.join(table_models)})")
    if facts["dtype"] != PAPER_DTYPE:
        reasons.append(f"dtype {facts['dtype']}; the authors ran {PAPER_DTYPE}")
    reasons += _protocol_reasons(facts, model)
    if cell["of"] is None or cell["problems"] != cell["of"]:
        reasons.append(f"{cell['problems']} problems run of the benchmark's {cell['of'] or 'unknown number'}")
    if cell["errors"]:
        reasons.append(f"{cell['errors']} error row(s) without a verdict, so n is {cell['errors']} lower")
    if random and cell["runs"] != paper_runs:
        reasons.append(f"{cell['runs']} run(s) of a cell that varies with the seed; the paper averages {paper_runs}")
    arm = cell.get("arm")
    if arm is not None and arm["settings"] != arm["preset"]:
        reasons.append(f"ARM settings {_settings_text(arm['settings'])} are not the authors' preset for this model "
                       f"and benchmark ({_settings_text(arm['preset']) if arm['preset'] else 'none'})")
    return not reasons, reasons


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


def _protocol_reasons(facts: dict, model) -> list[str]:
    name = facts["protocol"]
    reasons = [] if name else [f"prompt format {facts['prompt_format']!r} without the authors' protocol (their raw "
                                "prompt and grading)"]
    theirs = EvalConfig(**with_format_defaults(model, {"protocol": name} if name else {"prompt_format": "paper"}))
    if facts["max_new_tokens"] != theirs.max_new_tokens:
        reasons.append(f"max_new_tokens {facts['max_new_tokens']}; the authors' is {theirs.max_new_tokens}")
    wanted = applied_sampling(model, theirs)
    diff = [f"{f}={v} (theirs {wanted.get(f)})" for f, v in facts["sampling"].items() if wanted.get(f) != v]
    if diff:
        reasons.append("sampling " + ", ".join(diff) + ": not the model's own generation config as the authors ran it")
    return reasons


def _settings_text(settings: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def parameter_text(n: int) -> str:
    """``1_540_000_000`` -> ``"1.5B"``, ``135_000_000`` -> ``"135M"``, ``71_424`` -> ``"0.071M"``."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e6:.2g}M"


def _device(model) -> str:
    params = model.parameters() if hasattr(model, "parameters") else iter(())
    first = next(iter(params), None)
    return str(first.device) if first is not None else str(getattr(getattr(model, "cfg", None), "device", ""))



RUN_FACTS = ("run: model", "run: model configuration", "run: parameters", "run: weights digest", "run: dtype",
             "run: device", "run: prompt format", "run: max new tokens", "run: sampling", "run: lensprobe",
             "run: transformers")
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
        "run: lensprobe": facts["versions"]["lensprobe"], "run: transformers": facts["versions"]["transformers"],
        "run: problems": f"{cell['problems']} of {cell['of'] or 'an unknown number'}",
        "run: seeds": ", ".join(str(s) for s in cell["seeds"]), "run: error rows": cell["errors"],
        "run: ARM": _settings_text(arm["settings"]) if arm else "", "run: ARM source": arm["source"] if arm else "",
        "run: why not comparable": "; ".join(reasons),
    }
