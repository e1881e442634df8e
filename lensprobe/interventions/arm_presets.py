"""The meaningless-tokens authors' ARM settings per model and benchmark, each value with its source.

Two sources, which agree almost everywhere:

- **paper**: Table 9 of arXiv 2510.01032 (v1, p. 22): ``c`` (Gemma: the fraction of entries to
  move) and the percentile, for 7 models x 6 benchmarks; a cell "-" means ARM gave no gain
  there. ``p_min = 0.02`` and ``p_max = 0.25`` come from the paper's text (Section 3).
- **code**: the authors' released code (github.com/vanpe20/ARM-Meaningless-tokens):
  ``choose_parameters`` in ``Math500/utils.py``, ``AIME2024/utils.py`` and
  ``AIME2025/utils.py`` (``None, None`` where they run no ARM), and the ``arm`` defaults of
  ``modeling_llama.py`` (``pmin=0.2``). The code has no scripts for GPQA, HumanEval or
  LiveCodeBench: there ``source="code"`` takes Table 9's ``c`` and percentile (tagged as such)
  with the code's ``p_min``.

**The default is** ``source="code"``: the released code is what ran the reported numbers, and
lensprobe's ARM follows it bit for bit. Where the sources disagree (:data:`DISAGREEMENTS`):

- AIME 2024, gemma-3-4b-it: paper 96.5, code 0.85 (85); gemma-3-27b-it: paper 85.0, code
  0.965 (96.5): the two Gemma cells look swapped in the table.
- AIME 2025, Qwen2.5-7B-Instruct: paper ``c = 0.13``, percentile 95.0; code 0.1, 99.5.
- Llama-3.1-8B-Instruct, every benchmark: ``p_min`` 0.02 in the paper's text, 0.2 in
  ``modeling_llama.py``.

Gemma percentiles are quantiles of ``|a|`` in ``[0, 1]`` (the code's 0.85; the table prints 85.0)
and use ``variant="gemma"``.

**Which model's presets.** A loaded model (or its :class:`~lensprobe.core.models.facts.ModelFacts`) is
recognised by its configuration (:data:`PRESET_ARCHITECTURES`: family, layers, heads, widths, vocabulary, the
rotary base and the position limit where they tell the models apart), whatever its name or folder: a copy
saved to a folder, a converted GGUF or a renamed checkpoint of Qwen2.5-Math-7B gets Qwen2.5-Math-7B's presets.
Only when the configuration matches none of the authors' models (or, for a ``HookedTransformer``, which has no
Hugging Face configuration, cannot be compared) does the name decide, as for a name given as text
(:func:`model_key`).

**Layer defaults.** A run of the authors' code that passes no ARM settings to ``generate`` (their pass@3
function, ``evaluate_pass_at3``) runs ARM with the defaults of the decoder layers in their modeling files:
``c = 0.13``, percentile 99.5 (Gemma: fraction 0.13, quantile 0.995), on the models and benchmarks where
their script loads the ARM model at all (a per-benchmark setting exists). ``arm_preset(...,
layer_defaults=True)`` gives those (:data:`LAYER_DEFAULTS`).
"""

from dataclasses import dataclass, field
from typing import Any, Literal

from lensprobe.core.errors import LensprobeError
from lensprobe.core.models.facts import Architecture, ModelFacts, architecture

__all__ = ["ARM_PRESETS", "BENCHMARKS", "DISAGREEMENTS", "LAYER_DEFAULTS", "PAPER_TABLE9", "PRESET_ARCHITECTURES", "ArmPreset",
           "NoPresetError", "arm_preset", "architecture_key", "benchmark_key", "model_key"]

Source = Literal["paper", "code"]
SOURCES = ("paper", "code")
BENCHMARKS = ("gpqa", "math500", "aime2024", "aime2025", "humaneval", "livecodebench")
"""The benchmarks of Table 9 (lensprobe's keys), in the table's column order."""

