r"""Prompt conditions: a name, how to build the prompt, and what to attach while the model runs.

This is lensprobe's one vocabulary of conditions, used by the filler and head studies, the
evaluations, the figures and the command line. Built in (the meaningless-tokens paper's
conditions; system prompt "Please reason step by step, and put your final answer within
\boxed{}.", filler between the system prompt and the question):

=====================  =================================================================
``"w/o"``              no filler
``"w/ Mless"``         meaningless filler: ``"/"`` x 55, space-separated
``"w/ Mful"``          meaningful filler: ``"he"`` x 55
``"random sentence"``  random common words with as many tokens as the Mless filler
=====================  =================================================================

Older spellings are aliases of these names (:func:`canonical_condition_name`): ``none``,
``without``, ``baseline`` (``w/o``); ``meaningless``, ``mless`` (``w/ Mless``);
``meaningful``, ``mful`` (``w/ Mful``); ``random``, ``random_sentence``. Figure labels and
colours of the conditions live in :mod:`lensprobe.viz.style`.

Anything else is a :class:`Condition` you build: your own filler, system prompt or prompt
builder (a callable ``(model, question) -> Prompt``), plus interventions (e.g.
``lp.ablate_heads("L0H13")``) and latent-thinking settings passed to generation.

Example:
    >>> conds = resolve_conditions("w/o, w/ Mless")
    >>> ablate = Condition("w/o, L0H3 ablated", interventions=(lp.ablate_heads("L0H3"),))
    >>> mine = Condition("short system", system="Answer in \\boxed{}.", filler=Filler.meaningless(count=10))
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lensprobe.core.errors import LensprobeError
from lensprobe.core.jsonable import json_digest, stable_repr
from lensprobe.core.prompts import (
    MATH_SYSTEM_PROMPT,
    PLACEMENTS,
    Filler,
    Placement,
    Prompt,
    build_prompt,
    random_sentence_text,
)

QUESTION_PLACEHOLDER = "{question}"


@dataclass(frozen=True)
class MatchedRandomSentence:
    """Filler factory: a random sentence with as many tokens as ``reference`` for this tokenizer.

    The paper's random-sentence control matches the meaningless filler's length; the token
    count depends on the tokenizer, so the sentence is drawn when the prompt is built.
    """

    reference: Filler = field(default_factory=Filler.meaningless)
    seed: int = 0

    def __call__(self, tokenizer) -> Filler:
        text = self.reference.resolve(tokenizer)
        n = len(tokenizer.encode(text, add_special_tokens=False))
        return Filler.text(random_sentence_text(tokenizer, n, self.seed))


@dataclass(frozen=True)
class Condition:
    """One prompt condition: how the prompt is built, and what is attached while the model runs.

    The evaluations, the filler and head studies, the figures and the command line all name
    their conditions with it.

    Attributes:
        name: label used in result files, tables and figures.
        filler: a :class:`~lensprobe.core.prompts.Filler`, a callable ``tokenizer -> Filler``
            (e.g. :class:`MatchedRandomSentence`), or ``None``.
        system: system prompt (default: the paper's, :data:`~lensprobe.core.prompts.MATH_SYSTEM_PROMPT`).
        placement: where the filler goes (``"between"`` system prompt and question: the paper's).
        chat: apply the model's chat template.
        build: optional prompt builder ``(model, question) -> Prompt`` replacing the
            default one (``filler``/``system``/``placement``/``chat`` are then ignored).
        interventions: interventions attached while the model runs (e.g. head ablations):
            during generation in evaluations, during the forward pass in the filler study.
            An intervention with a ``bind(prompt)`` method is bound to each prompt; if that
            changes it (e.g. positions given as segment names), problems of this condition
            are generated one at a time, since left padding shifts positions.
        generate_kwargs: extra keyword arguments for the generation function, e.g.
            ``{"thinking": lp.LatentFusion(0.6), "think_when": ...}`` for latent thinking.
    """

    name: str
    filler: Filler | Callable[[Any], Filler] | None = None
    system: str | None = MATH_SYSTEM_PROMPT
    placement: Placement = "between"
    chat: bool = True
    build: Callable[[Any, str], Prompt] | None = None
    interventions: tuple = ()
    generate_kwargs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or "\n" in self.name:
            raise LensprobeError(f"a condition needs a non-empty one-line name, got {self.name!r}.")
        if self.placement not in PLACEMENTS:
            raise LensprobeError(f"unknown placement {self.placement!r}: use one of {PLACEMENTS}.")
        if self.filler is not None and not isinstance(self.filler, Filler) and not callable(self.filler):
            raise LensprobeError(
                f"condition {self.name!r}: filler must be a Filler, a callable tokenizer -> Filler, or None."
            )
        if self.build is not None and not callable(self.build):
            raise LensprobeError(f"condition {self.name!r}: build must be a callable (model, question) -> Prompt.")
        if not isinstance(self.interventions, tuple):
            object.__setattr__(self, "interventions", tuple(self.interventions))
        if not isinstance(self.generate_kwargs, dict):
            raise LensprobeError(f"condition {self.name!r}: generate_kwargs must be a dict.")

    def prompt_builder(self, model) -> Callable[[str], Prompt]:
        """A function ``question -> Prompt`` for this model (fillers resolved once)."""
        if self.build is not None:
            def build_custom(question: str) -> Prompt:
                prompt = self.build(model, question)
                if not isinstance(prompt, Prompt):
                    raise LensprobeError(
                        f"condition {self.name!r}: build() returned {type(prompt).__name__}; it must "
                        "return a lensprobe Prompt (use lp.build_prompt)."
                    )
                return prompt

            return build_custom
        tokenizer = getattr(model, "tokenizer", model)
        filler = self.filler
        if filler is not None and not isinstance(filler, Filler):
            filler = filler(tokenizer)
        if filler is not None and filler.kind == "random_sentence":
            filler = Filler.text(filler.resolve(tokenizer))

        def build(question: str) -> Prompt:
            return build_prompt(model, question, system=self.system, filler=filler,
                                placement=self.placement, chat=self.chat)

        return build

    def describe(self, model) -> dict:
        """JSON-able description: the exact prompt template and the attached objects.

        The template is the prompt built with the question ``"{question}"``; interventions
        and generation settings are described by :func:`~lensprobe.core.jsonable.stable_repr`.
        """
        template = self.prompt_builder(model)(QUESTION_PLACEHOLDER).text
        return {
            "name": self.name,
            "prompt_template": template,
            "interventions": [stable_repr(i) for i in self.interventions],
            "generate_kwargs": {k: stable_repr(v) for k, v in sorted(self.generate_kwargs.items())},
        }

    def fingerprint(self, model) -> str:
        """Short hash of :meth:`describe`: same fingerprint, same condition."""
        return json_digest(self.describe(model))


def bind_interventions(interventions: Sequence[Any], prompt) -> tuple[tuple, bool]:
    """Interventions bound to ``prompt`` (through their ``bind(prompt)`` method, when they have
    one), and whether binding changed any of them (e.g. positions given as segment names).

    Example:
        >>> bound, changed = bind_interventions(cond.interventions, prompt)
    """
    bound, changed = [], False
    for item in interventions:
        bind = getattr(item, "bind", None)
        if callable(bind):
            new = bind(prompt)
            changed = changed or new is not item
            bound.append(new)
        else:
            bound.append(item)
    return tuple(bound), changed


def paper_conditions(*, system: str | None = MATH_SYSTEM_PROMPT, count: int = 55, symbol: str = "/",
                     word: str = "he", seed: int = 0, placement: Placement = "between",
                     chat: bool = True) -> dict[str, Condition]:
    """The paper's four conditions by name, with their filler settings adjustable.

    Args:
        system: system prompt (``None`` for none).
        count: filler length in repetitions (55 in the paper).
        symbol: the meaningless symbol (``"/"``).
        word: the meaningful word (``"he"``).
        seed: seed of the random sentence, which has as many tokens as the Mless filler.
        placement: where the filler goes (``"between"`` system prompt and question).
        chat: apply the model's chat template.

    Example:
        >>> short = paper_conditions(count=5)["w/ Mless"]
    """
    mless = Filler.meaningless(symbol=symbol, count=count)
    fillers: dict[str, Any] = {
        "w/o": None,
        "w/ Mless": mless,
        "w/ Mful": Filler.meaningful(word=word, count=count),
        "random sentence": MatchedRandomSentence(reference=mless, seed=seed),
    }
    return {name: Condition(name, filler=filler, system=system, placement=placement, chat=chat)
            for name, filler in fillers.items()}


BUILTIN_CONDITIONS: dict[str, Condition] = paper_conditions()
"""The paper's conditions by name."""

_ALIASES = {
    "w/o": "w/o", "wo": "w/o", "none": "w/o", "without": "w/o", "baseline": "w/o",
    "w/ mless": "w/ Mless", "w/mless": "w/ Mless", "mless": "w/ Mless", "meaningless": "w/ Mless",
    "w/ mful": "w/ Mful", "w/mful": "w/ Mful", "mful": "w/ Mful", "meaningful": "w/ Mful",
    "random sentence": "random sentence", "random": "random sentence",
    "random_sentence": "random sentence",
}


def canonical_condition_name(name: str) -> str:
    """The built-in name a spelling stands for (``"meaningless"`` -> ``"w/ Mless"``, case-insensitive);
    any other name comes back as given (surrounding spaces removed): a user-defined condition.

    Example:
        >>> canonical_condition_name("none"), canonical_condition_name("my condition")
        ('w/o', 'my condition')
    """
    text = str(name).strip()
    return _ALIASES.get(text.lower(), text)


def builtin_condition(name: str, **overrides) -> Condition:
    """A built-in condition by name (aliases: ``none``, ``mless``, ``mful``, ``random``, ...),
    optionally with fields replaced, e.g. ``builtin_condition("w/ Mless", system="...")``."""
    key = canonical_condition_name(name) if isinstance(name, str) else None
    if key not in BUILTIN_CONDITIONS:
        raise LensprobeError(
            f"unknown condition {name!r}: built-in conditions are {list(BUILTIN_CONDITIONS)} "
            "(aliases: none, meaningless, meaningful, random); for anything else build a "
            "lensprobe Condition(name, filler=..., interventions=...)."
        )
    cond = BUILTIN_CONDITIONS[key]
    return replace(cond, **overrides) if overrides else cond


def resolve_conditions(spec: Any, *, builtins: dict[str, Condition] | None = None) -> list[Condition]:
    """Turn names, conditions and prompt-builder callables into a list of :class:`Condition`.

    Args:
        spec: a comma-separated string (``"w/o,w/ Mless,w/ Mful"``; aliases such as
            ``"none,meaningless"`` work too), a :class:`Condition`, a callable
            ``(model, question) -> Prompt`` (named after the function), or a list of these.
        builtins: the conditions names refer to (default :data:`BUILTIN_CONDITIONS`; e.g.
            :func:`paper_conditions` with a shorter filler).

    Raises:
        LensprobeError: an unknown name, an empty list, or two conditions with one name.
    """
    if isinstance(spec, (str, Condition)) or callable(spec):
        items: Sequence[Any] = [spec]
    elif isinstance(spec, Sequence):
        items = spec
    else:
        raise LensprobeError(f"conditions must be names, Conditions or callables, got {spec!r}.")
    out: list[Condition] = []
    for item in items:
        if isinstance(item, Condition):
            out.append(item)
        elif isinstance(item, str):
            out.extend(_named(n, builtins) for n in item.split(",") if n.strip())
        elif callable(item):
            out.append(Condition(getattr(item, "__name__", "custom"), build=item))
        else:
            raise LensprobeError(
                f"cannot use {item!r} as a condition: pass a name, a Condition, or a callable "
                "(model, question) -> Prompt."
            )
    if not out:
        raise LensprobeError("no conditions given: pass e.g. 'w/o,w/ Mless,w/ Mful'.")
    names = [c.name for c in out]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise LensprobeError(f"condition names must be unique; repeated: {dups}.")
    return out


def _named(name: str, builtins: dict[str, Condition] | None) -> Condition:
    """The built-in condition ``name`` stands for, taken from ``builtins`` when given."""
    cond = builtin_condition(name)  # an unknown name fails here
    return cond if builtins is None else builtins.get(cond.name, cond)
