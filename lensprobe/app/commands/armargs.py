"""The ARM, benchmark and protocol options shared by ``lensprobe eval`` and ``lensprobe reproduce``.

``--arm-c``, ``--arm-percentile``, ``--arm-p-min`` and ``--arm-variant`` start from the authors' preset
for the model on ``--benchmark`` (``--arm-source code|paper``) and override only what is given; a
model without a preset needs ``--arm-c`` and ``--arm-percentile``.
"""

import argparse

from lensprobe.core.errors import LensprobeError
from lensprobe.evals.protocols import PROTOCOLS
from lensprobe.interventions.arm import ARM
from lensprobe.interventions.arm_presets import BENCHMARKS, PAPER_TABLE9, arm_preset, benchmark_key, model_key

__all__ = ["ARM_FLAGS", "add_arm_arguments", "add_benchmark_arguments", "arm_from_args", "benchmark_arg"]

ARM_FLAGS = {"c": "arm_c", "percentile": "arm_percentile", "p_min": "arm_p_min", "variant": "arm_variant"}
"""ARM field -> the ``args`` attribute of its ``--arm-*`` option."""


def benchmark_arg(text: str) -> str:
    """An argparse ``type``: a benchmark name as lensprobe's key (``MATH-500`` -> ``math500``)."""
    try:
        return benchmark_key(text)
    except LensprobeError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_benchmark_arguments(p: argparse.ArgumentParser, *, protocol: bool = True) -> None:
    """``--benchmark`` (and ``--protocol``)."""
    p.add_argument("--benchmark", type=benchmark_arg, default=None,
                   help=f"the problems' benchmark, which picks the ARM preset: one of {', '.join(BENCHMARKS)} "
                        "(default: inferred for lensprobe's MATH-500 copy and aime2025* files)")
    if protocol:
        p.add_argument("--protocol", default=None, choices=tuple(PROTOCOLS),
                       help="one of the authors' protocols, recorded in config.json: arm-math500 (raw prompt, 2048 "
                            "tokens, the model's generation config, paper-exact) or arm-aime-pass3 (single-brace "
                            "prompt, 512 tokens, sampling, 20 samples, pass@3); options given still win")


def add_arm_arguments(p: argparse.ArgumentParser) -> None:
    """``--arm-c``, ``--arm-percentile``, ``--arm-p-min``, ``--arm-variant``, ``--arm-source``."""
    p.add_argument("--arm-c", type=float, default=None,
                   help="c of the ARM module attached by 'ARM' / '<name>+ARM' conditions (Gemma variant: the fraction "
                        "moved); every --arm-* option starts from the authors' preset for the model on --benchmark "
                        "and overrides only what is given (a model without a preset needs --arm-c and "
                        "--arm-percentile)")
    p.add_argument("--arm-percentile", type=float, default=None,
                   help="percentile of the ARM module (0-100; Gemma variant: a quantile in [0, 1])")
    p.add_argument("--arm-p-min", type=float, default=None,
                   help="lower bound of the moved fraction (default: the preset's; 0.02, Llama 0.2 in the code)")
    p.add_argument("--arm-variant", default=None, choices=("default", "gemma"), help="ARM rule (default: the preset's)")
    p.add_argument("--arm-source", default="code", choices=("code", "paper"),
                   help="where presets come from: code (the authors' released code, default) or paper (Table 9)")


def arm_from_args(args, model=None, benchmark: str | None = None):
    """The ARM of ``--arm-*``: the preset of ``model`` (default: the ``--model`` name) on ``benchmark``
    with the options given on top; ``None`` when no ``--arm-*`` value is given (the preset is then
    taken when an ARM condition needs it).

    Raises:
        LensprobeError: a partial setting for a model or benchmark without a preset, or a bad value.

    Example:
        >>> arm_from_args(argparse.Namespace(arm_c=0.2, model="Qwen/Qwen2.5-Math-7B"), benchmark="math500")
        ARM(layer=0, c=0.2, percentile=95, ...)
    """
    given = {field: getattr(args, attr, None) for field, attr in ARM_FLAGS.items()}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return None
    name = model if model is not None else getattr(args, "model", None)
    benchmark = benchmark if benchmark is not None else getattr(args, "benchmark", None)
    base: dict = {}
    if name is None:
        why = "no ARM preset to start from"
    elif model_key(name) not in PAPER_TABLE9:
        why = f"no ARM preset for {model_key(name)!r} to start from"
    elif benchmark is None:
        why = f"no benchmark to take {model_key(name)}'s ARM preset from (pass --benchmark)"
    else:
        why = f"the authors report no ARM gain for {model_key(name)} on {benchmark}, so there is no preset to start from"
        try:
            base = arm_preset(name, benchmark, getattr(args, "arm_source", "code")).settings
        except LensprobeError:
            base = {}
    settings = {**base, **given}
    if "c" not in settings or "percentile" not in settings:
        raise LensprobeError(f"{why}: give both --arm-c and --arm-percentile.")
    return ARM(**settings)
