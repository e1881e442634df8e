"""Prompt building's edges the tests of test_prompts*.py do not reach: the raw template's segments read off
character offsets a tokenizer gives (a piece with no token of its own, a special token after the text), the
model's settings a prompt reads (its context, whether it prepends BOS), special tokens escaped or allowed
in every template, the JSON form and identity of a prompt, and every refusal's message, whole.

Expected spans are counted by hand from the offsets given; expected token ids come from calling the
tokenizer directly; the identity's digest from hashlib over the prompt's fields written out."""

import hashlib
import json
import re
from types import SimpleNamespace

import pytest
from oracles import authors_tokenizer
from test_prompts import check_spans

from lensprobe import Filler, LensprobeError, build_prompt
from lensprobe.core.models.testing import tiny_tokenizer
from lensprobe.core.prompts.assembly import raw_pieces
from lensprobe.core.prompts.prompt import prompt_json

END = "<|im_end|>"  # a special token of the tiny tokenizer (its EOS)


class ScriptedTokenizer:
    """A fast tokenizer whose tokens and character offsets are given: ``[(text, (start, end)), ...]``.
    ``fast=None`` makes one without the ``is_fast`` attribute."""

    def __init__(self, tokens, fast=True):
        self.tokens = tokens
        self.options = []
        if fast is not None:
            self.is_fast = fast

    def __call__(self, text, return_offsets_mapping=False, add_special_tokens=True, **options):
        self.options.append(options)
        return {"input_ids": list(range(len(self.tokens))), "offset_mapping": [o for _, o in self.tokens]}

    def decode(self, ids):
        return "".join(self.tokens[i][0] for i in ids)


def stand_in(model, n_ctx=256, prepend_bos=True):
    """``model``'s tokenizer with other settings: its context and whether it prepends BOS."""
    return SimpleNamespace(tokenizer=model.tokenizer, cfg=SimpleNamespace(n_ctx=n_ctx, default_prepend_bos=prepend_bos))


def refused(message, call, *args, **kwargs):
    """``call`` raises a LensprobeError whose message is exactly ``message``."""
    with pytest.raises(LensprobeError, match=f"^{re.escape(message)}$"):
        call(*args, **kwargs)


def test_a_piece_whose_characters_all_went_to_an_earlier_token_is_an_empty_span():
    # "Sys/Q": the token "Sys/" starts in the system prompt and swallows the whole filler; an end token follows
    tok = ScriptedTokenizer([("<s>", (0, 0)), ("Sys/", (0, 4)), ("Q", (4, 5)), ("</s>", (5, 5))])
    p = build_prompt(tok, "Q", system="Sys", filler=Filler.text("/"), template="raw")
    assert p.text == "Sys/Q"
    assert p.segments == {"bos": (0, 1), "system": (1, 2), "filler": (2, 2), "question": (2, 4)}
    assert p.straddling == (1,)
    assert p.str_tokens == ["<s>", "Sys/", "Q", "</s>"]
    assert p.positions("filler") == [] and p.segment_of(3) == "question"


def test_an_empty_span_at_the_end_and_at_the_start():
    # the filler after the question, swallowed by "Q/": its span is empty at the prompt's end
    tok = ScriptedTokenizer([("<s>", (0, 0)), ("Q/", (0, 2))])
    p = build_prompt(tok, "Q", filler=Filler.text("/"), placement="after_question", template="raw")
    assert p.segments == {"bos": (0, 1), "question": (1, 2), "filler": (2, 2)}
    assert p.straddling == (1,)
    # a system prompt of a space the tokenizer drops: its span is empty after the BOS token, not before it
    tok = ScriptedTokenizer([("<s>", (0, 0)), ("Q", (1, 2))])
    p = build_prompt(tok, "Q", system=" ", template="raw")
    assert p.segments == {"bos": (0, 1), "system": (1, 1), "question": (1, 2)}
    assert p.straddling == ()


