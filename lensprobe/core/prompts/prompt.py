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
exactly as the tokenizer does it (``prompt.tokens`` equals ``tokenizer(prompt.text).input_ids``),
and segments are read off the tokens' character offsets. A token whose characters cross a
boundary (e.g. SmolLM2 merges the system prompt's final ``"."`` with the filler's first
``"/"`` into ``"./"``) belongs to the segment where it starts and is listed in
``Prompt.straddling``.
"""

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from jaxtyping import Int
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.models.facts import ModelFacts
from lensprobe.core.prompts.fillers import Filler as Filler  # lensprobe.core.prompts.prompt.Filler, as before
from lensprobe.core.prompts.special import SpecialTokens, check_special_tokens, encode_options
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

Placement = Literal["between", "before_system", "after_question"]
PLACEMENTS = ("between", "before_system", "after_question")
FILLER_SEP = "\n"
Pieces = list[tuple[str, str]]
"""Named pieces of prompt text, in order: ``[(segment name, text), ...]``."""



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


_SENTINELS = ("\x00LP_SYSTEM\x00", "\x00LP_USER\x00")


def _chat_scaffold(tokenizer, has_system: bool) -> list[str]:
    """Split the rendered chat template around the system and user contents.

    Returns the scaffolding strings ``[before system, between, after user]`` (with no
    system message: ``[before user, after user]``).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise LensprobeError(
            "chat=True but this tokenizer has no chat template: pass chat=False to build a "
            "plain-text prompt, or set tokenizer.chat_template."
        )
    messages = [{"role": "user", "content": _SENTINELS[1]}]
    if has_system:
        messages.insert(0, {"role": "system", "content": _SENTINELS[0]})
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    parts = [rendered]
    for s in _SENTINELS if has_system else _SENTINELS[1:]:
        head, sep, tail = parts[-1].partition(s)
        if not sep:
            raise LensprobeError(
                "the chat template dropped the message content; pass chat=False and format "
                "the prompt yourself."
            )
        parts[-1:] = [head, tail]
    return parts


def build_prompt(model, question: str, *, system: str | None = None, filler: Filler | None = None,
                 placement: Placement = "between", chat: bool = True, template: Template | None = None,
                 joiner: str = "", add_special_tokens: bool = True, special_tokens: SpecialTokens = "refuse") -> Prompt:
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
            one string, exactly as ``tokenizer(text)`` does (including any special token the
            tokenizer itself adds: TransformerLens loads tokenizers that have a BOS token with
            ``add_bos_token=True``, so SmolLM2's raw prompts start with ``<|im_start|>``).
        joiner: text between consecutive pieces in the ``"raw"`` template (segments
            ``system_sep`` / ``filler_sep`` when not empty).
        add_special_tokens: ``"raw"`` only: ``False`` tokenizes as
            ``tokenizer(text, add_special_tokens=False)``, without the BOS token a
            TransformerLens tokenizer adds (what a plain ``transformers`` tokenizer feeds for
            models that add none, such as SmolLM2 and Qwen2.5).
        special_tokens: what a special token's text in the question, system prompt or filler (such as
            ``<|im_end|>``) does: ``"refuse"`` (an error naming it and the field), ``"escape"`` (read as
            plain characters) or ``"allow"`` (it becomes the control token). See :mod:`lensprobe.core.prompts.special`.

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
            text (unless ``special_tokens`` says otherwise), or a prompt longer than the model's context.

    Example:
        >>> p = build_prompt(model, "What is 12+7?", system=MATH_SYSTEM_PROMPT,
        ...                  filler=Filler.meaningless())
        >>> len(p.positions("filler"))
        55
        >>> raw = build_prompt(model, "What is 12+7?", system=PAPER_SYSTEM_PROMPT,
        ...                    filler=Filler.meaningless(), template="raw")
        >>> raw.tokens[0].tolist() == model.tokenizer(raw.text).input_ids
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
    if not add_special_tokens and template != "raw":
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
    n_ctx = _context(model)
    if filler is not None and filler.kind == "random_sentence" and n_ctx is not None and filler.n_tokens > n_ctx:
        raise LensprobeError(f"a random sentence of {filler.n_tokens} tokens is longer than the model's context of "
                             f"{n_ctx}: use a smaller filler count.")  # before drawing it
    fill = filler.resolve(tokenizer) if filler is not None else None
    check_special_tokens(tokenizer, {"system": system, "filler": fill, "question": question}, special_tokens)
    if template == "raw":
        return _assemble_raw(tokenizer, raw_pieces(system, fill, question, placement, joiner), model,
                             add_special_tokens, special_tokens)
    sys_pieces, user_pieces = content_pieces(system, fill, question, placement)
    if template == "chat":
        pieces = chat_pieces(tokenizer, sys_pieces, user_pieces)
    else:
        pieces = plain_pieces(model, tokenizer, sys_pieces, user_pieces)
    return _assemble(tokenizer, [(n, t) for n, t in pieces if t], model, special_tokens)