_ALIASES = {"gpqadiamond": "gpqa", "math": "math500", "aime24": "aime2024", "aime25": "aime2025",
            "livecode": "livecodebench", "lcb": "livecodebench"}

PAPER_TABLE9: dict[str, dict[str, tuple[float, float] | None]] = {
    # model: benchmark -> (c or Gemma fraction, percentile as printed), None for "-"
    "qwen2.5-math-1.5b": {"gpqa": (0.15, 99.5), "math500": (0.13, 99.5), "aime2024": (0.13, 99.5),
                          "aime2025": (0.13, 99.5), "humaneval": (0.13, 99.5), "livecodebench": None},
    "qwen2.5-math-7b": {"gpqa": (0.2, 99.5), "math500": (0.1, 95.0), "aime2024": (0.05, 90.0),
                        "aime2025": (0.13, 99.5), "humaneval": (0.13, 95.0), "livecodebench": None},
    "qwen2.5-7b-instruct": {"gpqa": (0.15, 99.5), "math500": (0.1, 99.5), "aime2024": None,
                            "aime2025": (0.13, 95.0), "humaneval": (0.05, 90.0), "livecodebench": (0.3, 99.5)},
    "qwen2.5-32b-instruct": {"gpqa": (0.05, 90.5), "math500": None, "aime2024": (0.13, 99.5),
                             "aime2025": (0.05, 99.0), "humaneval": (0.13, 99.5), "livecodebench": (0.3, 99.5)},
    "llama-3.1-8b-instruct": {"gpqa": (0.45, 80.0), "math500": (0.32, 90.0), "aime2024": (0.32, 90.0),
                              "aime2025": None, "humaneval": (0.3, 90.0), "livecodebench": (0.3, 90.0)},
    "gemma-3-4b-it": {"gpqa": (0.5, 96.5), "math500": (0.25, 85.0), "aime2024": (0.25, 96.5),
                      "aime2025": (0.25, 85.0), "humaneval": (0.25, 96.5), "livecodebench": (0.25, 75.0)},
    "gemma-3-27b-it": {"gpqa": (0.5, 96.5), "math500": (0.25, 85.0), "aime2024": (0.25, 85.0),
                       "aime2025": (0.25, 70.0), "humaneval": (0.25, 85.0), "livecodebench": (0.25, 85.0)},
}
"""Table 9 of arXiv 2510.01032 as printed (Gemma rows: the fraction ``p`` and the percentile)."""

_CODE_FILES = {"math500": "Math500/utils.py", "aime2024": "AIME2024/utils.py", "aime2025": "AIME2025/utils.py"}
_CODE: dict[str, dict[str, tuple[float, float] | None]] = {
    # choose_parameters(model) per benchmark script; None: the script runs no ARM for the model
    "math500": {"qwen2.5-math-1.5b": (0.13, 99.5), "qwen2.5-math-7b": (0.1, 95), "qwen2.5-7b-instruct": (0.1, 99.5),
                "qwen2.5-32b-instruct": None, "gemma-3-4b-it": (0.25, 0.85), "gemma-3-27b-it": (0.25, 0.85),
                "llama-3.1-8b-instruct": (0.32, 90)},
    "aime2024": {"qwen2.5-math-1.5b": (0.13, 99.5), "qwen2.5-math-7b": (0.05, 90), "qwen2.5-7b-instruct": None,
                 "qwen2.5-32b-instruct": (0.13, 99.5), "gemma-3-4b-it": (0.25, 0.85),
                 "gemma-3-27b-it": (0.25, 0.965), "llama-3.1-8b-instruct": (0.32, 90)},
    "aime2025": {"qwen2.5-math-1.5b": (0.13, 99.5), "qwen2.5-math-7b": (0.13, 99.5),
                 "qwen2.5-7b-instruct": (0.1, 99.5), "qwen2.5-32b-instruct": (0.05, 99),
                 "gemma-3-4b-it": (0.25, 0.85), "gemma-3-27b-it": (0.25, 0.7), "llama-3.1-8b-instruct": None},
}
LAYER_DEFAULTS = (0.13, 99.5)
"""``(c, percentile)`` the authors' decoder layers use when ``generate`` passes no ARM settings
(``range_c=0.13, percentage=99.5`` in ``modeling_qwen2.py``, ``modeling_llama.py`` and ``modeling_gemma3.py``;
Gemma reads them as fraction 0.13 and quantile 0.995)."""
_LAYER_DEFAULTS_ORIGIN = "code: modeling_*.py decoder layer defaults (range_c=0.13, percentage=99.5)"
_CODE_P_MIN = {"llama-3.1-8b-instruct": (0.2, "code: modeling_llama.py (arm pmin=0.2)")}
_PAPER_P_MIN = (0.02, "paper: Section 3 (p_min = 0.02)")

