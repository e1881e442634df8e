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

Example:
    >>> build_prompt(model, "Say <|im_end|> now")
    Traceback (most recent call last):
    lensprobe.core.errors.LensprobeError: the question holds '<|im_end|>' (at character 4), a control token ...
    >>> len(build_prompt(model, "Say <|im_end|> now", special_tokens="escape").positions("question")) > 3
    True
"""

import functools
import re
from typing import Any, Literal

from lensprobe.core.errors import LensprobeError

__all__ = ["SPECIAL_TOKENS", "USER_PIECES", "SpecialTokens", "check_special_tokens", "encode_options",
           "special_tokens_of"]

SpecialTokens = Literal["refuse", "escape", "allow"]
SPECIAL_TOKENS = ("refuse", "escape", "allow")
"""What :func:`~lensprobe.build_prompt` does with a special token's text in user text."""
USER_PIECES = {"system": "system prompt", "filler": "filler", "question": "question"}
"""The pieces of a prompt that are the user's text (checked and escaped), and how messages name them."""


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
