"""The ARM settings of ``lensprobe eval`` and ``lensprobe reproduce`` from an ``argparse`` namespace.

The options themselves (``--arm-c``, ``--arm-percentile``, ``--arm-p-min``, ``--arm-variant``,
``--arm-source``) are the fields of :data:`~lensprobe.interventions.arm_settings.ArmSettings`, read from the
parsed object (``args.arm``), never from a flat namespace; the ARM
starts from the authors' preset from ``--arm-source``
(:meth:`~lensprobe.interventions.arm_settings.ArmSettingsBase.arm`).
"""

from lensprobe.interventions.arm_settings import ArmSettingsBase

__all__ = ["arm_from_args"]


def arm_from_args(args, model=None, benchmark: str | None = None, *, layer_defaults: bool = False):
    """The ARM of the ``--arm-*`` options in ``args`` (the parsed namespace of ``lensprobe eval``: its
    ``args.arm``): the preset of ``model`` (default: the ``--model`` name) on ``benchmark`` (default:
    ``--benchmark``) from ``--arm-source``, with the options given on top.

    Raises:
        NoPresetError: no option given and no preset.

    Example:
        >>> args = build_parser().parse_args(["eval", "--model", "Qwen/Qwen2.5-Math-7B", "--arm-c", "0.2"])
        >>> arm_from_args(args, benchmark="math500")
        ARM(layer=0, c=0.2, percentile=95, ...)
    """
    settings: ArmSettingsBase = args.arm
    name = model if model is not None else args.ModelOptions.model
    return settings.arm(name, benchmark if benchmark is not None else args.ConditionOptions.benchmark,
                        layer_defaults=layer_defaults)