DISAGREEMENTS: tuple[tuple[str, str, str, str, str], ...] = (
    ("aime2024", "gemma-3-4b-it", "percentile", "0.965 (Table 9: 96.5)", "0.85 (AIME2024/utils.py)"),
    ("aime2024", "gemma-3-27b-it", "percentile", "0.85 (Table 9: 85.0)", "0.965 (AIME2024/utils.py)"),
    ("aime2025", "qwen2.5-7b-instruct", "c, percentile", "0.13, 95.0 (Table 9)", "0.1, 99.5 (AIME2025/utils.py)"),
    ("every benchmark", "llama-3.1-8b-instruct", "p_min", "0.02 (Section 3)", "0.2 (modeling_llama.py)"),
)
"""``(benchmark, model, setting, paper, code)`` for every setting on which the sources differ."""


class NoPresetError(LensprobeError):
    """No preset applies: a model the authors give no settings for, a cell where they report no ARM
    gain ("-" in Table 9), or an unknown benchmark (``None``). ``ARM.preset(..., fallback=...)``
    catches it."""


@dataclass(frozen=True)
class ArmPreset:
    """One preset: the :class:`~lensprobe.ARM` settings and where each value comes from.

    Attributes:
        model, benchmark: lensprobe's keys (``"qwen2.5-math-7b"``, ``"math500"``).
        source: ``"paper"`` or ``"code"``, the source asked for.
        settings: ``ARM`` fields (``c``, ``percentile``, and ``p_min`` / ``variant`` when not
            the default).
        sources: field -> where its value comes from (``"paper: Table 9"``,
            ``"code: Math500/utils.py"`` ...).
    """

    model: str
    benchmark: str
    source: str
    settings: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def benchmark_key(benchmark: str) -> str:
    """lensprobe's key for a benchmark name (``"MATH-500"`` -> ``"math500"``, ``"AIME24"`` -> ``"aime2024"``).

    Raises:
        LensprobeError: not one of :data:`BENCHMARKS` (or an alias).

    Example:
        >>> benchmark_key("GPQA-Diamond")
        'gpqa'
    """
    key = "".join(ch for ch in str(benchmark).lower() if ch not in "-_ ")
    key = _ALIASES.get(key, key)
    if key not in BENCHMARKS:
        raise LensprobeError(f"unknown benchmark {benchmark!r}: use one of {BENCHMARKS}.")
    return key


