"""The ARM and benchmark options shared by ``lensprobe eval`` and ``lensprobe reproduce``.

``--arm-c``, ``--arm-percentile``, ``--arm-p-min`` and ``--arm-variant`` start from the authors' preset
for the model on ``--benchmark`` (``--arm-source code|paper``) and override only what is given; a
model without a preset needs ``--arm-c`` and ``--arm-percentile``.
"""

import argparse

from lensprobe.app.options import Option, add_options, option_values
from lensprobe.core.errors import LensprobeError
from lensprobe.interventions.arm import ARM
from lensprobe.interventions.arm_presets import BENCHMARKS, PAPER_TABLE9, arm_preset, benchmark_key, model_key

__all__ = ["ARM_FLAGS", "ARM_OPTIONS", "add_arm_arguments", "add_benchmark_arguments", "arm_from_args",
           "benchmark_arg"]

ARM_OPTIONS: dict[str, Option] = {
    "c": Option(flag="--arm-c", default=None,
                help="c of the ARM module attached by 'ARM' / '<name>+ARM' conditions (Gemma variant: the fraction "
                     "moved); every --arm-* option starts from the authors' preset for the model on --benchmark and "
                     "overrides only what is given (a model without a preset needs --arm-c and --arm-percentile)"),
    "percentile": Option(flag="--arm-percentile", default=None,
                         help="percentile of the ARM module (0-100; Gemma variant: a quantile in [0, 1])"),
    "p_min": Option(flag="--arm-p-min", default=None,
                    help="lower bound of the moved fraction (default: the preset's; 0.02, Llama 0.2 in the code)"),
    "variant": Option(flag="--arm-variant", default=None, help="ARM rule (default: the preset's)"),
}
"""The :class:`~lensprobe.ARM` fields on the command line: types and choices from the fields, ``None``
(not given: the preset's value) by default."""

ARM_FLAGS = {name: opt.dest_of(name) for name, opt in ARM_OPTIONS.items()}
"""ARM field -> the ``args`` attribute of its ``--arm-*`` option."""


def benchmark_arg(text: str) -> str:
    """An argparse ``type``: a benchmark name as lensprobe's key (``MATH-500`` -> ``math500``)."""
    try:
        return benchmark_key(text)
    except LensprobeError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_benchmark_arguments(p: argparse.ArgumentParser) -> None:
    """``--benchmark``."""
    p.add_argument("--benchmark", type=benchmark_arg, default=None,
                   help=f"the problems' benchmark, which picks the ARM preset: one of {', '.join(BENCHMARKS)} "
                        "(default: inferred for lensprobe's MATH-500 copy and aime2025* files)")


def add_arm_arguments(p: argparse.ArgumentParser) -> None:
    """``--arm-c``, ``--arm-percentile``, ``--arm-p-min``, ``--arm-variant`` (:data:`ARM_OPTIONS`), ``--arm-source``."""
    add_options(p, ARM, ARM_OPTIONS)
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
    given = option_values(args, ARM, ARM_OPTIONS, given=True)
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
