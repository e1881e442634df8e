"""Prompts with named segments: exact spans, fillers, placements, alignment, errors.

Runs on the tiny test model and on the embedded SmolLM2 (``smol``).
"""

import pytest

import lensprobe as lp
from lensprobe import Filler, LensprobeError, build_prompt
from lensprobe.core.models.testing import tiny_model

QUESTION = "What is 12+7?"
PLACEMENTS = ["between", "before_system", "after_question"]


@pytest.fixture(params=["tiny", pytest.param("smol", marks=pytest.mark.slow)])
def model(request):
    return request.getfixturevalue(request.param)


def decode(model, prompt, name):
    start, end = prompt.segments[name]
    return model.tokenizer.decode(prompt.tokens[0, start:end].tolist())


def check_spans(model, prompt):
    """Spans tile the prompt in order and each decodes to exactly its piece's text."""
    assert prompt.tokens.ndim == 2 and prompt.tokens.shape[0] == 1
    assert len(prompt.str_tokens) == prompt.tokens.shape[1] == len(prompt)
    cursor = 0
    for name, (start, end) in prompt.segments.items():
        assert start == cursor and end > start, (name, start, end)
        assert decode(model, prompt, name) == prompt.pieces[name], name
        cursor = end
    assert cursor == len(prompt)
    assert prompt.text == "".join(prompt.pieces[n] for n in prompt.segments)
    assert prompt.str_tokens == [model.tokenizer.decode([t]) for t in prompt.tokens[0].tolist()]


@pytest.mark.parametrize("system", [None, lp.MATH_SYSTEM_PROMPT])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_chat_segments_exact_and_template_applied(model, placement, system):
    fill = Filler.meaningless()
    p = build_prompt(model, QUESTION, system=system, filler=fill, placement=placement)
    check_spans(model, p)
    assert p.pieces["filler"] == fill.content and p.pieces["question"] == QUESTION
    assert {"user_prefix", "assistant_prefix", "filler", "filler_sep", "question"} <= set(p.segments)
    assert ("system" in p.segments) == (system is not None)
    assert ("system_prefix" in p.segments) == (system is not None)

    # the same text the chat template renders for the equivalent messages
    user = QUESTION
    if placement == "after_question":
        user = QUESTION + "\n" + fill.content
    elif placement == "between" or system is None:
        user = fill.content + "\n" + QUESTION
    messages = [{"role": "user", "content": user}]
    if system is not None:
        sys_text = fill.content + "\n" + system if placement == "before_system" else system
        messages.insert(0, {"role": "system", "content": sys_text})
    rendered = model.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert p.text == rendered

    order = list(p.segments)
    if placement == "after_question":
        assert order.index("question") < order.index("filler_sep") < order.index("filler")
    else:
        assert order.index("filler") < order.index("filler_sep") < order.index("question")
    if system is not None:
        before = order.index("filler") < order.index("system")
        assert before == (placement == "before_system")


def test_smollm2_chat_prompt_is_the_canonical_tokenization(smol):
    """On SmolLM2 every chat-mode boundary falls where the tokenizer splits anyway."""
    for placement in PLACEMENTS:
        p = build_prompt(smol, QUESTION, system=lp.MATH_SYSTEM_PROMPT, filler=Filler.meaningless(),
                         placement=placement)
        assert p.tokens[0].tolist() == smol.tokenizer.encode(p.text, add_special_tokens=False)


@pytest.mark.parametrize("system", [None, "You are terse."])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_plain_text_segments(model, placement, system):
    p = build_prompt(model, QUESTION, system=system, filler=Filler.meaningful(count=5), placement=placement,
                     chat=False)
    check_spans(model, p)
    assert list(p.segments)[0] == "bos"
    assert p.tokens[0, 0].item() == model.tokenizer.bos_token_id
    assert not {"system_prefix", "user_prefix", "assistant_prefix"} & set(p.segments)
    body = p.text[len(model.tokenizer.bos_token):]
    fill = Filler.meaningful(count=5).content
    if system is None:
        expected = QUESTION + "\n" + fill if placement == "after_question" else fill + "\n" + QUESTION
    elif placement == "between":
        expected = system + "\n\n" + fill + "\n" + QUESTION
    elif placement == "before_system":
        expected = fill + "\n" + system + "\n\n" + QUESTION
    else:
        expected = system + "\n\n" + QUESTION + "\n" + fill
    assert body == expected


def test_no_filler_prompt(model):
    p = build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT)
    check_spans(model, p)
    assert "filler" not in p.segments and "filler_sep" not in p.segments


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_positions_except_filler_aligns_with_the_no_filler_prompt(model, placement, chat):
    with_f = build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT, filler=Filler.meaningless(),
                          placement=placement, chat=chat)
    without = build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT, chat=chat)
    keep = with_f.positions_except("filler")
    assert with_f.tokens[0, keep].tolist() == without.tokens[0].tolist()
    assert len(keep) == len(with_f) - len(with_f.positions("filler")) - len(with_f.positions("filler_sep"))


def test_positions_segment_of_and_several_names(tiny):
    p = build_prompt(tiny, QUESTION, system=lp.MATH_SYSTEM_PROMPT, filler=Filler.meaningless(count=4))
    for name, (start, end) in p.segments.items():
        assert p.positions(name) == list(range(start, end))
        assert all(p.segment_of(i) == name for i in range(start, end))
    keep = p.positions_except("filler", "question")
    dropped = set(p.positions("filler")) | set(p.positions("filler_sep")) | set(p.positions("question"))
    assert keep == [i for i in range(len(p)) if i not in dropped]
    with pytest.raises(LensprobeError, match="outside the prompt"):
        p.segment_of(len(p))


