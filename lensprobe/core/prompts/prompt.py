"""Prompts that know their named segments, and the filler builders of the meaningless-tokens paper.

A :class:`Prompt` is built from named pieces of text (chat-template scaffolding, system
prompt, filler, question) in one of three templates: ``"chat"`` (the tokenizer's chat
template, the default), ``"plain"`` (plain text with blank-line separators) and ``"raw"``
(the meaningless-tokens authors' form: the pieces concatenated and tokenized as one string).

In the ``"chat"`` and ``"plain"`` templates each piece is tokenized on its own and the token
ids are concatenated, so every segment is an exact token span whose decoded text is the piece's
text: **no token ever straddles a segment boundary**. Where the tokenizer would have
merged characters across a boundary when encoding the whole string at once (for example a
space-prefixed word right after the filler), lensprobe keeps the split; the prompt's
tokens are then a valid but not necessarily canonical tokenization of ``Prompt.text``.
Separators (newlines) between pieces are segments of their own (``filler_sep``), so
boundaries between content pieces fall on whitespace, where byte-level BPE tokenizers
split anyway.

The ``"raw"`` template is the opposite choice: the whole string is tokenized in one call,
exactly as the model's tokenizer does it when loaded on its own (``prompt.tokens`` equals
``AutoTokenizer.from_pretrained(name)(prompt.text).input_ids``, the authors' one call: a BOS token only
where the tokenizer adds one itself, not the one TransformerLens's tokenizer adds; see
:mod:`lensprobe.core.prompts.owntokenizer`), and segments are read off the tokens' character offsets. A token whose characters cross a
boundary (e.g. SmolLM2 merges the system prompt's final ``"."`` with the filler's first
``"/"`` into ``"./"``) belongs to the segment where it starts and is listed in
``Prompt.straddling``.
"""

from dataclasses import dataclass, field
from typing import Any, Literal

from jaxtyping import Int
from torch import Tensor

from lensprobe.core.errors import ContextLengthError, LensprobeError
from lensprobe.core.prompts.assembly import (
    PLACEMENTS,
    Placement,
    chat_pieces,
    content_pieces,
    model_context,
    plain_pieces,
    raw_pieces,
    tokenize_pieces,
    tokenize_raw,
)
from lensprobe.core.prompts.fillers import Filler as Filler  # lensprobe.core.prompts.prompt.Filler, as before
from lensprobe.core.prompts.owntokenizer import own_special_tokens
from lensprobe.core.prompts.special import SpecialTokens, check_special_tokens
from lensprobe.core.prompts.text import check_text
from lensprobe.core.storage.jsonable import json_digest

MATH_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
"""lensprobe's system prompt for MATH-style questions in the chat template.

It is a cleaned-up version of the meaningless-tokens authors' instruction (comma after
"step", single braces), not their literal string: that is :data:`PAPER_SYSTEM_PROMPT`.
"""

PAPER_SYSTEM_PROMPT = "Please reason step by step and put your final answer within \\boxed{{}}."
r"""The meaningless-tokens authors' MATH-500 instruction, character for character.

Their code writes ``"...within \\boxed{{}}."`` as a plain (not formatted) Python string, so
the model sees ``\boxed{{}}.`` with doubled braces; there is no comma after "step". They
feed it without a chat template, followed directly by the filler and the problem (use
``build_prompt(..., template="raw")``).

Example:
    >>> PAPER_SYSTEM_PROMPT.endswith("\\boxed{{}}.")
    True
"""

Template = Literal["chat", "plain", "raw"]
TEMPLATES = ("chat", "plain", "raw")