def test_the_raw_template_needs_a_tokenizer_that_says_it_is_fast():
    message = ("template='raw' needs a fast tokenizer (one that returns character offsets); load the tokenizer "
               "with AutoTokenizer.from_pretrained(..., use_fast=True).")
    for fast in (False, None):  # slow, or a tokenizer that does not say
        refused(message, build_prompt, ScriptedTokenizer([("Q", (0, 1))], fast=fast), "Q", template="raw")


def test_special_tokens_escaped_or_allowed_in_the_raw_template(tiny):
    tok, question = authors_tokenizer(tiny.tokenizer.name_or_path), f"a {END} b"
    escaped = build_prompt(tiny, question, template="raw", special_tokens="escape")
    allowed = build_prompt(tiny, question, template="raw", special_tokens="allow")
    assert escaped.tokens[0].tolist() == tok(question, split_special_tokens=True).input_ids
    assert allowed.tokens[0].tolist() == tok(question).input_ids
    assert tok.eos_token_id in allowed.tokens[0].tolist() and tok.eos_token_id not in escaped.tokens[0].tolist()
    scripted = ScriptedTokenizer([("Q", (0, 1))])
    for mode, options in (("escape", {"split_special_tokens": True}), ("allow", {})):
        build_prompt(scripted, "Q", template="raw", special_tokens=mode)
        assert scripted.options[-1] == options


@pytest.mark.parametrize("chat", [True, False])
def test_special_tokens_escaped_or_allowed_piece_by_piece(tiny, chat):
    tok, question = authors_tokenizer(tiny.tokenizer.name_or_path), f"a {END} b"
    escaped = build_prompt(tiny, question, chat=chat, special_tokens="escape")
    allowed = build_prompt(tiny, question, chat=chat, special_tokens="allow")
    assert escaped.tokens[0, slice(*escaped.segments["question"])].tolist() == tok.encode(
        question, add_special_tokens=False, split_special_tokens=True)
    assert allowed.tokens[0, slice(*allowed.segments["question"])].tolist() == tok.encode(
        question, add_special_tokens=False)
    assert tok.eos_token_id in allowed.tokens[0, slice(*allowed.segments["question"])].tolist()
    # the scaffolding keeps its own control tokens either way
    assert escaped.tokens[0, :escaped.segments["question"][0]].tolist() == \
        allowed.tokens[0, :allowed.segments["question"][0]].tolist()


@pytest.mark.parametrize(("field", "kwargs"), [
    ("system prompt", {"system": f"S {END}"}),
    ("filler", {"filler": Filler.text(f"/ {END}")}),
    ("question", {"question": f"Q? {END}"}),
])
def test_a_special_token_in_user_text_is_refused_naming_the_field(tiny, field, kwargs):
    at = {"system prompt": 2, "filler": 2, "question": 3}[field]
    message = (f"the {field} holds '{END}' (at character {at}), a control token of this tokenizer: it would be "
               "read as that token, not as text (e.g. ending the message early). Remove it, or pass "
               "special_tokens='escape' to read it as plain text ('allow' keeps it a control token).")
    refused(message, build_prompt, tiny, **{"question": "Q?", **kwargs})


@pytest.mark.parametrize("template", ["plain", "raw"])
def test_a_prompt_as_long_as_the_context_is_accepted_one_token_longer_refused(tiny, template):
    n = len(build_prompt(tiny, "What is 12+7?", template=template))
    exact = build_prompt(stand_in(tiny, n_ctx=n), "What is 12+7?", template=template)
    assert len(exact) == n
    message = (f"prompt is {n} tokens but the model's context is {n - 1}: shorten the question or use a smaller "
               "filler count.")
    refused(message, build_prompt, stand_in(tiny, n_ctx=n - 1), "What is 12+7?", template=template)


def test_a_random_sentence_longer_than_the_context_is_refused_before_it_is_drawn(tiny):
    message = "a random sentence of 300 tokens is longer than the model's context of 256: use a smaller filler count."
    refused(message, build_prompt, tiny, "Q?", filler=Filler.random_sentence(300))
    # as long as the context: drawn, then the whole prompt is too long
    with pytest.raises(LensprobeError, match=r"^prompt is \d+ tokens but the model's context is 256: "):
        build_prompt(tiny, "Q?", filler=Filler.random_sentence(256))