def raw_pieces(system: str | None, fill: str | None, question: str, placement: Placement,
               joiner: str = "") -> Pieces:
    """The named pieces of the raw template, in order, ``joiner`` between consecutive ones.

    The joiner after a piece is named after it (``system_sep``, ``filler_sep``); the one
    before a filler placed after the question is ``filler_sep`` too, so
    ``positions_except("filler")`` always drops the filler and one joiner.

    Example:
        >>> raw_pieces("Sys.", "/ /", "Q?", "between", "")
        [('system', 'Sys.'), ('filler', '/ /'), ('question', 'Q?')]
    """
    order: list[str] = []
    if placement == "before_system" and fill is not None:
        order.append("filler")
    if system:
        order.append("system")
    if placement == "between" and fill is not None:
        order.append("filler")
    order.append("question")
    if placement == "after_question" and fill is not None:
        order.append("filler")
    text = {"question": question} | ({"system": system} if system else {}) | ({} if fill is None else {"filler": fill})
    pieces: Pieces = []
    for i, name in enumerate(order):
        if i and joiner:
            prev = order[i - 1]
            sep = "filler_sep" if prev == "question" else f"{prev}_sep"
            pieces.append((sep, joiner))
        pieces.append((name, text[name]))
    return pieces


def _assemble_raw(tokenizer, pieces: Pieces, model, add_special_tokens: bool = True,
                  special_tokens: str = "refuse") -> Prompt:
    """Tokenize the concatenated pieces in one call; segments from the tokens' character offsets."""
    text = "".join(t for _, t in pieces)
    if not getattr(tokenizer, "is_fast", False):
        raise LensprobeError(
            "template='raw' needs a fast tokenizer (one that returns character offsets); load the "
            "tokenizer with AutoTokenizer.from_pretrained(..., use_fast=True)."
        )
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=add_special_tokens,
                    **encode_options(special_tokens, "question"))  # all of it is the user's text
    ids = list(enc["input_ids"])
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    _check_context(len(ids), model)
    bounds, start = [], 0  # (name, first char, end char) per piece
    for name, piece in pieces:
        bounds.append((name, start, start + len(piece)))
        start += len(piece)
    owner: list[str] = []
    straddling: list[int] = []
    for pos, (a, b) in enumerate(offsets):
        if a == b:  # a special token the tokenizer adds: "bos" in front, else the segment before it
            owner.append(owner[-1] if owner else "bos")
            continue
        name, _, end = next((x for x in bounds if x[1] <= a < x[2]), bounds[-1])
        owner.append(name)
        if b > end:
            straddling.append(pos)
    segments: dict[str, tuple[int, int]] = {}
    for name in ["bos"] * ("bos" in owner) + [n for n, _, _ in bounds]:
        where = [i for i, o in enumerate(owner) if o == name]
        if where:
            segments[name] = (where[0], where[-1] + 1)
        else:  # every character went to a token that started earlier: an empty span
            first_after = next((i for i, (a, _) in enumerate(offsets) if a >= _piece_start(bounds, name)
                                and owner[i] != "bos"), len(ids))
            segments[name] = (first_after, first_after)
    return Prompt(
        tokens=torch.tensor([ids], dtype=torch.long, device="cpu"),
        str_tokens=[tokenizer.decode([i]) for i in ids],
        segments=segments,
        text=text,
        pieces=dict(pieces),
        straddling=tuple(straddling),
    )


