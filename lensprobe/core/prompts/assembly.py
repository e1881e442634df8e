"""How a prompt's named pieces become token ids: the pieces of each template (raw, chat, plain) and the
two ways they are tokenized (each piece on its own, or the whole string in one call with segments read off
the character offsets). :func:`~lensprobe.core.prompts.prompt.build_prompt` puts them together; see its
module for what each template guarantees.

Example:
    >>> raw_pieces("Sys.", "/ /", "Q?", "between")
    [('system', 'Sys.'), ('filler', '/ /'), ('question', 'Q?')]
"""

from typing import Any, Literal

import torch

from lensprobe.core.errors import ContextLengthError, LensprobeError
from lensprobe.core.models.facts import ModelFacts
from lensprobe.core.prompts.special import check_control_ids, encode_options

__all__ = ["FILLER_SEP", "PLACEMENTS", "SCAFFOLD", "Pieces", "Placement", "chat_pieces", "chat_scaffold", "check_context",
           "content_pieces", "model_context", "piece_start", "plain_pieces", "raw_pieces", "tokenize_pieces", "tokenize_raw"]

Placement = Literal["between", "before_system", "after_question"]
PLACEMENTS = ("between", "before_system", "after_question")
FILLER_SEP = "\n"
Pieces = list[tuple[str, str]]
"""Named pieces of prompt text, in order: ``[(segment name, text), ...]``."""
SCAFFOLD = frozenset({"bos", "system_prefix", "user_prefix", "assistant_prefix"})
"""The pieces a template places itself: their control tokens are the template's, never refused."""


_SENTINELS = ("\x00LP_SYSTEM\x00", "\x00LP_USER\x00")


def chat_scaffold(tokenizer, has_system: bool) -> list[str]:
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


def tokenize_raw(tokenizer, pieces: Pieces, model, add_special_tokens: bool = True,
                  special_tokens: str = "refuse") -> dict[str, Any]:
    """Tokenize the concatenated pieces in one call; segments from the tokens' character offsets: the
    :class:`~lensprobe.core.prompts.prompt.Prompt`'s fields."""
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
    bounds, start = [], 0  # (name, first char, end char) per piece
    for name, piece in pieces:
        bounds.append((name, start, start + len(piece)))
        start += len(piece)

    def source(pos: int):  # the pieces a token's characters came from; None: a token the tokenizer added
        a, b = offsets[pos]
        return None if a == b else (tuple(n for n, s, e in bounds if s < b and a < e and s < e), text[a:b])

    check_control_ids(tokenizer, ids, source, special_tokens)  # before the length: the first thing wrong
    check_context(len(ids), model)
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
            first_after = next((i for i, (a, _) in enumerate(offsets) if a >= piece_start(bounds, name)
                                and owner[i] != "bos"), len(ids))
            segments[name] = (first_after, first_after)
    return dict(
        tokens=torch.tensor([ids], dtype=torch.long, device="cpu"),
        str_tokens=[tokenizer.decode([i]) for i in ids],
        segments=segments,
        text=text,
        pieces=dict(pieces),
        straddling=tuple(straddling),
    )


def piece_start(bounds: list[tuple[str, int, int]], name: str) -> int:
    return next(a for n, a, _ in bounds if n == name)


def model_context(model) -> int | None:
    """The context length of a model or its :class:`~lensprobe.core.models.facts.ModelFacts`; ``None`` for a
    tokenizer (no limit known)."""
    if isinstance(model, ModelFacts):
        return model.n_ctx
    return getattr(getattr(model, "cfg", None), "n_ctx", None)


def check_context(n_tokens: int, model) -> None:
    n_ctx = model_context(model)
    if n_ctx is not None and n_tokens > n_ctx:
        raise ContextLengthError(
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
    scaffold = chat_scaffold(tokenizer, bool(sys_pieces))
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


def tokenize_pieces(tokenizer, pieces: list[tuple[str, str]], model, special_tokens: str = "refuse") -> dict[str, Any]:
    """Tokenize each piece on its own and concatenate: the :class:`~lensprobe.core.prompts.prompt.Prompt`'s
    fields, one segment per piece."""
    ids: list[int] = []
    segments: dict[str, tuple[int, int]] = {}
    sources: list = []  # per token: None for the template's scaffolding, else (its piece's name, the piece's text)
    for name, text in pieces:
        piece_ids = tokenizer.encode(text, add_special_tokens=False, **encode_options(special_tokens, name))
        segments[name] = (len(ids), len(ids) + len(piece_ids))
        ids.extend(piece_ids)
        sources += [None if name in SCAFFOLD else ((name,), text)] * len(piece_ids)
    check_control_ids(tokenizer, ids, sources.__getitem__, special_tokens)  # before the length: the first thing wrong
    check_context(len(ids), model)
    str_tokens = [tokenizer.decode([i]) for i in ids]
    return dict(
        tokens=torch.tensor([ids], dtype=torch.long, device="cpu"),
        str_tokens=str_tokens,
        segments=segments,
        text="".join(t for _, t in pieces),
        pieces=dict(pieces),
    )