def test_the_plain_template_prepends_bos_as_the_model_does(tiny):
    tok = tiny.tokenizer
    for model in (tiny, tok):  # a model that prepends BOS, and a tokenizer (no settings: BOS prepended)
        p = build_prompt(model, "What?", system="Sys", chat=False)
        assert list(p.segments) == ["bos", "system", "system_sep", "question"]
        assert p.pieces == {"bos": tok.bos_token, "system": "Sys", "system_sep": "\n\n", "question": "What?"}
    no_bos = stand_in(tiny, prepend_bos=False)
    p = build_prompt(no_bos, "What?", system="Sys", chat=False)
    assert list(p.segments) == ["system", "system_sep", "question"]
    check_spans(no_bos, p)
    assert p.tokens[0].tolist() == [i for text in ("Sys", "\n\n", "What?")
                                    for i in tok.encode(text, add_special_tokens=False)]


def test_an_empty_system_prompt_is_accepted_and_left_out(tiny):
    p = build_prompt(tiny, "What?", system="", chat=False)
    assert list(p.segments) == ["bos", "question"]
    assert build_prompt(tiny, "What?", system="").tokens.tolist() == build_prompt(tiny, "What?").tokens.tolist()


def test_a_prompts_json_and_identity_hold_its_text_tokens_and_segments(tiny):
    p = build_prompt(tiny, "What?", system="Sys", chat=False)
    expected = {"text": p.text, "token_ids": p.tokens[0].tolist(), "str_tokens": list(p.str_tokens),
                "segments": {name: [a, b] for name, (a, b) in p.segments.items()}}
    assert prompt_json(p) == expected  # no "straddling" when there is none
    sha = hashlib.sha256(json.dumps(expected, sort_keys=True).encode()).hexdigest()[:16]
    assert p.__lensprobe_identity__() == {"digest": sha, "tokens": len(p.tokens[0])}
    raw = build_prompt(ScriptedTokenizer([("<s>", (0, 0)), ("Q/", (0, 2))]), "Q", filler=Filler.text("/"),
                       placement="after_question", template="raw")
    assert prompt_json(raw)["straddling"] == [1]


def test_raw_pieces_join_with_nothing_by_default():
    assert raw_pieces("Sys.", "/ /", "Q?", "between") == [("system", "Sys."), ("filler", "/ /"), ("question", "Q?")]


def test_a_chat_template_missing_or_dropping_the_messages_is_refused():
    no_template = ("chat=True but this tokenizer has no chat template: pass chat=False to build a plain-text "
                   "prompt, or set tokenizer.chat_template.")
    refused(no_template, build_prompt, tiny_tokenizer(chat_template=False), "What?")
    refused(no_template, build_prompt, ScriptedTokenizer([("Q", (0, 1))]), "What?")  # no chat_template at all
    dropping = tiny_tokenizer()
    dropping.chat_template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n<|im_end|>\n{% endfor %}"
    refused("the chat template dropped the message content; pass chat=False and format the prompt yourself.",
            build_prompt, dropping, "What?")


@pytest.mark.unchecked
def test_every_refusal_of_build_prompt_says_exactly_what_was_wrong(tiny):
    refused("system prompt must be a string, got int 3.", build_prompt, tiny, "Q?", system=3)
    refused("joiner must be a string, got int.", build_prompt, tiny, "Q?", template="raw", joiner=3)
    refused("add_special_tokens=False applies to template='raw' only; the chat and plain templates place their "
            "special tokens themselves.", build_prompt, tiny, "Q?", add_special_tokens=False)
    refused("joiner=' ' applies to template='raw' only; the 'plain' template has its own separators.",
            build_prompt, tiny, "Q?", chat=False, joiner=" ")
    refused("filler must be a lensprobe Filler (e.g. Filler.meaningless()), got str.",
            build_prompt, tiny, "Q?", filler="/ / /")
    p = build_prompt(tiny, "Q?")
    refused("positions_except needs at least one segment name, e.g. 'filler'.", p.positions_except)