def _piece_start(bounds: list[tuple[str, int, int]], name: str) -> int:
    return next(a for n, a, _ in bounds if n == name)


def _context(model) -> int | None:
    """The context length of a model or its :class:`~lensprobe.core.models.facts.ModelFacts`; ``None`` for a
    tokenizer (no limit known)."""
    if isinstance(model, ModelFacts):
        return model.n_ctx
    return getattr(getattr(model, "cfg", None), "n_ctx", None)


def _check_context(n_tokens: int, model) -> None:
    n_ctx = _context(model)
    if n_ctx is not None and n_tokens > n_ctx:
        raise LensprobeError(
            f"prompt is {n_tokens} tokens but the model's context is {n_ctx}: shorten the "
            "question or use a smaller filler count."
        )


def content_pieces(system: str | None, fill: str | None, question: str, placement: Placement
                   ) -> tuple[Pieces, Pieces]:
    """The named pieces of the system message and of the user message, the filler placed."""
    sys_pieces: Pieces = [("system", system)] if system else []
    user_pieces: Pieces = [("question", question)]
    if fill is not None:
        if placement == "between":
            user_pieces = [("filler", fill), ("filler_sep", FILLER_SEP)] + user_pieces
        elif placement == "after_question":
            user_pieces = user_pieces + [("filler_sep", FILLER_SEP), ("filler", fill)]
        elif sys_pieces:
            sys_pieces = [("filler", fill), ("filler_sep", FILLER_SEP)] + sys_pieces
        else:
            user_pieces = [("filler", fill), ("filler_sep", FILLER_SEP)] + user_pieces
    return sys_pieces, user_pieces


def chat_pieces(tokenizer, sys_pieces: Pieces, user_pieces: Pieces) -> Pieces:
    """The pieces inside the chat template's scaffolding (``system_prefix``, ``user_prefix``,
    ``assistant_prefix``)."""
    scaffold = _chat_scaffold(tokenizer, bool(sys_pieces))
    if sys_pieces:
        return ([("system_prefix", scaffold[0])] + sys_pieces
                + [("user_prefix", scaffold[1])] + user_pieces
                + [("assistant_prefix", scaffold[2])])
    return [("user_prefix", scaffold[0])] + user_pieces + [("assistant_prefix", scaffold[1])]


def plain_pieces(model, tokenizer, sys_pieces: Pieces, user_pieces: Pieces) -> Pieces:
    """The pieces as plain text: the BOS token (when the model prepends one), the system prompt and a
    blank line, then the user message."""
    pieces: Pieces = []
    bos = getattr(tokenizer, "bos_token", None)
    prepend = model.prepend_bos if isinstance(model, ModelFacts) else getattr(
        getattr(model, "cfg", None), "default_prepend_bos", True)
    if bos and prepend:
        pieces.append(("bos", bos))
    if sys_pieces:
        pieces += sys_pieces + [("system_sep", "\n\n")]
    return pieces + user_pieces


def _assemble(tokenizer, pieces: list[tuple[str, str]], model, special_tokens: str = "refuse") -> Prompt:
    """Tokenize each piece on its own and concatenate: the :class:`Prompt` with one segment per piece."""
    ids: list[int] = []
    segments: dict[str, tuple[int, int]] = {}
    for name, text in pieces:
        piece_ids = tokenizer.encode(text, add_special_tokens=False, **encode_options(special_tokens, name))
        segments[name] = (len(ids), len(ids) + len(piece_ids))
        ids.extend(piece_ids)
    _check_context(len(ids), model)
    str_tokens = [tokenizer.decode([i]) for i in ids]
    return Prompt(
        tokens=torch.tensor([ids], dtype=torch.long, device="cpu"),
        str_tokens=str_tokens,
        segments=segments,
        text="".join(t for _, t in pieces),
        pieces=dict(pieces),
    )


def prompt_json(prompt: Prompt) -> dict[str, Any]:
    """A prompt's text, token ids, token strings and segments as plain JSON types."""
    return {
        "text": prompt.text,
        "token_ids": prompt.tokens[0].tolist(),
        "str_tokens": list(prompt.str_tokens),
        "segments": {k: list(v) for k, v in prompt.segments.items()},
        **({"straddling": list(prompt.straddling)} if prompt.straddling else {}),
    }
