r"""Prompt conditions: a name, how to build the prompt, and what to attach while the model runs.

This is lensprobe's one vocabulary of conditions, used by the filler and head studies, the
evaluations, the figures and the command line. Built in (the meaningless-tokens paper's
conditions, filler between the system prompt and the question). Two prompt formats
(:func:`paper_conditions`): ``"chat"`` (the default) puts lensprobe's system prompt
:data:`~lensprobe.core.prompts.prompt.MATH_SYSTEM_PROMPT` and the question into the model's chat
template; ``"paper"`` builds the authors' own string, no chat template:
:data:`~lensprobe.core.prompts.prompt.PAPER_SYSTEM_PROMPT` + filler + problem with nothing between
them, tokenized as one string (``template="raw"``).

=====================  =================================================================
``"w/o"``              no filler
``"w/ Mless"``         meaningless filler: ``"/"`` x 55, space-separated
``"w/ Mful"``          meaningful filler: ``"he"`` x 55
``"random sentence"``  random common words with as many tokens as the Mless filler
=====================  =================================================================

**ARM.** ``"ARM"`` is ``"w/o"`` with the paper's activation redistribution module attached;
any built-in name followed by ``+ARM`` (``"w/ Mless+ARM"``) is that condition with ARM
attached. Names resolve to these only when :func:`resolve_conditions` is given the ARM to
attach (``arm=``; :func:`lensprobe.evaluate` uses the authors' preset for the model, or its
own ``arm=`` argument). :func:`with_arm` builds the same condition from any condition.

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
    >>> paper = paper_conditions(prompt_format="paper")["w/ Mless"]  # the authors' raw string
    >>> arm = with_arm(builtin_condition("w/ Mless"), lp.ARM(c=0.1, percentile=95))  # "w/ Mless+ARM"
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from lensprobe.core.errors import LensprobeError
from lensprobe.core.models.facts import ModelFacts
from lensprobe.core.prompts.prompt import (
    MATH_SYSTEM_PROMPT,
    PAPER_SYSTEM_PROMPT,
    PLACEMENTS,
    TEMPLATES,
    Filler,
    Placement,
    Prompt,
    Template,
    build_prompt,
)
from lensprobe.core.prompts.randomtext import random_sentence_text
from lensprobe.core.prompts.special import SPECIAL_TOKENS, SpecialTokens
from lensprobe.core.storage.identity import identity, identity_digest

QUESTION_PLACEHOLDER = "{question}"
PromptFormat = Literal["chat", "paper"]
PROMPT_FORMATS = ("chat", "paper")
ARM_SUFFIX = "+ARM"
_DEFAULT = object()  # "not given" for arguments whose default depends on another one


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
        filler: a :class:`~lensprobe.core.prompts.prompt.Filler`, a callable ``tokenizer -> Filler``
            (e.g. :class:`MatchedRandomSentence`), or ``None``.
        system: system prompt (default: lensprobe's chat-form
            :data:`~lensprobe.core.prompts.prompt.MATH_SYSTEM_PROMPT`; the authors' literal string
            is :data:`~lensprobe.core.prompts.prompt.PAPER_SYSTEM_PROMPT`).
        placement: where the filler goes (``"between"`` system prompt and question: the paper's).
        chat: apply the model's chat template (used when ``template`` is ``None``).
        template: ``"chat"``, ``"plain"`` or ``"raw"`` (see :func:`~lensprobe.build_prompt`);
            ``None`` follows ``chat``.
        joiner: text between the pieces of a ``"raw"`` prompt (nothing by default).
        build: optional prompt builder ``(model, question) -> Prompt`` replacing the
            default one (``filler``/``system``/``placement``/``chat``/``template`` are then
            ignored).
        interventions: interventions attached while the model runs (e.g. head ablations):
            during generation in evaluations, during the forward pass in the filler study.
            An intervention with a ``bind(prompt)`` method is bound to each prompt; if that
            changes it (e.g. positions given as segment names), problems of this condition
            are generated one at a time, since left padding shifts positions.
        generate_kwargs: extra keyword arguments for the generation function, e.g.
            ``{"thinking": lp.generation.LatentFusion(0.6), "think_when": ...}`` for latent thinking.
        special_tokens: what a special token's text (``<|im_end|>``) in a question, the system prompt or
            the filler does: ``"refuse"`` (an error naming it), ``"escape"`` (plain text) or ``"allow"``
            (the control token); see :func:`~lensprobe.build_prompt`.
    """

    name: str
    filler: Filler | Callable[[Any], Filler] | None = None
    system: str | None = MATH_SYSTEM_PROMPT
    placement: Placement = "between"
    chat: bool = True
    build: Callable[[Any, str], Prompt] | None = None
    interventions: tuple = ()
    generate_kwargs: dict = field(default_factory=dict)
    template: Template | None = None
    joiner: str = ""
    special_tokens: SpecialTokens = "refuse"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or "\n" in self.name:
            raise LensprobeError(f"a condition needs a non-empty one-line name, got {self.name!r}.")
        if self.placement not in PLACEMENTS:
            raise LensprobeError(f"unknown placement {self.placement!r}: use one of {PLACEMENTS}.")
        if self.filler is not None and not isinstance(self.filler, Filler) and not callable(self.filler):
            raise LensprobeError(
                f"condition {self.name!r}: filler must be a Filler, a callable tokenizer -> Filler, or None."
            )
        if self.template is not None and self.template not in TEMPLATES:
            raise LensprobeError(
                f"condition {self.name!r}: unknown template {self.template!r}: use one of {TEMPLATES} or None."
            )
        if self.joiner and self.template != "raw":
            raise LensprobeError(f"condition {self.name!r}: joiner applies to template='raw' only.")
        if self.special_tokens not in SPECIAL_TOKENS:
            raise LensprobeError(f"condition {self.name!r}: special_tokens must be one of {SPECIAL_TOKENS}.")
        if self.build is not None and not callable(self.build):
            raise LensprobeError(f"condition {self.name!r}: build must be a callable (model, question) -> Prompt.")
        if not isinstance(self.interventions, tuple):
            object.__setattr__(self, "interventions", tuple(self.interventions))
        if not isinstance(self.generate_kwargs, dict):
            raise LensprobeError(f"condition {self.name!r}: generate_kwargs must be a dict.")

    def prompt_builder(self, model, facts: ModelFacts | None = None) -> Callable[[str], Prompt]:
        """A function ``question -> Prompt`` for this model (fillers resolved once). ``facts``: the model's
        facts read once by a run (:func:`~lensprobe.core.models.facts.model_facts`): the built-in builder takes
        the tokenizer and context from them instead of the model; a ``build`` of the condition's own gets the
        model."""
        if self.build is not None:
            custom = self.build

            def build_custom(question: str) -> Prompt:
                prompt = custom(model, question)
                if not isinstance(prompt, Prompt):
                    raise LensprobeError(
                        f"condition {self.name!r}: build() returned {type(prompt).__name__}; it must "
                        "return a lensprobe Prompt (use lp.build_prompt)."
                    )
                return prompt

            return build_custom
        source = facts if facts is not None else model
        tokenizer = getattr(source, "tokenizer", source)
        filler = self.filler
        if filler is not None and not isinstance(filler, Filler):
            filler = filler(tokenizer)
        if filler is not None and filler.kind == "random_sentence":
            filler = Filler.text(filler.resolve(tokenizer))

        def build(question: str) -> Prompt:
            return build_prompt(source, question, system=self.system, filler=filler,
                                placement=self.placement, chat=self.chat, template=self.template,
                                joiner=self.joiner, special_tokens=self.special_tokens)

        return build

    def describe(self, model) -> dict:
        """JSON-able identity: the exact prompt template and the attached objects by content.

        The template is the prompt built with the question ``"{question}"``, by its text and a
        digest of its token ids (the same text tokenized otherwise, e.g. without the special
        tokens a tokenizer adds, is another condition); interventions
        and generation settings are described by :func:`~lensprobe.core.storage.identity.identity`
        (so two interventions whose tensors differ in one element are two conditions).

        Raises:
            LensprobeError: an intervention or generation setting that cannot be identified.

        Example:
            >>> Condition("w/o").describe(model)["interventions"]
            []
        """
        template = self.prompt_builder(model)(QUESTION_PLACEHOLDER)
        return {
            "name": self.name,
            "prompt_template": template.text,
            "template_tokens": {"count": len(template), "ids": identity_digest(template.tokens.reshape(-1).tolist())},
            "interventions": identity(list(self.interventions), f"condition {self.name!r} interventions"),
            "generate_kwargs": identity(dict(sorted(self.generate_kwargs.items())), f"condition {self.name!r}"),
            **({} if self.special_tokens == "refuse" else {"special_tokens": self.special_tokens}),
        }

    def fingerprint(self, model) -> str:
        """Short hash of :meth:`describe`: same fingerprint, same condition."""
        return identity_digest(self.describe(model))


