"""Filler text for prompts: the paper's meaningless (``/`` x 55) and meaningful (``he`` x 55) fillers,
a random sentence of a given token count, or any text (:func:`lensprobe.build_prompt` places it).

Example:
    >>> Filler.meaningless(count=3).content
    '/ / /'
"""

from dataclasses import dataclass

from lensprobe.core.checks import check_annotated, choice
from lensprobe.core.checks import count as checked_count
from lensprobe.core.errors import LensprobeError
from lensprobe.core.prompts.randomtext import random_sentence_text
from lensprobe.core.prompts.text import check_text

__all__ = ["FILLER_KINDS", "MAX_FILLER_COUNT", "Filler"]

MAX_FILLER_COUNT = 10_000_000
"""No model's context holds more filler repetitions: a larger count is a typo, refused before any text is built."""

FILLER_KINDS = ("meaningless", "meaningful", "random_sentence", "text")
"""What a :class:`Filler` is: the paper's two fillers, its random-sentence control, or text of your own."""


@dataclass(frozen=True)
class Filler:
    """Filler text inserted into a prompt (the paper's Mless, Mful, random sentence, or custom).

    Build one with the class methods; ``build_prompt`` places it.

    Example:
        >>> Filler.meaningless(count=3).content
        '/ / /'
    """

    kind: str
    content: str = ""
    n_tokens: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        check_annotated(self)
        choice("kind", self.kind, FILLER_KINDS)
        checked_count("n_tokens", self.n_tokens, 1 if self.kind == "random_sentence" else 0, MAX_FILLER_COUNT)

    @classmethod
    def meaningless(cls, symbol: str = "/", count: int = 55, sep: str = " ") -> "Filler":
        """The paper's "Mless" filler: ``symbol`` repeated ``count`` times, joined by ``sep``."""
        return cls("meaningless", _repeat(symbol, count, sep))

    @classmethod
    def meaningful(cls, word: str = "he", count: int = 55, sep: str = " ") -> "Filler":
        """The paper's "Mful" filler: a real word repeated ``count`` times."""
        return cls("meaningful", _repeat(word, count, sep))

    @classmethod
    def text(cls, s: str) -> "Filler":
        """Any text as filler, e.g. a sentence of your own."""
        check_text(s, "filler text")
        return cls("text", s)

    @classmethod
    def random_sentence(cls, n_tokens: int, seed: int = 0) -> "Filler":
        """Real words in random order with exactly ``n_tokens`` tokens (the paper's control).

        The words are drawn when the prompt is built, since the count depends on the
        tokenizer. To match another filler, pass its token count, e.g.
        ``len(prompt.positions("filler"))``.
        """
        return cls("random_sentence", n_tokens=n_tokens, seed=seed)

    def resolve(self, tokenizer) -> str:
        """The filler's text for this tokenizer (draws the random sentence)."""
        if self.kind != "random_sentence":
            return self.content
        return random_sentence_text(tokenizer, self.n_tokens, self.seed)


def _repeat(item: str, count: int, sep: str) -> str:
    """``item`` repeated ``count`` times, joined by ``sep`` (both checked)."""
    checked_count("count", count, 1, MAX_FILLER_COUNT)  # bounded before the text is built
    if not isinstance(item, str) or not item:
        raise LensprobeError("filler symbol/word is empty: pass a non-empty string.")
    return sep.join([item] * count)
