"""A resumable run's identity: the model's (its weights hashed at the start of the run) and every part's,
under the identity rule of :mod:`lensprobe.core.storage.identity`, and the refusal of a folder written under
another rule.

Example:
    >>> run_identity(model, prompts=[prompt], metric="entropy")["identity"]
    2
"""

from collections.abc import Mapping
from typing import Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.identity import IDENTITY_VERSION, identity

__all__ = ["check_identity_rule", "model_identity", "run_identity"]


def model_identity(model) -> dict:
    """A model's identity: a digest of every parameter and buffer (:func:`~lensprobe.core.storage.identity.weights_digest`), with its
    type, dtype and shape beside as labels (they follow from the weights and configuration).

    Example:
        >>> model_identity(model)["n_layers"]
        30
    """
    return identity(model)


def run_identity(model, **parts: Any) -> dict:
    """What a resumable run records as its settings: the identity rule, the model's identity (its
    weights hashed now, at the start of the run) and every part (prompts, interventions, metric,
    settings, defaults included) by :func:`identity`.

    Raises:
        LensprobeError: a part that cannot be identified, such as undeclared user code (the message
            names it and says how to declare it: :func:`~lensprobe.core.storage.declared.declare`).

    Example:
        >>> run_identity(model, prompts=[prompt], metric="entropy")["identity"]
        2
    """
    return {"identity": IDENTITY_VERSION, "model": model_identity(model),
            **{name: identity(value, name) for name, value in parts.items()}}



def check_identity_rule(recorded: Mapping[str, Any], folder: Any) -> None:
    """Refuse a folder whose settings ``recorded`` were identified under another identity rule.

    Raises:
        LensprobeError: the folder was written before identities were by content (or under
            another rule): its results cannot be checked against this run's, so they are never
            reused; the message says to rerun into a new folder.

    Example:
        >>> check_identity_rule({"identity": IDENTITY_VERSION}, "runs/x")   # no error
    """
    got = recorded.get("identity")
    if got == IDENTITY_VERSION:
        return
    before = "an older lensprobe, which identified runs by repr() and the model's name" if got is None else \
        f"identity rule {got!r}"
    raise LensprobeError(
        f"{folder} was written by {before}; this lensprobe identifies every run by content (identity rule "
        f"{IDENTITY_VERSION}: model weights, prompts, interventions and metrics by value), so the folder's results "
        "cannot be checked against this run and are not reused. Rerun into a new output folder (or delete this one "
        "to start over); the old folder stays as it is."
    )
