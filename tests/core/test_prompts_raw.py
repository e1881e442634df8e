"""The raw prompt template: the meaningless-tokens authors' string, tokenized in one call."""

import json

import pytest
from oracles import authors_tokenizer

import lensprobe as lp
from lensprobe.core.prompts.prompt import MATH_SYSTEM_PROMPT, PAPER_SYSTEM_PROMPT

MLESS = " ".join(["/"] * 55)


def _problems(path, limit=None):
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [r["problem"] for r in rows[:limit]]


def _check_raw(model, problem, filler):
    tokenizer = authors_tokenizer(getattr(model, "tokenizer", model).name_or_path)
    p = lp.build_prompt(model, problem, system=PAPER_SYSTEM_PROMPT, filler=filler, template="raw")
    expected_text = PAPER_SYSTEM_PROMPT + (MLESS if filler is not None else "") + problem
    assert p.text == expected_text
    assert p.tokens[0].tolist() == tokenizer(expected_text).input_ids
    assert p.str_tokens == [tokenizer.decode([i]) for i in tokenizer(expected_text).input_ids]
    # the segments tile the prompt in order
    spans = list(p.segments.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(p)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    return p


def test_paper_system_prompt_is_the_authors_literal_string():
    assert PAPER_SYSTEM_PROMPT == "Please reason step by step and put your final answer within \\boxed{{}}."
    assert "{{}}" in PAPER_SYSTEM_PROMPT and "step," not in PAPER_SYSTEM_PROMPT
    assert MATH_SYSTEM_PROMPT != PAPER_SYSTEM_PROMPT


def test_chat_system_prompt_docstring_does_not_claim_to_be_the_papers():
    import lensprobe.core.prompts.prompt as prompts

    source = open(prompts.__file__, encoding="utf-8").read()
    doc = source.split("MATH_SYSTEM_PROMPT = ", 1)[1].split("PAPER_SYSTEM_PROMPT =", 1)[0]
    assert "not their literal string" in " ".join(doc.split())


def test_raw_ids_equal_the_tokenizer_on_math500_tiny(tiny, math500_path):
    tok = tiny.tokenizer  # the tokenizer, not the model: many problems exceed the tiny context
    for problem in _problems(math500_path, limit=100):
        for filler in (None, lp.Filler.meaningless()):
            _check_raw(tok, problem, filler)


def test_raw_ids_equal_the_tokenizer_on_every_math500_problem_smol(smol, math500_path):
    problems = _problems(math500_path)
    assert len(problems) == 500
    tok = smol.tokenizer
    # TransformerLens gives the bridge's tokenizer add_bos_token=True: it prepends <|im_start|>; SmolLM2's own
    # tokenizer (the authors' AutoTokenizer.from_pretrained) adds nothing, so neither does the raw prompt
    assert tok(PAPER_SYSTEM_PROMPT).input_ids[0] == tok.bos_token_id
    assert authors_tokenizer(tok.name_or_path)(PAPER_SYSTEM_PROMPT).input_ids[0] != tok.bos_token_id
    for problem in problems:
        without = _check_raw(smol, problem, None)
        with_f = _check_raw(smol, problem, lp.Filler.meaningless())
        assert len(without) == len(tok(without.text).input_ids) - 1  # one token fewer than the bridge's call
        assert list(with_f.segments)[:2] == ["system", "filler"] and with_f.segments["system"][0] == 0
        assert len(without.positions("question")) >= 1


def test_paper_format_of_the_embedded_model_is_the_authors_27_tokens(smol):
    """The authors' string without filler on SmolLM2: 27 tokens of one plain call, not the 28 of the bridge's
    tokenizer, which prepends <|im_start|>."""
    from lensprobe.core.prompts.conditions import paper_conditions

    question = "Compute 12 + 7 for me."
    built = paper_conditions(prompt_format="paper")["w/o"].prompt_builder(smol)(question)
    want = authors_tokenizer(smol.tokenizer.name_or_path)(PAPER_SYSTEM_PROMPT + question).input_ids
    assert built.tokens[0].tolist() == want
    assert len(built) == 27 and len(smol.tokenizer(built.text).input_ids) == 28
    assert smol.tokenizer.bos_token_id not in want


def test_smollm2_merges_the_final_dot_with_the_first_slash(smol):
    p = lp.build_prompt(smol, "What is 1+1?", system=PAPER_SYSTEM_PROMPT, filler=lp.Filler.meaningless(),
                        template="raw")
    n_sys = len(authors_tokenizer(smol.tokenizer.name_or_path)(PAPER_SYSTEM_PROMPT).input_ids)  # no BOS
    # "}." of the system prompt alone becomes "}" + "./" with the filler after it
    assert p.str_tokens[n_sys - 1:n_sys + 1] == ["}", "./"]
    assert p.segments["system"] == (0, n_sys + 1)
    assert p.straddling == (n_sys,)
    assert p.segment_of(n_sys) == "system"
    assert len(p.positions("filler")) == 54  # the first "/" went into the straddling token
    without = lp.build_prompt(smol, "What is 1+1?", system=PAPER_SYSTEM_PROMPT, template="raw")
    assert without.straddling == ()


def test_segments_and_straddling_by_hand_tiny(tiny):
    tok = tiny.tokenizer
    # the tiny tokenizer keeps "." and "/" apart but merges " " with "/" and " " with "What";
    # the bridge's tokenizer prepends its BOS token (<|im_start|>)
    assert [tok.decode([i]) for i in tok("./").input_ids] == ["<|im_start|>", ".", "/"]
    p = lp.build_prompt(tiny, "What?", system="Sys", filler=lp.Filler.meaningless(count=3),
                        template="raw", joiner=" ", add_special_tokens=True)  # the bridge's tokenizer, its BOS
    assert p.text == "Sys / / / What?"
    assert p.tokens[0].tolist() == tok(p.text).input_ids
    assert p.str_tokens == ["<|im_start|>", "S", "y", "s", " /", " /", " /", " What", "?"]
    # " /" starts in the joiner after the system prompt and ends in the filler;
    # " What" starts in the joiner after the filler and ends in the question
    assert p.segments == {"bos": (0, 1), "system": (1, 4), "system_sep": (4, 5), "filler": (5, 7),
                          "filler_sep": (7, 8), "question": (8, 9)}
    assert p.straddling == (4, 7)
    assert p.pieces == {"system": "Sys", "system_sep": " ", "filler": "/ / /", "filler_sep": " ",
                        "question": "What?"}
    assert lp.prompts.prompt_json(p)["straddling"] == [4, 7]


def test_raw_without_joiner_and_no_straddle_tiny(tiny):
    p = lp.build_prompt(tiny, "What?", system=PAPER_SYSTEM_PROMPT, filler=lp.Filler.meaningless(count=3),
                        template="raw")
    assert p.straddling == ()
    assert p.str_tokens[p.segments["filler"][0]:p.segments["filler"][1]] == ["/", " /", " /"]
    assert "".join(p.str_tokens[slice(*p.segments["question"])]) == "What?"
    assert "system_sep" not in p.segments and "filler_sep" not in p.segments
    # without filler and without straddling, dropping the filler lines the prompts up
    w = lp.build_prompt(tiny, "What?", system=PAPER_SYSTEM_PROMPT, template="raw")
    assert p.tokens[0, p.positions_except("filler")].tolist() == w.tokens[0].tolist()


@pytest.mark.parametrize(("placement", "order"), [
    ("between", ["system", "system_sep", "filler", "filler_sep", "question"]),
    ("before_system", ["filler", "filler_sep", "system", "system_sep", "question"]),
    ("after_question", ["system", "system_sep", "question", "filler_sep", "filler"]),
])
def test_raw_placements_name_the_joiners(tiny, placement, order):
    p = lp.build_prompt(tiny, "What?", system="Sys.", filler=lp.Filler.meaningless(count=2),
                        placement=placement, template="raw", joiner="\n", add_special_tokens=True)
    assert list(p.segments) == ["bos", *order]
    assert p.tokens[0].tolist() == tiny.tokenizer(p.text).input_ids
    own = lp.build_prompt(tiny, "What?", system="Sys.", filler=lp.Filler.meaningless(count=2),
                          placement=placement, template="raw", joiner="\n")
    assert list(own.segments) == order and own.tokens[0].tolist() == p.tokens[0, 1:].tolist()


def test_raw_adds_what_the_tokenizer_adds_by_itself(tiny):
    """The bridge's tokenizer prepends BOS (TransformerLens loads it with add_bos_token=True), the tiny
    model's own tokenizer does not: the raw prompt is the own tokenizer's one call, with or without the
    bridge; ``add_special_tokens=True`` asks for the bridge tokenizer's call."""
    from lensprobe.core.models.testing import tiny_tokenizer

    plain = tiny_tokenizer()
    own = authors_tokenizer(tiny.tokenizer.name_or_path)
    assert tiny.tokenizer("S").input_ids[0] == tiny.tokenizer.bos_token_id != own("S").input_ids[0]
    with_bos = lp.build_prompt(tiny, "What?", system="Sys", template="raw", add_special_tokens=True)
    without_bos = lp.build_prompt(plain, "What?", system="Sys", template="raw")
    default = lp.build_prompt(tiny, "What?", system="Sys", template="raw")
    assert default.tokens[0].tolist() == own(default.text).input_ids == without_bos.tokens[0].tolist()
    assert "bos" not in default.segments
    assert with_bos.tokens[0].tolist() == tiny.tokenizer(with_bos.text).input_ids
    assert without_bos.tokens[0].tolist() == plain(without_bos.text).input_ids
    assert with_bos.tokens[0, 0].item() == tiny.tokenizer.bos_token_id
    assert with_bos.tokens[0, 1:].tolist() == without_bos.tokens[0].tolist()
    assert with_bos.segments["bos"] == (0, 1) and with_bos.segments["system"][0] == 1
    assert "bos" not in without_bos.segments and without_bos.segments["system"][0] == 0


def test_raw_without_special_tokens_equals_the_plain_tokenizer(tiny):
    from lensprobe.core.models.testing import tiny_tokenizer

    plain = tiny_tokenizer()
    p = lp.build_prompt(tiny, "What?", system="Sys", filler=lp.Filler.meaningless(count=3), template="raw",
                        add_special_tokens=False)
    assert p.tokens[0].tolist() == plain(p.text).input_ids == tiny.tokenizer(p.text, add_special_tokens=False).input_ids
    assert "bos" not in p.segments and p.segments["system"][0] == 0
    with pytest.raises(lp.LensprobeError, match="add_special_tokens=False applies to template='raw' only"):
        lp.build_prompt(tiny, "What?", add_special_tokens=False)


@pytest.mark.unchecked
def test_chat_stays_the_default_and_template_names_are_checked(tiny):
    default = lp.build_prompt(tiny, "What?", system="Sys")
    chat = lp.build_prompt(tiny, "What?", system="Sys", template="chat")
    plain = lp.build_prompt(tiny, "What?", system="Sys", template="plain")
    assert default.tokens.tolist() == chat.tokens.tolist()
    assert plain.tokens.tolist() == lp.build_prompt(tiny, "What?", system="Sys", chat=False).tokens.tolist()
    with pytest.raises(lp.LensprobeError, match=r"unknown template 'paper'.*'chat', 'plain', 'raw'"):
        lp.build_prompt(tiny, "What?", template="paper")
    with pytest.raises(lp.LensprobeError, match="joiner=' ' applies to template='raw' only"):
        lp.build_prompt(tiny, "What?", joiner=" ")


def test_raw_prompt_longer_than_the_context_is_refused(tiny):
    with pytest.raises(lp.LensprobeError, match="context is 256"):
        lp.build_prompt(tiny, "x " * 400, template="raw")