@dataclass(frozen=True)
class Prompt:
    """Token ids of a prompt plus named token spans.

    Attributes:
        tokens: ``[1, pos]`` token ids.
        str_tokens: one decoded string per token.
        segments: name -> ``(start, end)`` half-open token span, in prompt order.
        text: the prompt as one string (the concatenated pieces).
        pieces: segment name -> its text.
        straddling: positions of tokens whose characters cross a segment boundary (only
            in the ``"raw"`` template; such a token belongs to the segment where its first
            character is). Empty when every segment is an exact token span.
    """

    tokens: Int[Tensor, "1 pos"]
    str_tokens: list[str]
    segments: dict[str, tuple[int, int]]
    text: str
    pieces: dict[str, str] = field(default_factory=dict)
    straddling: tuple[int, ...] = ()

    def __len__(self) -> int:
        return self.tokens.shape[-1]

    def __lensprobe_identity__(self) -> dict[str, Any]:
        """What identifies the prompt in a resumable run: a digest of its text, token ids and segments."""
        return {"digest": json_digest(prompt_json(self)), "tokens": int(self.tokens.shape[-1])}

    def positions(self, name: str) -> list[int]:
        """Token positions of segment ``name`` (e.g. ``"filler"``, ``"question"``)."""
        if name not in self.segments:
            raise LensprobeError(
                f"unknown segment {name!r}: this prompt has segments {list(self.segments)}."
            )
        start, end = self.segments[name]
        return list(range(start, end))

    def positions_except(self, *names: str) -> list[int]:
        """All positions outside the named segments and their separators, in order.

        A segment's separator (``filler_sep`` for ``filler``, ``system_sep`` for ``system``)
        goes with it, so ``positions_except("filler")`` of a prompt with filler lines up
        position by position with the same prompt built without filler (in the ``"raw"``
        template only when neither prompt has ``straddling`` tokens).

        Example:
            >>> with_f = build_prompt(model, "What is 12+7?", filler=Filler.meaningless())
            >>> without = build_prompt(model, "What is 12+7?")
            >>> keep = with_f.positions_except("filler")
            >>> bool((with_f.tokens[0, keep] == without.tokens[0]).all())
            True
        """
        if not names:
            raise LensprobeError("positions_except needs at least one segment name, e.g. 'filler'.")
        drop: set[int] = set()
        for name in names:
            drop.update(self.positions(name))
            if f"{name}_sep" in self.segments:
                drop.update(self.positions(f"{name}_sep"))
        return [i for i in range(len(self)) if i not in drop]

    def segment_of(self, pos: int) -> str:
        """Name of the segment holding token position ``pos``."""
        for name, (start, end) in self.segments.items():
            if start <= pos < end:
                return name
        raise LensprobeError(f"position {pos} is outside the prompt (length {len(self)}).")