PRESET_ARCHITECTURES: dict[str, Architecture] = {
    # family, n_layers, n_heads, n_kv_heads, d_model, d_mlp, d_vocab, rope_theta, max_positions (None: not compared)
    "qwen2.5-math-1.5b": Architecture("qwen2", 28, 12, 2, 1536, 8960, 151936, 10000.0, 4096),
    "qwen2.5-math-7b": Architecture("qwen2", 28, 28, 4, 3584, 18944, 152064, 10000.0, 4096),
    "qwen2.5-7b-instruct": Architecture("qwen2", 28, 28, 4, 3584, 18944, 152064, 1000000.0, 32768),
    "qwen2.5-32b-instruct": Architecture("qwen2", 64, 40, 8, 5120, 27648, 152064, 1000000.0, 32768),
    "llama-3.1-8b-instruct": Architecture("llama", 32, 32, 8, 4096, 14336, 128256, 500000.0, 131072),
    "gemma-3-4b-it": Architecture("gemma3", 34, 8, 4, 2560, None, 262208, None, None),
    "gemma-3-27b-it": Architecture("gemma3", 62, 32, 16, 5376, None, 262208, None, None),
}
"""The configuration of each model with presets (its ``config.json``; Gemma 3: its ``text_config``): the layers,
heads, width and vocabulary as in ``lensprobe/evals/papers/arm-2510.01032-models.toml``, the Qwen MLP widths,
rotary bases and position limits as Lightning-AI/litgpt's ``litgpt/config.py`` transcribes them. ``None``: a
field not compared. Qwen2.5-Math-7B and Qwen2.5-7B-Instruct have the same dimensions and differ in the rotary
base and the position limit; DeepSeek-R1-Distill-Qwen-7B (Qwen2.5-Math-7B's dimensions and rotary base, 131072
positions), which has no preset, matches neither."""


def architecture_key(arch: Architecture) -> str | None:
    """The key of the one model with presets whose configuration is ``arch`` (every field
    :data:`PRESET_ARCHITECTURES` compares), or ``None`` when none (or, which cannot happen with the table as it is,
    several) match: then the configuration cannot decide.

    Example:
        >>> architecture_key(PRESET_ARCHITECTURES["qwen2.5-math-7b"])
        'qwen2.5-math-7b'
    """
    found = [key for key, known in PRESET_ARCHITECTURES.items()
             if all(want is None or getattr(arch, name) == want for name, want in vars(known).items())]
    return found[0] if len(found) == 1 else None


def _configured_key(model: Any) -> str | None:
    """:func:`architecture_key` of a loaded model; ``None`` for an object without a full ``cfg``."""
    try:
        return architecture_key(architecture(model))
    except (AttributeError, TypeError, ValueError):
        return None


def model_key(model: Any) -> str:
    """lensprobe's key for a model. A loaded model or its :class:`~lensprobe.core.models.facts.ModelFacts`: the
    key of the model with presets of the same configuration (:func:`architecture_key`); else, and for a name, the
    name without the organisation, lower case (a loaded model's ``cfg.model_name``; facts' ``name``).

    Example:
        >>> model_key("Qwen/Qwen2.5-Math-7B")
        'qwen2.5-math-7b'
    """
    if isinstance(model, ModelFacts):
        model = architecture_key(model.architecture) or model.name
    elif not isinstance(model, str):
        model = _configured_key(model) or getattr(getattr(model, "cfg", None), "model_name", None) or repr(model)
    return str(model).strip().rstrip("/").split("/")[-1].lower()


def _cell(model: str, bench: str, source: str) -> tuple[tuple[float, float] | None, str]:
    if source == "code" and bench in _CODE:
        return _CODE[bench].get(model), f"code: {_CODE_FILES[bench]}"
    return PAPER_TABLE9[model][bench], "paper: Table 9"


