"""Control tokens in user text: what happens when a question, a system prompt or a filler holds the text of
one of the tokenizer's special tokens (``<|im_end|>``, ``<|im_start|>``, ``<eos>``...).

A tokenizer turns such text into the control token itself: a question holding ``<|im_end|>`` would end
the user's message early, with no word. :func:`~lensprobe.build_prompt` decides by its
``special_tokens`` argument (:data:`SPECIAL_TOKENS`):

- ``"refuse"`` (the default): a :class:`~lensprobe.core.errors.LensprobeError` naming the token and the
  field that holds it;
- ``"escape"``: the text is tokenized as the characters it is made of (the tokenizer's
  ``split_special_tokens``), so ``<|im_end|>`` in a question is a few ordinary tokens;
- ``"allow"``: the text becomes the control token, as the tokenizer does on its own.

Only the user's pieces are checked and escaped; the chat template's own scaffolding keeps its control
tokens. Added tokens that are not special (such as a ``<think>`` marker some tokenizers add) are left as
the tokenizer reads them.

The rule holds on the prompt's final token ids (:func:`check_control_ids`, run where every prompt is
tokenized): a control token id (:func:`control_ids`) at a position the template did not place itself is
refused, naming the piece(s) its characters came from, also when its text is split across pieces that the
``"raw"`` template joins into one string (``<|im_`` ending the system prompt, ``end|>`` opening the
filler, or a joiner). Under ``"escape"`` the final ids are checked again, and a tokenizer that still makes
the control token is refused. An answer or target token given as text (:func:`text_ids`) that is or holds a
control token is refused the same way.

Example:
    >>> build_prompt(model, "Say <|im_end|> now")
    Traceback (most recent call last):
    lensprobe.core.errors.LensprobeError: the question holds '<|im_end|>' (at character 4), a control token ...
    >>> len(build_prompt(model, "Say <|im_end|> now", special_tokens="escape").positions("question")) > 3
    True
"""

import functools
import re
from collections.abc import Callable
from typing import Any, Literal

from lensprobe.core.errors import LensprobeError

__all__ = ["SPECIAL_TOKENS", "USER_PIECES", "Source", "SpecialTokens", "check_control_ids", "check_special_tokens",
           "control_ids", "encode_options", "piece_label", "special_tokens_of", "text_ids"]

SpecialTokens = Literal["refuse", "escape", "allow"]
SPECIAL_TOKENS = ("refuse", "escape", "allow")
"""What :func:`~lensprobe.build_prompt` does with a special token's text in user text."""
USER_PIECES = {"system": "system prompt", "filler": "filler", "question": "question"}
"""The pieces of a prompt that are the user's text (checked and escaped), and how messages name them."""
Source = tuple[tuple[str, ...], str] | None
"""Where a token of a prompt came from: the names of the pieces its characters belong to and the text it
was made of, or ``None`` for a token the template placed itself."""


def special_tokens_of(tokenizer) -> tuple[str, ...]:
    """The texts of ``tokenizer``'s special tokens (the added tokens marked special, and BOS, EOS, PAD...).

    Example:
        >>> special_tokens_of(model.tokenizer)
        ('<|endoftext|>', '<|im_start|>', '<|im_end|>')
    """
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {str(t.content) for t in added.values() if getattr(t, "special", False)}
    found |= {str(t) for t in getattr(tokenizer, "all_special_tokens", None) or ()}
    return tuple(sorted(t for t in found if t))