def paper_conditions(*, prompt_format: PromptFormat = "chat", system: Any = _DEFAULT, count: int = 55,
                     symbol: str = "/", word: str = "he", seed: int = 0, placement: Placement = "between",
                     chat: bool = True) -> dict[str, Condition]:
    """The paper's four conditions by name, with their filler settings adjustable.

    Args:
        prompt_format: ``"chat"``: the model's chat template with
            :data:`~lensprobe.core.prompts.prompt.MATH_SYSTEM_PROMPT`; ``"paper"``: the authors'
            string, no chat template: :data:`~lensprobe.core.prompts.prompt.PAPER_SYSTEM_PROMPT`,
            filler and problem concatenated with nothing between them and tokenized as one
            string (``template="raw"``).
        system: system prompt (``None`` for none; default: the format's, see above).
        count: filler length in repetitions (55 in the paper).
        symbol: the meaningless symbol (``"/"``).
        word: the meaningful word (``"he"``).
        seed: seed of the random sentence, which has as many tokens as the Mless filler.
        placement: where the filler goes (``"between"`` system prompt and question).
        chat: apply the model's chat template (``prompt_format="chat"`` only; ``False``
            gives plain text).

    Raises:
        LensprobeError: an unknown prompt format.

    Example:
        >>> short = paper_conditions(count=5)["w/ Mless"]
        >>> exact = paper_conditions(prompt_format="paper")["w/ Mless"]
        >>> exact.template, exact.system == PAPER_SYSTEM_PROMPT
        ('raw', True)
    """
    if prompt_format not in PROMPT_FORMATS:
        raise LensprobeError(f"unknown prompt format {prompt_format!r}: use one of {PROMPT_FORMATS}.")
    paper = prompt_format == "paper"
    if system is _DEFAULT:
        system = PAPER_SYSTEM_PROMPT if paper else MATH_SYSTEM_PROMPT
    mless = Filler.meaningless(symbol=symbol, count=count)
    fillers: dict[str, Any] = {
        "w/o": None,
        "w/ Mless": mless,
        "w/ Mful": Filler.meaningful(word=word, count=count),
        "random sentence": MatchedRandomSentence(reference=mless, seed=seed),
    }
    return {name: Condition(name, filler=filler, system=system, placement=placement, chat=chat,
                            template="raw" if paper else None)
            for name, filler in fillers.items()}


