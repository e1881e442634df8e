"""What generic code must know about an intervention, declared in one typed object.

An intervention is anything with a ``hooks(model)`` method. Most need nothing more. One whose
result generic code must treat specially (the generation loop, continuous batching, sweeps,
evaluations) declares it as ``capabilities``, a :class:`Capabilities` (a class attribute, an
instance attribute or a property), and :func:`capabilities` is the one place it is read:

- ``batch_dependent``: one row's result depends on the other rows of its forward (statistics over
  the whole batch tensor). :func:`lensprobe.generate` then runs static batches (never continuous
  batching, whose refill schedule would decide which rows share a forward), evaluations generate
  each problem alone, and sweeps refuse it (each batch row there ablates another head).
- ``rounding_sensitive_layer``: the last layer whose activations the intervention thresholds or
  ranks, so a float-rounding difference there can change its result (ARM: its layer). The plain
  engine then computes decode steps row by row up to that layer
  (:mod:`lensprobe.generation.engines.rowwise`), so under continuous batching each row gets the
  numbers it gets alone, bit for bit.
- ``seeded``: it draws random numbers and offers ``with_default_seed(seed)``, a copy that draws
  from ``seed`` when it has no seed of its own; evaluations seed it with their run's ``seed``.
- ``positions``: it acts on token positions and offers ``check_positions(length, what)``, which
  refuses positions a run of ``length`` positions never reaches, before any forward; its hooks
  read their positions from the hook they receive (``hook.positions(...)``).
- ``binds_to_prompt``: it offers ``bind(prompt)``, a copy with settings that name parts of a
  prompt (segment names such as ``"filler"``) resolved against that prompt; evaluations and
  generations bind it to each prompt they run.

A declared method that is missing, or a capability written the old way (an attribute such as
``batch_dependent = True`` or a ``with_default_seed`` method with no ``capabilities``), is refused
with the fix: generic code never guesses what an intervention can do.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lensprobe.core.errors import LensprobeError

__all__ = ["NONE", "Capabilities", "bind_interventions", "capabilities"]

_METHODS = {"seeded": "with_default_seed", "positions": "check_positions", "binds_to_prompt": "bind"}
_OLD_ATTRIBUTES = ("batch_dependent", "rounding_sensitive_layer", *_METHODS.values())


@dataclass(frozen=True)
class Capabilities:
    """What generic code must know about an intervention (see the module docstring).

    Attributes:
        batch_dependent: a row's result depends on the other rows of its forward.
        rounding_sensitive_layer: the last layer it thresholds or ranks activations at, or ``None``.
        seeded: it draws random numbers; it has ``with_default_seed(seed)``.
        positions: it acts on token positions; it has ``check_positions(length, what)``.
        binds_to_prompt: it has ``bind(prompt)``, resolving settings that name parts of a prompt.

    Example:
        >>> lp.ARM(c=0.1, percentile=95).capabilities
        Capabilities(batch_dependent=False, rounding_sensitive_layer=0, seeded=True, positions=False, binds_to_prompt=False)
    """

    batch_dependent: bool = False
    rounding_sensitive_layer: int | None = None
    seeded: bool = False
    positions: bool = False
    binds_to_prompt: bool = False

    def __post_init__(self) -> None:
        for name in ("batch_dependent", *_METHODS):
            if not isinstance(getattr(self, name), bool):
                raise LensprobeError(f"Capabilities.{name} must be True or False, got {getattr(self, name)!r}.")
        layer = self.rounding_sensitive_layer
        if layer is not None and (not isinstance(layer, int) or isinstance(layer, bool) or layer < 0):
            raise LensprobeError(f"Capabilities.rounding_sensitive_layer must be a layer index or None, got {layer!r}.")


NONE = Capabilities()
"""The capabilities of an intervention that declares none (and of ``(name, fn)`` pairs)."""


def capabilities(item: Any) -> Capabilities:
    """The declared :class:`Capabilities` of an intervention (:data:`NONE` when it declares none).

    Raises:
        LensprobeError: ``capabilities`` is not a :class:`Capabilities`; a declared method is
            missing; or a capability is written the old way, without a declaration.

    Example:
        >>> capabilities(lp.ablate_heads("L0H1", positions="filler")).binds_to_prompt
        True
    """
    if isinstance(item, tuple):  # a (hook_name, fn) pair
        return NONE
    declared = getattr(item, "capabilities", None)
    name = type(item).__name__
    if declared is None:
        old = [a for a in _OLD_ATTRIBUTES if getattr(item, a, None) is not None and getattr(item, a) is not False]
        if old:
            raise LensprobeError(
                f"{name} has {', '.join(old)} but declares no capabilities, so generic code would ignore "
                f"{'them' if len(old) > 1 else 'it'}: declare them in one object, e.g. "
                f"capabilities = lp.interventions.Capabilities(...) (see lensprobe.core.hooks.capabilities)."
            )
        return NONE
    if not isinstance(declared, Capabilities):
        raise LensprobeError(
            f"{name}.capabilities is a {type(declared).__name__}: make it an lp.interventions.Capabilities(...)."
        )
    for flag, method in _METHODS.items():
        if getattr(declared, flag) and not callable(getattr(item, method, None)):
            raise LensprobeError(f"{name} declares {flag}=True but has no {method}() method: add it, or drop the flag.")
    return declared


def bind_interventions(interventions: Sequence[Any], prompt) -> tuple[tuple, bool]:
    """Interventions bound to ``prompt`` (those that declare ``binds_to_prompt``: their
    ``bind(prompt)``, see :class:`Capabilities`), and whether binding changed any of
    them (e.g. positions given as segment names).

    Example:
        >>> bound, changed = bind_interventions(cond.interventions, prompt)
    """
    bound = tuple(i.bind(prompt) if capabilities(i).binds_to_prompt else i for i in interventions)
    return bound, any(new is not old for new, old in zip(bound, interventions, strict=True))
