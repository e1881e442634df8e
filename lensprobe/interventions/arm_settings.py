"""ARM's settings as given: :data:`ArmSettings`, the ARM fields a command line sets (``c``,
``percentile``, ``p_min``, ``variant``), each ``None`` when not given, and where presets come from.

:meth:`ArmSettingsBase.arm` is the one place a partial setting is completed: the authors' preset for
the model on the benchmark from ``--arm-source`` (also when nothing else is given), with the settings
given on top.

Example:
    >>> ArmSettings(arm_c=0.2).arm("Qwen/Qwen2.5-Math-7B", "math500")
    ARM(layer=0, c=0.2, percentile=95, ...)
"""

from dataclasses import field
from typing import Any, Literal

from lensprobe.core.errors import LensprobeError
from lensprobe.core.given import Given, given_settings
from lensprobe.interventions.arm import ARM
from lensprobe.interventions.arm_presets import PAPER_TABLE9, NoPresetError, Source, model_key

__all__ = ["ARM_C_HELP", "ArmSettings", "ArmSettingsBase"]

ARM_FIELDS = ("c", "percentile", "p_min", "variant")
"""The ARM fields a command line sets (``--arm-c``, ``--arm-percentile``, ``--arm-p-min``, ``--arm-variant``)."""


class ArmSettingsBase(Given):
    """What :data:`ArmSettings` adds to its fields: the check when made, and :meth:`arm`."""

    arm_source: Any

    def __post_init__(self) -> None:
        super().__post_init__()
        given = self.settings()
        if "c" in given and "percentile" in given:
            ARM(**given)  # a whole setting: check it now
        elif given:
            ARM(**{"c": 0.1, "percentile": 90, **given})  # the given values, checked with stand-ins

    def settings(self) -> dict[str, Any]:
        """The ARM fields given (``source`` is not one)."""
        return {k: v for k, v in self.given().items() if k != "source"}

    @property
    def source(self) -> Source:
        """Where presets come from: ``--arm-source`` (``"code"`` when not given)."""
        return self.arm_source or "code"

    def arm(self, model_name: Any, benchmark: str | None, *, layer_defaults: bool = False) -> ARM:
        """The ARM of these settings: the preset of ``model_name`` (a name or a loaded model) on ``benchmark``
        from :attr:`source` (the decoder layers' defaults with ``layer_defaults``), with the settings given on
        top; the settings given alone when there is no preset and they hold ``c`` and ``percentile``.

        Callers that need an ARM only for ARM conditions pass ``lambda: settings.arm(model, benchmark)``, so
        a model without a preset fails only when an ARM condition asks for one.

        Raises:
            NoPresetError: nothing given and no preset (the message says what to pass).
            LensprobeError: a partial setting for a model or benchmark without a preset, or a bad value.
        """
        given = self.settings()
        try:
            return ARM.preset(model_name, benchmark, source=self.source, layer_defaults=layer_defaults, **given)
        except NoPresetError as err:
            if not given or ("c" in given and "percentile" in given):
                if not given:
                    raise
                return ARM(**given)
            if model_name is None or model_key(model_name) not in PAPER_TABLE9:
                why = f"no ARM preset for {model_key(model_name)!r} to start from" if model_name is not None \
                    else "no ARM preset to start from"
            elif benchmark is None:
                why = f"no benchmark to take {model_key(model_name)}'s ARM preset from (lensprobe eval: --benchmark)"
            else:
                why = (f"the authors report no ARM gain for {model_key(model_name)} on {benchmark}, so there is no "
                       "preset to start from")
            raise LensprobeError(f"{why}: give both --arm-c and --arm-percentile.") from err


ARM_C_HELP = ("c of the ARM module of the ARM conditions ('ARM', '<name>+ARM', mechanism's 'w/o + ARM'; Gemma "
              "variant: the fraction moved); every ARM setting starts from the authors' preset for the model (on the "
              "benchmark) and overrides only what is given (a model without a preset needs c and percentile)")
"""The help of ``--arm-c``, for every command that takes it."""

_SOURCE_HELP = ("where the ARM presets come from, also when no other --arm-* option is given: code (the authors' "
                "released code, the default) or paper (Table 9 and the paper's text)")

ArmSettings: Any = given_settings(
    ARM, "ArmSettings", base=ArmSettingsBase,
    exclude=["layer", "p_max", "k", "mode", "seed", "per_row", "source"],
    extra=[("arm_source", Literal["code", "paper"] | None,
            field(default=None, metadata={"custom_args": {"choices": ("code", "paper")}, "help": _SOURCE_HELP}))],
    prefix="arm_",
    docs={"c": ARM_C_HELP,
          "percentile": "percentile of the ARM module (0-100; Gemma variant: a quantile in [0, 1])",
          "p_min": "lower bound of the moved fraction (default: the preset's; 0.02, Llama 0.2 in the code)",
          "variant": "ARM rule (default: the preset's)"})
"""ARM's command-line fields, each ``None`` when not given (see the module docs)."""
