"""What :class:`lensprobe.evals.lmeval.LensprobeLM` makes of its arguments: the condition with ARM and its
checks, the filler's text, the batch size, each intervention described for lm-eval's results, and a
generation cut at its stop strings."""

from typing import Any

from lensprobe.core.checks import count
from lensprobe.core.errors import LensprobeError
from lensprobe.core.models.facts import ModelFacts
from lensprobe.core.prompts.conditions import Condition, arm_base, resolve_conditions, with_arm
from lensprobe.core.prompts.fillers import Filler
from lensprobe.core.storage.identity import IdentityError, identity
from lensprobe.interventions import ARM

__all__ = ["arm_of", "batch_size_of", "condition_of", "cut_at", "described", "filler_text"]


def described(intervention: Any) -> Any:
    """An intervention by content (its settings, tensors by digest) for lm-eval's results; never its ``repr``,
    which summarises tensors and hides closures. One that cannot be described is named by its type."""
    try:
        return identity(intervention)
    except IdentityError:
        return {".type": type(intervention).__qualname__, ".identity": "not describable by content"}



def cut_at(text: str, until: list[str]) -> str:
    """``text`` up to the first of the ``until`` strings (HF's ``hf`` model cuts each in turn, the same)."""
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text


def batch_size_of(value: Any) -> int:
    """lm-eval's ``batch_size`` model argument (text on its command line) as a count >= 1 (no ``"auto"``)."""
    return count("batch_size", int(value) if str(value).strip().isdigit() else value, 1)


def arm_of(facts: ModelFacts, arm: Any, benchmark: str | None, source: str, **given: Any) -> Any:
    """The ARM the settings ask for (an intervention given as ``arm`` is taken as it is), or ``None``; the preset
    is the model's by its configuration (:func:`~lensprobe.interventions.arm_presets.model_key`)."""
    fields = {k: v for k, v in given.items() if v is not None}
    if arm is None:
        return ARM(**fields) if "c" in fields or "percentile" in fields else None
    if arm == "preset":
        return ARM.preset(facts, benchmark, source=source, **fields)  # type: ignore[arg-type]
    if isinstance(arm, str) or not hasattr(arm, "hooks"):
        raise LensprobeError(f"arm must be 'preset', an lp.ARM or None, got {arm!r}.")
    return arm


def condition_of(condition: Any, arm: Any) -> Condition:
    """The condition by name or as given, with ``arm`` attached when it does not name ARM itself."""
    if isinstance(condition, Condition):
        cond = condition
    elif isinstance(condition, str) and condition.strip():
        cond = resolve_conditions(condition.strip(), arm=arm)[0]
        if arm is not None and arm_base(condition) is not None:
            return _checked(cond)
    else:
        raise LensprobeError(f"condition must be a condition name or an lp.Condition, got {condition!r}.")
    return _checked(with_arm(cond, arm) if arm is not None else cond)


def _checked(cond: Condition) -> Condition:
    if cond.build is not None:
        raise LensprobeError(f"condition {cond.name!r} builds its own prompts (build=...); lm-eval's tasks build "
                             "the prompt, so only a condition's filler and interventions apply.")
    if cond.generate_kwargs:
        raise LensprobeError(f"condition {cond.name!r} sets generation keywords {sorted(cond.generate_kwargs)}, "
                             "which lm-eval requests cannot take.")
    if cond.filler is not None and cond.placement == "after_question":
        raise LensprobeError(f"condition {cond.name!r} places its filler after the question, which would put it "
                             "between lm-eval's context and the scored continuation: use placement='between'.")
    return cond


def filler_text(cond: Condition, tokenizer) -> str | None:
    filler = cond.filler
    if filler is None:
        return None
    if not isinstance(filler, Filler):
        filler = filler(tokenizer)
    return filler.resolve(tokenizer)
