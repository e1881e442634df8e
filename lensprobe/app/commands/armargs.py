"""The ARM settings of ``lensprobe eval`` and ``lensprobe reproduce`` from an ``argparse`` namespace.

The options themselves (``--arm-c``, ``--arm-percentile``, ``--arm-p-min``, ``--arm-variant``,
``--arm-source``) are the fields of :data:`~lensprobe.interventions.arm_settings.ArmSettings`; the ARM
starts from the authors' preset from ``--arm-source``
(:meth:`~lensprobe.interventions.arm_settings.ArmSettingsBase.arm`).
"""

import dataclasses

from lensprobe.interventions.arm_settings import ArmSettings

__all__ = ["arm_from_args"]


def arm_from_args(args, model=None, benchmark: str | None = None, *, layer_defaults: bool = False):
    """The ARM of the ``--arm-*`` options in ``args``: the preset of ``model`` (default: the ``--model``
    name) on ``benchmark`` (default: ``--benchmark``) from ``--arm-source``, with the options given on top.

    Raises:
        NoPresetError: no option given and no preset.

    Example:
        >>> arm_from_args(argparse.Namespace(arm_c=0.2, model="Qwen/Qwen2.5-Math-7B"), benchmark="math500")
        ARM(layer=0, c=0.2, percentile=95, ...)
    """
    names = [f.name for f in dataclasses.fields(ArmSettings)]
    settings = ArmSettings(**{n: getattr(args, n, None) for n in names})
    name = model if model is not None else getattr(args, "model", None)
    return settings.arm(name, benchmark if benchmark is not None else getattr(args, "benchmark", None),
                        layer_defaults=layer_defaults)