def arm_preset(model: Any, benchmark: str | None = "math500", source: Source = "code", *,
               layer_defaults: bool = False) -> ArmPreset:
    """The authors' ARM settings for ``model`` on ``benchmark``, from ``source``, with each value's origin.

    Args:
        model: a model name with or without organisation, or a loaded model or its ModelFacts (recognised by its
            configuration first: :func:`model_key`).
        benchmark: one of :data:`BENCHMARKS` (case, ``-``, ``_`` ignored; ``aime24``, ``gpqa-diamond`` ...);
            ``None``: the benchmark is not known, so no preset applies.
        source: ``"code"`` (default: the released code's value where it has one, else Table 9)
            or ``"paper"`` (Table 9 and the paper's text). See :data:`DISAGREEMENTS`.
        layer_defaults: ``c`` and the percentile of the authors' decoder layers (:data:`LAYER_DEFAULTS`,
            what their pass@3 code runs) instead of the benchmark's, where the benchmark has a setting
            (``source`` still picks ``p_min``).

    Raises:
        LensprobeError: an unknown source or benchmark name.
        NoPresetError: an unknown model, ``benchmark=None``, or a cell where the authors report
            no ARM gain ("-" in Table 9; no setting in the code).

    Example:
        >>> p = arm_preset("google/gemma-3-27b-it", "aime2024", source="paper")
        >>> p.settings["percentile"], p.sources["percentile"]
        (0.85, 'paper: Table 9')
    """
    if source not in SOURCES:
        raise LensprobeError(f"source must be 'paper' (Table 9) or 'code' (the released code), got {source!r}.")
    bench = benchmark_key(benchmark) if benchmark is not None else None
    key = model_key(model)
    if key not in PAPER_TABLE9:
        shown = model if isinstance(model, str) else key
        raise NoPresetError(
            f"no ARM preset for {shown!r}{f' on {bench}' if bench else ''} (the authors give settings for "
            f"{', '.join(PAPER_TABLE9)}). With no ARM preset for model {shown!r}, choose c and percentile yourself "
            "and pass them: lp.ARM(c=..., percentile=...), e.g. lp.evaluate(..., arm=lp.ARM(c=0.1, percentile=95)) "
            "(--arm-c, --arm-percentile) or a condition lp.Condition('ARM', interventions=(lp.ARM(c=..., "
            "percentile=...),)); or lp.ARM.preset(model, fallback={'c': 0.1, 'percentile': 95}) to use those "
            "settings where there is no preset."
        )
    if bench is None:
        raise NoPresetError(
            "cannot tell which benchmark these problems are, so no ARM preset applies: pass benchmark='math500' / "
            "'aime2024' / 'aime2025' ... (--benchmark), or arm=lp.ARM(c=0.1, percentile=95) (--arm-c, "
            "--arm-percentile)."
        )
    cell, origin = _cell(key, bench, source)
    if cell is None:
        raise NoPresetError(
            f"the authors report no ARM gain for {key} on {bench} ('-' in Table 9 of arXiv 2510.01032, no setting "
            f"in their code), so there is no preset: choose c and percentile yourself with lp.ARM(c=..., "
            "percentile=...), pass fallback={'c': ..., 'percentile': ...} to lp.ARM.preset, or leave ARM out of "
            "this benchmark."
        )
    c, pct = cell if not layer_defaults else LAYER_DEFAULTS
    if layer_defaults:
        origin = _LAYER_DEFAULTS_ORIGIN
    gemma = key.startswith("gemma-3")
    settings: dict[str, Any] = {"c": c, "percentile": pct / 100 if gemma and pct > 1 else pct}
    sources = {"c": origin, "percentile": origin}
    if gemma:
        settings["variant"], sources["variant"] = "gemma", "code: modeling_gemma3.py (the Gemma-3 rule)"
    else:
        p_min, p_origin = _CODE_P_MIN.get(key, _PAPER_P_MIN) if source == "code" else _PAPER_P_MIN
        settings["p_min"], sources["p_min"] = p_min, p_origin
    return ArmPreset(model=key, benchmark=bench, source=source, settings=settings, sources=sources)


def _table(source: Source) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for bench in BENCHMARKS:
        for key in PAPER_TABLE9:
            try:
                out.setdefault(bench, {})[key] = arm_preset(key, bench, source).settings
            except LensprobeError:
                continue
    return out


ARM_PRESETS: dict[str, dict[str, dict[str, Any]]] = _table("code")
"""The default presets (``source="code"``) as ``benchmark -> model -> ARM settings``."""