@pytest.mark.parametrize(
    ("filler", "count"),
    [(Filler.meaningless(), 55), (Filler.meaningful(), 55), (Filler.meaningless(count=10), 10),
     (Filler.meaningless(symbol="#", count=3, sep=""), None)],
)
def test_filler_token_counts(model, filler, count):
    p = build_prompt(model, QUESTION, filler=filler)
    if count is None:  # "###" has no separator: whatever the tokenizer makes of it, the span is exact
        assert decode(model, p, "filler") == "###"
    else:
        assert len(p.positions("filler")) == count
        assert p.str_tokens[p.segments["filler"][0] + 1].strip() == filler.content.split(" ")[0]


def test_filler_texts():
    assert Filler.meaningless(count=3).content == "/ / /"
    assert Filler.meaningful(count=2).content == "he he"
    assert Filler.meaningless(symbol="*", count=3, sep="").content == "***"
    assert Filler.text("any sentence").content == "any sentence"


@pytest.mark.parametrize("n_tokens", [1, 7, 55])
def test_random_sentence_has_exactly_n_tokens(model, n_tokens):
    p = build_prompt(model, QUESTION, system=lp.MATH_SYSTEM_PROMPT, filler=Filler.random_sentence(n_tokens, seed=3))
    check_spans(model, p)
    assert len(p.positions("filler")) == n_tokens
    words = p.pieces["filler"].split(" ")
    assert all(w.isalpha() for w in words)


def test_random_sentence_matches_another_fillers_length(model):
    mless = build_prompt(model, QUESTION, filler=Filler.meaningless())
    n = len(mless.positions("filler"))
    rand = build_prompt(model, QUESTION, filler=Filler.random_sentence(n, seed=0))
    assert len(rand.positions("filler")) == n
    assert len(rand) == len(mless)


def test_random_sentence_deterministic_per_seed(model):
    tok = model.tokenizer
    a = Filler.random_sentence(20, seed=1).resolve(tok)
    assert a == Filler.random_sentence(20, seed=1).resolve(tok)
    others = {Filler.random_sentence(20, seed=s).resolve(tok) for s in (2, 3, 4)}
    assert a not in others and len(others) == 3


def test_build_prompt_takes_a_tokenizer(tiny):
    from_model = build_prompt(tiny, QUESTION, filler=Filler.meaningless(count=3))
    from_tok = build_prompt(tiny.tokenizer, QUESTION, filler=Filler.meaningless(count=3))
    assert from_tok.tokens.tolist() == from_model.tokens.tolist()
    assert from_tok.segments == from_model.segments


# ---------------------------------------------------------------- errors


def test_unknown_segment_name(tiny):
    p = build_prompt(tiny, QUESTION, system="s")
    for call in (lambda: p.positions("filler"), lambda: p.positions_except("filler"), lambda: p.positions("nope")):
        with pytest.raises(LensprobeError, match=r"unknown segment .* this prompt has segments \['system_prefix'"):
            call()
    with pytest.raises(LensprobeError, match="at least one segment name"):
        p.positions_except()


@pytest.mark.unchecked
@pytest.mark.parametrize("question", ["", "   \n", None])
def test_empty_question(tiny, question):
    with pytest.raises(LensprobeError, match="question is empty"):
        build_prompt(tiny, question)


@pytest.mark.unchecked
@pytest.mark.parametrize(
    "make",
    [lambda: Filler.meaningless(count=0), lambda: Filler.meaningless(count=-3),
     lambda: Filler.meaningful(count=0), lambda: Filler.meaningless(count=2.5)],
)
def test_filler_count_must_be_positive(make):
    with pytest.raises(LensprobeError, match="count: expected a whole number between 1 and 10,000,000"):
        make()


@pytest.mark.unchecked
def test_other_bad_fillers(tiny):
    with pytest.raises(LensprobeError, match="n_tokens: expected a whole number between 1 and 10,000,000, got 0"):
        Filler.random_sentence(0)
    with pytest.raises(LensprobeError, match="n_tokens: expected a whole number, got True"):
        Filler.random_sentence(True)
    with pytest.raises(LensprobeError, match="filler text is empty"):
        Filler.text("  ")
    with pytest.raises(LensprobeError, match="symbol/word is empty"):
        Filler.meaningless(symbol="")
    with pytest.raises(LensprobeError, match="must be a lensprobe Filler"):
        build_prompt(tiny, QUESTION, filler="/ / /")


def test_prompt_longer_than_context(tiny):
    assert tiny.cfg.n_ctx == 256
    with pytest.raises(LensprobeError, match=r"prompt is \d+ tokens but the model's context is 256"):
        build_prompt(tiny, QUESTION, filler=Filler.meaningless(count=300))


def test_chat_without_template():
    bare = tiny_model(chat_template=False)
    assert not bare.tokenizer.chat_template
    with pytest.raises(LensprobeError, match="no chat template: pass chat=False"):
        build_prompt(bare, QUESTION, filler=Filler.meaningless(count=3))
    p = build_prompt(bare, QUESTION, filler=Filler.meaningless(count=3), chat=False)
    check_spans(bare, p)


@pytest.mark.unchecked
def test_bad_placement(tiny):
    with pytest.raises(LensprobeError, match="unknown placement 'middle': use one of"):
        build_prompt(tiny, QUESTION, filler=Filler.meaningless(), placement="middle")