@functools.lru_cache(maxsize=8)
def _pattern(tokens: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def check_special_tokens(tokenizer, pieces: dict[str, str | None], mode: Any) -> None:
    """Refuse user text holding a special token's text when ``mode`` is ``"refuse"``.

    Args:
        tokenizer: the prompt's tokenizer.
        pieces: segment name (a key of :data:`USER_PIECES`) -> its text (``None``: absent).
        mode: one of :data:`SPECIAL_TOKENS`.

    Raises:
        LensprobeError: an unknown ``mode``, or (``"refuse"``) a piece that holds a special token's text.

    Example:
        >>> check_special_tokens(model.tokenizer, {"question": "a <|im_start|> b"}, "escape")
    """
    if mode not in SPECIAL_TOKENS:
        raise LensprobeError(f"unknown special_tokens={mode!r}: use one of {SPECIAL_TOKENS}.")
    tokens = special_tokens_of(tokenizer)
    if mode != "refuse" or not tokens:
        return
    pattern = _pattern(tokens)
    for name, text in pieces.items():
        found = pattern.search(text) if text else None
        if found:
            raise LensprobeError(
                f"the {USER_PIECES[name]} holds {found.group()!r} (at character {found.start()}), a control token of "
                "this tokenizer: it would be read as that token, not as text (e.g. ending the message early). Remove "
                "it, or pass special_tokens='escape' to read it as plain text ('allow' keeps it a control token).")


def encode_options(mode: str, name: str) -> dict[str, bool]:
    """Keyword arguments for tokenizing piece ``name``: ``split_special_tokens=True`` for the user's pieces
    when ``mode`` is ``"escape"``, else none.

    Example:
        >>> encode_options("escape", "question"), encode_options("escape", "user_prefix")
        ({'split_special_tokens': True}, {})
    """
    return {"split_special_tokens": True} if mode == "escape" and name in USER_PIECES else {}


def control_ids(tokenizer) -> frozenset[int]:
    """The ids of ``tokenizer``'s control tokens: its ``all_special_ids`` (BOS, EOS, PAD, UNK...) and the
    added tokens marked special.

    Example:
        >>> sorted(control_ids(model.tokenizer))
        [0, 1, 2]
    """
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {int(i) for i, t in added.items() if getattr(t, "special", False)}
    found |= {int(i) for i in getattr(tokenizer, "all_special_ids", None) or () if i is not None}
    return frozenset(found)


def piece_label(name: str) -> str:
    """How messages name piece ``name``: ``"question"``, ``"system prompt"``, ``"joiner (system_sep)"``...

    Example:
        >>> piece_label("system"), piece_label("filler_sep")
        ('system prompt', 'joiner (filler_sep)')
    """
    return USER_PIECES.get(name) or (f"joiner ({name})" if name.endswith("_sep") else name)


def _made_from_text(tokenizer, token_id: int, text: str) -> bool:
    """Whether control token ``token_id`` was made from its own text: always, but for the unknown token,
    which also stands for characters a vocabulary lacks (then it is no control token the text spelled)."""
    unk = getattr(tokenizer, "unk_token", None)
    return token_id != getattr(tokenizer, "unk_token_id", None) or (bool(unk) and str(unk) in text)


def check_control_ids(tokenizer, ids: list[int], source_of: Callable[[int], Source], mode: Any) -> None:
    """Refuse a control token the user's text made in a prompt's final token ids.

    Every id of :func:`control_ids` at a position ``source_of`` does not give as the template's own
    (``None``) is refused under ``"refuse"``; under ``"escape"`` it means escaping failed, and is refused
    too. ``"allow"`` keeps them.

    Args:
        tokenizer: the prompt's tokenizer.
        ids: the prompt's final token ids.
        source_of: position -> :data:`Source` (the pieces and text it came from, ``None``: the template's).
        mode: one of :data:`SPECIAL_TOKENS`.

    Raises:
        LensprobeError: naming the control token, its position, the piece(s) it came from and the fix.

    Example:
        >>> check_control_ids(model.tokenizer, [67, 2], lambda pos: (("question",), "<|im_end|>"), "refuse")
        Traceback (most recent call last):
        lensprobe.core.errors.LensprobeError: the prompt's token ids hold the control token '<|im_end|>' ...
    """
    if mode == "allow":
        return
    specials = control_ids(tokenizer)
    for pos, token_id in enumerate(ids):
        source = source_of(pos) if token_id in specials else None
        if source is None or not _made_from_text(tokenizer, token_id, source[1]):
            continue
        token, where = tokenizer.decode([token_id]), " and the ".join(piece_label(n) for n in source[0])
        made = f"the control token {token!r} (id {token_id}, at position {pos}), made from the text of the {where}"
        if mode == "escape":
            raise LensprobeError(
                f"special_tokens='escape' left {made}, in the prompt's token ids: this tokenizer makes it even when "
                "told to split special tokens. Rewrite that text so that it does not spell it.")
        raise LensprobeError(
            f"the prompt's token ids hold {made}: it would be read as that token, not as text (e.g. ending the "
            "message early). Rewrite that text so that it does not spell it, or pass special_tokens='escape' to read "
            "it as plain text ('allow' keeps it a control token).")


def text_ids(tokenizer, text: str, what: str) -> list[int]:
    """``text`` (an answer, a target token, a continuation) as token ids, without the special tokens a
    tokenizer adds; refused when it is or holds a control token.

    Args:
        tokenizer: the model's tokenizer.
        text: the text.
        what: how messages name it (``"the answer"``).

    Raises:
        LensprobeError: ``text`` tokenizes to a control token, named with its id and the fix.

    Example:
        >>> text_ids(model.tokenizer, "<|im_end|>", "the answer")
        Traceback (most recent call last):
        lensprobe.core.errors.LensprobeError: the answer '<|im_end|>' holds the control token '<|im_end|>' (id 2) ...
    """
    ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    specials = control_ids(tokenizer)
    found = next((i for i in ids if i in specials and _made_from_text(tokenizer, i, text)), None)
    if found is not None:
        raise LensprobeError(
            f"{what} {text!r} holds the control token {tokenizer.decode([found])!r} (id {found}): as text it is read "
            "as that token, not as characters. Rewrite the text so that it does not spell it, or give token ids "
            f"(here {found}) where the control token itself is meant.")
    return ids