def with_arm(condition: Condition, arm: Any, name: str | None = None) -> Condition:
    """``condition`` with ``arm`` (an ARM intervention) attached: named ``"<name>+ARM"``, or
    ``"ARM"`` for ``"w/o"``.

    Args:
        condition: the condition to extend.
        arm: the intervention, e.g. ``lp.ARM(c=0.1, percentile=95)`` or ``lp.ARM.preset(name)``.
        name: the new condition's name (default as above).

    Example:
        >>> with_arm(builtin_condition("w/ Mless"), lp.ARM(c=0.1, percentile=95)).name
        'w/ Mless+ARM'
    """
    if not isinstance(condition, Condition):
        raise LensprobeError(f"with_arm needs a lensprobe Condition, got {type(condition).__name__}.")
    if name is None:
        name = "ARM" if condition.name == "w/o" else f"{condition.name}{ARM_SUFFIX}"
    return replace(condition, name=name, interventions=condition.interventions + (arm,))


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

    A ``+ARM`` suffix is kept on the canonical base name (``"mless+arm"`` -> ``"w/ Mless+ARM"``);
    ``"w/o+ARM"`` is ``"ARM"``.

    Example:
        >>> canonical_condition_name("none"), canonical_condition_name("my condition")
        ('w/o', 'my condition')
    """
    text = str(name).strip()
    base = arm_base(text)
    if base is not None:
        base = _ALIASES.get(base.lower(), base)
        return "ARM" if base == "w/o" else f"{base}{ARM_SUFFIX}"
    return _ALIASES.get(text.lower(), text)


def arm_base(name: str) -> str | None:
    """The base condition of an ARM condition name (``"ARM"`` -> ``"w/o"``, ``"w/ Mless+ARM"`` ->
    ``"w/ Mless"``), or ``None`` when ``name`` asks for no ARM.

    Example:
        >>> arm_base("w/ Mless+ARM"), arm_base("w/ Mless")
        ('w/ Mless', None)
    """
    text = str(name).strip()
    if text.lower() == "arm":
        return "w/o"
    if text.lower().endswith(ARM_SUFFIX.lower()) and text[: -len(ARM_SUFFIX)].strip():
        return text[: -len(ARM_SUFFIX)].strip()
    return None


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


def resolve_conditions(spec: Any, *, builtins: dict[str, Condition] | None = None, arm: Any = None
                       ) -> list[Condition]:
    """Turn names, conditions and prompt-builder callables into a list of :class:`Condition`.

    Args:
        spec: a comma-separated string (``"w/o,w/ Mless,w/ Mful"``; aliases such as
            ``"none,meaningless"`` work too), a :class:`Condition`, a callable
            ``(model, question) -> Prompt`` (named after the function), or a list of these.
        builtins: the conditions names refer to (default :data:`BUILTIN_CONDITIONS`; e.g.
            :func:`paper_conditions` with a shorter filler).
        arm: what ``"ARM"`` and ``"<name>+ARM"`` attach: an intervention (``lp.ARM(...)``) or
            a function of no arguments returning one (called at most once, only when such a
            name is given). Without it those names are refused.

    Raises:
        LensprobeError: an unknown name, an empty list, or two conditions with one name.
    """
    if isinstance(spec, (str, Condition)) or callable(spec):
        items: Sequence[Any] = [spec]
    elif isinstance(spec, Sequence):
        items = spec
    else:
        raise LensprobeError(f"conditions must be names, Conditions or callables, got {spec!r}.")
    if arm is not None and not hasattr(arm, "hooks") and callable(arm):
        make = arm
        made: list[Any] = []

        def arm() -> Any:  # the factory runs at most once
            if not made:
                made.append(make())
            return made[0]
    out: list[Condition] = []
    for item in items:
        if isinstance(item, Condition):
            out.append(item)
        elif isinstance(item, str):
            out.extend(_named(n, builtins, arm) for n in item.split(",") if n.strip())
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


def _named(name: str, builtins: dict[str, Condition] | None, arm: Any = None) -> Condition:
    """The built-in condition ``name`` stands for, taken from ``builtins`` when given (with ARM
    attached for ``"ARM"`` and ``"<name>+ARM"``)."""
    base = arm_base(name)
    if base is not None:
        cond = _named(base, builtins)
        if arm is None:
            raise LensprobeError(
                f"condition {name.strip()!r} needs ARM settings: pass arm=lp.ARM(c=..., percentile=...) "
                "(lp.evaluate uses the authors' preset for the model when there is one), or build it "
                f"with lp.prompts.with_arm(lp.builtin_condition({base!r}), lp.ARM(c=..., percentile=...))."
            )
        if not hasattr(arm, "hooks") and callable(arm):
            arm = arm()
        return with_arm(cond, arm)
    cond = builtin_condition(name)  # an unknown name fails here
    return cond if builtins is None else builtins.get(cond.name, cond)
