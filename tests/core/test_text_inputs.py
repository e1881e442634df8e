"""Text inputs checked as text (lone surrogates, non-strings, empty), and the random-sentence filler built
in time linear in its length, refused before it is drawn when it cannot fit the context."""

import pytest

import lensprobe as lp
from lensprobe.core.prompts import randomtext
from lensprobe.core.prompts.randomtext import random_sentence_text
from lensprobe.core.prompts.text import blank, check_text, surrogate_at


@pytest.mark.unchecked
@pytest.mark.parametrize("question,message", [
    ("what \ud800 is", r"question holds a lone surrogate \(U\+D800 at character 5\), which is not text"),
    (123, "question must be a string, got int 123"),
    (None, r"question is empty \(got None\)"),
    ("   ", "question is empty"),
    ("\u200b\u200b", r"question shows nothing \(only invisible characters such as U\+200B or U\+FEFF\)"),
    ("\ufeff \u2060", "question shows nothing"),
])
def test_build_prompt_refuses_what_is_not_text(tiny, question, message):
    with pytest.raises(lp.LensprobeError, match=message):
        lp.build_prompt(tiny, question)


def test_a_system_prompt_or_filler_with_a_surrogate_is_refused(tiny):
    with pytest.raises(lp.LensprobeError, match="system prompt holds a lone surrogate"):
        lp.build_prompt(tiny, "What is 2+3?", system="sys \udcff")
    with pytest.raises(lp.LensprobeError, match="filler text holds a lone surrogate"):
        lp.Filler.text("a \udcfe b")


def test_surrogate_at_and_check_text():
    assert surrogate_at("ok") is None and surrogate_at("a\udcffb") == 1
    assert check_text("", "system", empty=True) == ""


def test_blank_is_whitespace_and_invisible_format_characters_only():
    assert blank("") and blank(" \u200b\ufeff\u200d\n") and not blank("a\u200b") and not blank("\u00e9")


class CountingTokenizer:
    """A tokenizer whose ``encode`` calls are counted."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def encode(self, text, add_special_tokens=False):
        self.calls += 1
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def test_a_long_random_sentence_takes_a_bounded_number_of_tokenizer_calls(tiny):
    counting = CountingTokenizer(tiny.tokenizer)
    text = random_sentence_text(counting, 20_000, seed=3)
    assert len(tiny.tokenizer.encode(text, add_special_tokens=False)) == 20_000
    assert counting.calls <= 2 * len(randomtext._WORDS) + 1  # once per distinct word, once for the whole


class MergingTokenizer(CountingTokenizer):
    """Counts do not add up across words: a word after 'the' costs nothing (as if merged)."""

    def encode(self, text, add_special_tokens=False):
        self.calls += 1
        words = text.split(" ")
        return [0 for i, w in enumerate(words) if w and not (i and words[i - 1] == "the")]


def test_a_tokenizer_whose_counts_do_not_add_up_still_gets_exactly_n_tokens(tiny):
    counting = MergingTokenizer(tiny.tokenizer)
    text = random_sentence_text(counting, 3000, seed=0)
    assert len(counting.encode(text)) == 3000
    assert counting.calls < 2 * len(randomtext._WORDS) + 250  # binary search and a short fill, not one per word


def test_a_random_sentence_longer_than_the_context_is_refused_before_it_is_drawn(tiny, monkeypatch):
    def never(*args):
        raise AssertionError("the sentence was drawn")

    monkeypatch.setattr(lp.Filler, "resolve", never)
    n_ctx = int(tiny.cfg.n_ctx)
    with pytest.raises(lp.LensprobeError, match=f"a random sentence of {10**6} tokens is longer than the model's "
                                                f"context of {n_ctx}"):
        lp.build_prompt(tiny, "What is 2+3?", filler=lp.Filler.random_sentence(10**6))
