"""Settings as given: a configuration dataclass whose every field may be left out.

Some settings come from elsewhere when they are not given: an evaluation protocol, the model's own
generation config, an ARM preset. :func:`given_settings` makes, from a configuration class, a frozen
dataclass with the same fields (types, documentation and metadata), each ``T | None`` with
``None`` for "not given"; :meth:`Given.given` returns the fields that were given, and the code that
knows where the others come from fills them in once (e.g.
:meth:`lensprobe.evals.running.settings.EvalSettingsBase.resolve`). A field added to the configuration is a
field here too, "not given" unless given.

Example:
    >>> GivenGeneration = given_settings(GenerationConfig, "GivenGeneration")
    >>> GivenGeneration(top_p=0.9).given()
    {'top_p': 0.9}
"""

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Optional, get_args, get_origin, get_type_hints

from lensprobe.core.checks import check_annotated
from lensprobe.core.errors import LensprobeError
from lensprobe.core.fielddocs import field_docs

__all__ = ["Given", "given_settings", "seconds_from_env"]


class Given:
    """The base of the classes :func:`given_settings` makes; ``settings_of`` is the configuration class whose
    fields a made class takes (where each of its settings is declared). Each field given is checked against its
    type when made (:func:`~lensprobe.core.checks.check_annotated`)."""

    settings_of: Any = None

    def __post_init__(self) -> None:
        check_annotated(self)

    def given(self) -> dict[str, Any]:
        """``field -> value`` of the fields that were given (not ``None``).

        Example:
            >>> GivenGeneration(top_p=0.9).given()
            {'top_p': 0.9}
        """
        prefix = getattr(self, "prefix", "")
        return {f.name.removeprefix(prefix): getattr(self, f.name)
                for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if getattr(self, f.name) is not None}


def given_settings(cls: type, name: str, *, exclude: Sequence[str] = (), extra: Sequence[tuple] = (),
                   metadata: Mapping[str, Mapping[str, Any]] | None = None, base: type = Given,
                   docs: Mapping[str, str] | None = None, prefix: str = "") -> type:
    """A frozen dataclass with the fields of the dataclass ``cls``, each ``T | None = None`` ("not given").

    Args:
        cls: the configuration class.
        name: the new class's name.
        exclude: fields of ``cls`` left out; fields whose metadata says ``"cmd": False`` are left out too.
        extra: more fields, as ``dataclasses.make_dataclass`` takes them (with defaults).
        metadata: ``field -> metadata`` merged into a field's (e.g. its command-line choices).
        base: the base class (a subclass of :class:`Given` with methods of its own).
        docs: ``field -> documentation`` (default: ``cls``'s, kept as each field's ``metadata["help"]``).
        prefix: put before each field's name (``"arm_"``: ``c`` -> ``arm_c``, the option ``--arm-c``);
            :meth:`Given.given` gives the names without it.

    Example:
        >>> given_settings(ARM, "GivenARM", exclude=["seed"])(c=0.2).given()
        {'c': 0.2}
    """
    docs = dict(field_docs(cls), **(docs or {}))
    hints = get_type_hints(cls)
    extra_names = {spec[0] for spec in extra}
    specs: list[tuple] = []
    for f in dataclasses.fields(cls):
        if f.name in exclude or f.name in extra_names or not f.metadata.get("cmd", True):
            continue
        meta = {**f.metadata, **(metadata or {}).get(f.name, {})}
        if hints[f.name] is bool:  # a flag: given alone, it is True (not given: None)
            meta["custom_args"] = {"const": True, **meta.get("custom_args", {})}
        if get_origin(hints[f.name]) is Literal:  # its values as the option's choices, also when None is allowed
            meta["custom_args"] = {"choices": get_args(hints[f.name]), **meta.get("custom_args", {})}
        if docs.get(f.name):
            meta["help"] = docs[f.name]
        specs.append((prefix + f.name, Optional[hints[f.name]],  # noqa: UP045
                      dataclasses.field(default=None, metadata=meta)))
    made = dataclasses.make_dataclass(name, [*specs, *extra], bases=(base,), frozen=True,
                                      namespace={"prefix": prefix, "settings_of": cls})
    made.__doc__ = f"{cls.__name__}'s settings as given (one not given is None: it comes from elsewhere)."
    return made


def seconds_from_env(var: str, default: float, what: str) -> float:
    """A time limit in seconds: ``$var`` when set, else ``default``; anything but a positive finite number is
    refused, naming the variable, ``what`` it limits and the fix.

    Example:
        >>> seconds_from_env("LENSPROBE_UNSET_LIMIT", 60.0, "an export")
        60.0
    """
    text = os.environ.get(var, "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise LensprobeError(f"{var}={text!r} is not a positive number of seconds for {what}: set it to e.g. 600, "
                             "or unset it.")
    return value