def build_prompt(model, question: str, *, system: str | None = None, filler: Filler | None = None,
                 placement: Placement = "between", chat: bool = True, template: Template | None = None,
                 joiner: str = "", add_special_tokens: bool | None = None,
                 special_tokens: SpecialTokens = "refuse") -> Prompt:
    """Build a prompt with named segments, optionally with filler tokens inserted.

    Args:
        model: a TransformerLens model (its ``tokenizer`` is used), its
            :class:`~lensprobe.core.models.facts.ModelFacts` (read once by a run), or a tokenizer.
        question: the user's question (non-empty).
        system: system prompt, e.g. :data:`MATH_SYSTEM_PROMPT` (chat) or
            :data:`PAPER_SYSTEM_PROMPT` (raw). With the chat template and no system prompt
            the template's default (if any) stays in the scaffolding.
        filler: a :class:`Filler`, or ``None`` for the paper's "w/o" condition.
        placement: ``"between"`` the system prompt and the question (the paper's default:
            the filler opens the user message), ``"before_system"`` (opens the system
            message; with no ``system``, the user message, after any default system prompt
            of the template), or ``"after_question"`` (closes the user message).
        chat: used when ``template`` is not given: ``True`` is ``template="chat"``,
            ``False`` is ``template="plain"``.
        template: ``"chat"`` applies the tokenizer's chat template; ``"plain"`` builds plain
            text (``system``, blank line, filler, newline, question) with the model's BOS
            token first; ``"raw"`` is the meaningless-tokens authors' form: system prompt,
            filler and question joined by ``joiner`` (nothing by default) and tokenized as
            one string, exactly as one call of the model's own tokenizer does
            (``AutoTokenizer.from_pretrained(name)(text)``: Llama-3.1 and Gemma-3 prepend their BOS,
            SmolLM2 and Qwen2.5 nothing).
        joiner: text between consecutive pieces in the ``"raw"`` template (segments
            ``system_sep`` / ``filler_sep`` when not empty).
        add_special_tokens: ``"raw"`` only: ``None`` (default) adds the special tokens the
            model's tokenizer adds by itself, loaded on its own
            (:func:`~lensprobe.core.prompts.owntokenizer.own_special_tokens`); ``True`` those the given
            tokenizer object adds (a TransformerLens tokenizer, loaded with ``add_bos_token=True``,
            prepends its BOS: SmolLM2's ``<|im_start|>``); ``False`` none
            (``tokenizer(text, add_special_tokens=False)``).
        special_tokens: what a special token's text in the question, system prompt or filler (such as
            ``<|im_end|>``) does: ``"refuse"`` (an error naming it and the field), ``"escape"`` (read as
            plain characters) or ``"allow"`` (it becomes the control token). The rule holds on the final token
            ids: a control token id the template did not place itself is refused (under ``"escape"``, checked
            absent) also when its text is split across pieces that ``"raw"`` joins (``<|im_`` ending the
            system prompt, ``end|>`` opening the question, a joiner). See :mod:`lensprobe.core.prompts.special`.

    In ``"chat"`` and ``"plain"`` each piece is tokenized on its own, so every segment decodes
    to exactly its text; where the tokenizer would merge characters across a boundary, the
    split is kept. In ``"raw"`` the tokenizer's own split is kept and a token crossing a
    boundary belongs to the segment where it starts; its position is in
    ``Prompt.straddling`` (see the module docs).

    Returns:
        A :class:`Prompt`. Segments: ``system``, ``filler``, ``filler_sep`` (the separator
        after or before the filler), ``question``, and scaffolding: ``bos`` (plain text, or
        a special token the tokenizer adds in raw form), or the template's
        ``system_prefix``, ``user_prefix`` and ``assistant_prefix``.

    Raises:
        LensprobeError: an empty question, an unknown template or placement, a joiner
            outside the raw template, a slow tokenizer in raw form, a special token's text in user
            text or a control token id it makes in the final ids (unless ``special_tokens`` says otherwise), or
            a prompt longer than the model's context (a :class:`~lensprobe.core.errors.ContextLengthError`,
            checked after the control tokens).

    Example:
        >>> p = build_prompt(model, "What is 12+7?", system=MATH_SYSTEM_PROMPT,
        ...                  filler=Filler.meaningless())
        >>> len(p.positions("filler"))
        55
        >>> raw = build_prompt(model, "What is 12+7?", system=PAPER_SYSTEM_PROMPT,
        ...                    filler=Filler.meaningless(), template="raw")
        >>> raw.tokens[0].tolist() == AutoTokenizer.from_pretrained(model.tokenizer.name_or_path)(raw.text).input_ids
        True
    """
    tokenizer = getattr(model, "tokenizer", model)
    check_text(question, "question")
    if system is not None:
        check_text(system, "system prompt", empty=True)
    if template is None:
        template = "chat" if chat else "plain"
    if template not in TEMPLATES:
        raise LensprobeError(f"unknown template {template!r}: use one of {TEMPLATES}.")
    if not isinstance(joiner, str):
        raise LensprobeError(f"joiner must be a string, got {type(joiner).__name__}.")
    if add_special_tokens not in (None, True, False):
        raise LensprobeError(f"add_special_tokens must be None, True or False, got {add_special_tokens!r}.")
    if add_special_tokens is False and template != "raw":
        raise LensprobeError(
            "add_special_tokens=False applies to template='raw' only; the chat and plain templates "
            "place their special tokens themselves."
        )
    if joiner and template != "raw":
        raise LensprobeError(
            f"joiner={joiner!r} applies to template='raw' only; the {template!r} template has its "
            "own separators."
        )
    if placement not in PLACEMENTS:
        raise LensprobeError(f"unknown placement {placement!r}: use one of {PLACEMENTS}.")
    if filler is not None and not isinstance(filler, Filler):
        raise LensprobeError(
            f"filler must be a lensprobe Filler (e.g. Filler.meaningless()), got {type(filler).__name__}."
        )
    check_special_tokens(tokenizer, {"system": system, "question": question}, special_tokens)  # before any length
    n_ctx = model_context(model)
    if filler is not None and filler.kind == "random_sentence" and n_ctx is not None and filler.n_tokens > n_ctx:
        raise ContextLengthError(f"a random sentence of {filler.n_tokens} tokens is longer than the model's context "
                                 f"of {n_ctx}: use a smaller filler count.")  # before drawing it
    fill = filler.resolve(tokenizer) if filler is not None else None
    check_special_tokens(tokenizer, {"filler": fill}, special_tokens)
    if template == "raw":
        add = own_special_tokens(tokenizer) if add_special_tokens is None else add_special_tokens
        return Prompt(**tokenize_raw(tokenizer, raw_pieces(system, fill, question, placement, joiner), model,
                             add, special_tokens))
    sys_pieces, user_pieces = content_pieces(system, fill, question, placement)
    if template == "chat":
        pieces = chat_pieces(tokenizer, sys_pieces, user_pieces)
    else:
        pieces = plain_pieces(model, tokenizer, sys_pieces, user_pieces)
    return Prompt(**tokenize_pieces(tokenizer, [(n, t) for n, t in pieces if t], model, special_tokens))


def prompt_json(prompt: Prompt) -> dict[str, Any]:
    """A prompt's text, token ids, token strings and segments as plain JSON types."""
    return {
        "text": prompt.text,
        "token_ids": prompt.tokens[0].tolist(),
        "str_tokens": list(prompt.str_tokens),
        "segments": {k: list(v) for k, v in prompt.segments.items()},
        **({"straddling": list(prompt.straddling)} if prompt.straddling else {}),
    }
