"""Control tokens are checked on a prompt's final token ids: a control token id the template did not place
itself is refused under ``special_tokens="refuse"`` (naming the pieces its characters came from) and absent
under ``"escape"``, also when its text is split across pieces that the ``"raw"`` template joins into one
string; answers and target tokens given as text are refused the same way; a refused prompt is never
reported as too long; an ordinary prompt's ids are what they were."""

import string

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import authors_tokenizer

import lensprobe as lp
from lensprobe.core.errors import ContextLengthError
from lensprobe.core.prompts.special import check_control_ids, text_ids

END, START, EOT = "<|im_end|>", "<|im_start|>", "<|endoftext|>"
PROPS = settings(max_examples=30, deadline=None)
SAFE = st.text(alphabet=string.ascii_letters + string.digits + " /.?", max_size=6)  # never spells a control token
SCAFFOLD = ("bos", "system_prefix", "user_prefix", "assistant_prefix")

# Raw layouts: placement, joiner, and the pieces in the order the raw template joins them, by segment name.
RAW_LAYOUTS = [
    ("between", " ", ["system", "system_sep", "filler", "filler_sep", "question"]),
    ("between", "", ["system", "filler", "question"]),
    ("after_question", "\n", ["system", "system_sep", "question", "filler_sep", "filler"]),
    ("before_system", "", ["filler", "system", "question"]),
    ("between", "", ["system", "question"]),
]
# Chat and plain layouts: placement and the two user's pieces next to each other in the template (each is
# tokenized on its own, a "\n" segment between them).
CHAT_LAYOUTS = [("between", ("filler", "question")), ("after_question", ("question", "filler")),
                ("before_system", ("filler", "system"))]
LABEL = {"system": "system prompt", "filler": "filler", "question": "question",
         "system_sep": "joiner (system_sep)", "filler_sep": "joiner (filler_sep)"}


def control_ids(tiny) -> set[int]:
    return set(tiny.tokenizer.convert_tokens_to_ids([END, START, EOT]))


def split_texts(names, a: str, b: str, left: str, right: str, pad: list[str], joiner: str) -> dict[str, str]:
    """Each piece's text (``"joiner"``: the one joiner), ``left`` ending piece ``a`` and ``right`` opening piece
    ``b``; the other characters are ordinary (``pad``)."""
    texts = {name: name[0].upper() + pad[i % len(pad)] for i, name in enumerate(n for n in names if "_sep" not in n)}
    texts["joiner"] = joiner
    a, b = ("joiner" if a.endswith("_sep") else a), ("joiner" if b.endswith("_sep") else b)
    texts[a], texts[b] = texts[a] + left, right + texts[b]
    return texts


def build(tiny, texts: dict[str, str], placement: str, template: str, **kw):
    filler = lp.Filler.text(texts["filler"]) if "filler" in texts else None
    return lp.build_prompt(tiny, texts["question"], system=texts.get("system"), filler=filler, placement=placement,
                           template=template, joiner=texts.get("joiner", ""), **kw)


@PROPS
@given(token=st.sampled_from([END, START, EOT]), layout=st.sampled_from(RAW_LAYOUTS), data=st.data(),
       pad=st.lists(SAFE, min_size=3, max_size=3))
def test_raw_a_control_token_split_at_every_position_across_pieces_is_refused_and_escaped(tiny, token, layout, data,
                                                                                           pad):
    placement, joiner, order = layout
    at = data.draw(st.integers(0, len(order) - 2), label="boundary")
    a, b = order[at], order[at + 1]
    for cut in range(len(token) + 1):
        texts = split_texts(order, a, b, token[:cut], token[cut:], pad, joiner)
        with pytest.raises(lp.LensprobeError, match="special_tokens='escape'") as refused:
            build(tiny, texts, placement, "raw")
        message = str(refused.value)
        assert repr(token) in message and "context" not in message
        if 0 < cut < len(token):  # only the final ids show it: named by both pieces it came from
            assert f"made from the text of the {LABEL[a]} and the {LABEL[b]}" in message, message
        p = build(tiny, texts, placement, "raw", special_tokens="escape")
        ids = p.tokens[0].tolist()
        placed = range(*p.segments.get("bos", (0, 0)))  # the BOS token the tokenizer adds
        text_ids = [ids[i] for i in range(len(ids)) if i not in placed]
        assert not set(text_ids) & control_ids(tiny)
        assert tiny.tokenizer.decode(text_ids) == p.text and token in p.text


@PROPS
@given(token=st.sampled_from([END, START, EOT]), layout=st.sampled_from(CHAT_LAYOUTS),
       pad=st.lists(SAFE, min_size=3, max_size=3), template=st.sampled_from(["chat", "plain"]))
def test_chat_a_control_token_split_across_pieces_never_reaches_the_ids(tiny, token, layout, pad, template):
    placement, (a, b) = layout
    for cut in range(len(token) + 1):
        texts = split_texts(["system", "filler", "question"], a, b, token[:cut], token[cut:], pad, "")
        del texts["joiner"]
        for mode in ("refuse", "escape"):
            if cut in (0, len(token)) and mode == "refuse":  # the whole token in one piece: its text is refused
                with pytest.raises(lp.LensprobeError, match=rf"holds {token!r}".replace("|", r"\|")):
                    build(tiny, texts, placement, template)
                continue
            p = build(tiny, texts, placement, template, special_tokens=mode)
            ids = p.tokens[0].tolist()
            user = [i for name, (s, e) in p.segments.items() if name not in SCAFFOLD for i in range(s, e)]
            assert not {ids[i] for i in user} & control_ids(tiny), (mode, cut, p.str_tokens)
            for name in ("system", "filler", "question"):
                assert tiny.tokenizer.decode(p.tokens[0, p.positions(name)].tolist()) == texts[name]


ORDINARY = st.text(alphabet=string.printable.replace("|", ""), min_size=1, max_size=40).filter(lambda s: s.strip())


@PROPS
@given(question=ORDINARY, system=ORDINARY, template=st.sampled_from(["chat", "plain", "raw"]),
       filler=st.sampled_from([None, "/ / /", "he he"]))
def test_an_ordinary_prompts_ids_are_unchanged_bit_for_bit(tiny, question, system, template, filler):
    kw = dict(system=system, filler=None if filler is None else lp.Filler.text(filler), template=template)
    checked = lp.build_prompt(tiny, question, **kw)
    unchecked = lp.build_prompt(tiny, question, special_tokens="allow", **kw)  # "allow" checks nothing
    assert torch.equal(checked.tokens, unchecked.tokens) and checked.segments == unchecked.segments
    if template == "raw":
        expected = authors_tokenizer(tiny.tokenizer.name_or_path)(checked.text).input_ids
    else:
        expected = [i for text in checked.pieces.values() for i in tiny.tokenizer.encode(text, add_special_tokens=False)]
    assert checked.tokens[0].tolist() == expected


def test_a_joiner_that_is_a_control_token_is_refused_naming_it(tiny):
    with pytest.raises(lp.LensprobeError, match=r"the control token '<\|im_end\|>' \(id 2, at position 2\), made "
                                                r"from the text of the joiner \(system_sep\): .*special_tokens='escape'"):
        lp.build_prompt(tiny, "What?", system="S.", template="raw", joiner=END)
    p = lp.build_prompt(tiny, "What?", system="S.", template="raw", joiner=END, special_tokens="escape")
    assert 2 not in p.tokens[0].tolist() and p.text == f"S.{END}What?"
    allowed = lp.build_prompt(tiny, "What?", system="S.", template="raw", joiner=END, special_tokens="allow")
    own = authors_tokenizer(tiny.tokenizer.name_or_path)
    assert allowed.tokens[0].tolist() == own(allowed.text).input_ids and 2 in allowed.tokens[0].tolist()


class SplitIgnored:
    """A tokenizer that does not honour ``split_special_tokens``: escaping through it fails."""

    def __init__(self, tok):
        self.tok = tok

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def __call__(self, text, **kw):
        kw.pop("split_special_tokens", None)
        return self.tok(text, **kw)

    def encode(self, text, **kw):
        kw.pop("split_special_tokens", None)
        return self.tok.encode(text, **kw)


@pytest.mark.parametrize("template", ["chat", "raw"])
def test_escaping_that_fails_is_refused_after_checking_the_ids_again(tiny, template):
    with pytest.raises(lp.LensprobeError, match=r"special_tokens='escape' left the control token '<\|im_end\|>' "
                                                r"\(id 2, at position \d+\), made from the text of the question, in "
                                                "the prompt's token ids: .*Rewrite that text"):
        lp.build_prompt(SplitIgnored(tiny.tokenizer), f"Say {END}", template=template, special_tokens="escape")
    assert lp.build_prompt(SplitIgnored(tiny.tokenizer), "Say it", template=template, special_tokens="escape")


def test_the_unknown_token_is_refused_only_when_the_text_spells_it(tiny):
    tok = tiny.tokenizer  # its unknown token is <|endoftext|> (id 0)
    check_control_ids(tok, [5, 0], lambda pos: (("question",), "\u00e9"), "refuse")  # a character it lacks
    with pytest.raises(lp.LensprobeError, match=r"'<\|endoftext\|>' \(id 0, at position 1\)"):
        check_control_ids(tok, [5, 0], lambda pos: (("question",), EOT), "refuse")
    check_control_ids(tok, [1, 2], lambda pos: None, "refuse")  # the template's own


def test_a_refused_prompt_is_not_reported_as_too_long(tiny):
    long = " word" * 300
    with pytest.raises(lp.LensprobeError, match="made from the text of the system prompt and the question") as err:
        lp.build_prompt(tiny, "end|>" + long, system="S <|im_", template="raw")
    assert not isinstance(err.value, ContextLengthError) and "context" not in str(err.value)
    with pytest.raises(lp.LensprobeError, match="the question holds") as err:
        lp.build_prompt(tiny, f"Q {END}", filler=lp.Filler.random_sentence(1000))
    assert "context" not in str(err.value)
    with pytest.raises(ContextLengthError, match="the model's context is 256"):
        lp.build_prompt(tiny, long, template="raw")
    with pytest.raises(ContextLengthError, match="longer than the model's context"):
        lp.build_prompt(tiny, "Q", filler=lp.Filler.random_sentence(1000))


def test_a_recipe_condition_whose_prompts_are_refused_says_why_not_too_long(tiny):
    from lensprobe.app.reproduce_tables import check_fits

    problems = [lp.evals.Problem("a", f"What is 2+3? {END}", "5")]
    with pytest.raises(lp.LensprobeError, match=r"condition 'w/o' builds no prompt the model can run, so every row "
                                                r"would fail; the first refused, problem 'a': the question holds") as e:
        check_fits(tiny, "math500", problems, [lp.Condition("w/o")], {"max_new_tokens": 2})
    assert "context" not in str(e.value)
    check_fits(tiny, "math500", problems + [lp.evals.Problem("b", "What is 1+1?", "2")], [lp.Condition("w/o")],
               {"max_new_tokens": 2})  # one prompt fits: the refused one becomes an error row of the run


@pytest.mark.parametrize("answer", [END, f" 5{END}", f"{START}assistant"])
def test_an_answer_given_as_text_that_holds_a_control_token_is_refused(tiny, answer):
    prompt = lp.build_prompt(tiny, "What is 2+3?")
    token = answer[answer.index("<"):answer.index(">") + 1]
    with pytest.raises(lp.LensprobeError, match=rf"the answer {answer!r} holds the control token {token!r}".replace(
            "|", r"\|") + r" \(id \d\): .*give token ids"):
        lp.experiments.ablation_sweep(tiny, prompt, "logprob", answers=answer, heads="L0H0", progress=False)
    with pytest.raises(lp.LensprobeError, match=r"the answer .* holds the control token"):
        lp.experiments.patch(tiny, prompt, prompt, "blocks.0.hook_resid_post", metric="logprob", answer=answer)
    with pytest.raises(lp.LensprobeError, match=r"the continuation .* holds the control token"):
        lp.experiments.ablation_sweep(tiny, prompt, "entropy", continuation=answer, heads="L0H0", progress=False)
    with pytest.raises(lp.LensprobeError, match=r"the answer .* holds the control token"):
        lp.metrics.AnswerLogProb(answer).inputs(tiny, prompt)


def test_a_target_token_given_as_text_is_refused_and_its_id_is_taken(tiny):
    prompt = lp.build_prompt(tiny, "What is 2+3?")
    with pytest.raises(lp.LensprobeError, match=r"the token '<\|im_end\|>' holds the control token '<\|im_end\|>' "
                                                r"\(id 2\): .*\(here 2\)"):
        lp.experiments.ablation_sweep(tiny, prompt, "logit_diff", tokens=(END, "5"), heads="L0H0", progress=False)
    by_id = lp.experiments.ablation_sweep(tiny, prompt, "logit_diff", tokens=(2, "5"), heads="L0H0", progress=False)
    logits = tiny(prompt.tokens)[0, -1]
    five = tiny.tokenizer.encode("5", add_special_tokens=False)[0]
    assert by_id.baseline.tolist() == pytest.approx([(logits[2] - logits[five]).item()], abs=1e-4)
    forced = lp.experiments.ablation_sweep(tiny, prompt, "entropy", continuation=[5, 2], heads="L0H0", progress=False)
    assert forced.ablated.shape == (1, 1)  # token ids: the control token is meant
    assert text_ids(tiny.tokenizer, " 5", "the answer") == tiny.tokenizer.encode(" 5", add_special_tokens=False)


def test_an_evaluation_records_a_control_token_made_across_pieces_as_an_error_row(tiny):
    problems = [lp.evals.Problem("a", "end|> What is 2+3?", "5"), lp.evals.Problem("b", "What is 1+1?", "2")]
    raw = lp.Condition("raw", system="Answer. <|im_", template="raw")
    with pytest.warns(lp.evals.running.execute.ErrorRowsWarning, match="made from the text of the system prompt "
                                                                       "and the question"):
        rows = lp.evaluate(tiny, problems, [raw], max_new_tokens=2, progress=False)
    by_id = rows.set_index("problem_id")
    assert by_id["finish"].eq("error").to_dict() == {"a": True, "b": False}
    assert "special_tokens='escape'" in by_id.loc["a", "error"]
    escaping = lp.Condition("raw escaped", system="Answer. <|im_", template="raw", special_tokens="escape")
    assert not lp.evaluate(tiny, problems, [escaping], max_new_tokens=2, progress=False)["finish"].eq("error").any()


@pytest.mark.parametrize("name", ["qwen2", "llama3", "gemma3"])
def test_each_familys_end_of_turn_split_across_raw_pieces_is_refused_per_its_tokenizer(name):
    from lensprobe.core.models.families import tiny_family_tokenizer
    from lensprobe.core.prompts.special import control_ids as ids_of

    tok = tiny_family_tokenizer(name)
    end = str(tok.eos_token)  # <|im_end|>, <|eot_id|>, <end_of_turn>
    half = len(end) // 2
    with pytest.raises(lp.LensprobeError, match=rf"the control token {end!r} \(id {tok.eos_token_id}, ".replace(
            "|", r"\|") + "at position \\d+\\), made from the text of the system prompt and the question"):
        lp.build_prompt(tok, end[half:] + " What?", system="S " + end[:half], template="raw")
    p = lp.build_prompt(tok, end[half:] + " What?", system="S " + end[:half], template="raw", special_tokens="escape")
    start = p.segments.get("bos", (0, 0))[1]  # after the BOS token the tokenizer adds, if any
    assert not set(p.tokens[0, start:].tolist()) & ids_of(tok)
    assert tok.decode(p.tokens[0, start:].tolist()) == p.text == f"S {end} What?"


def test_the_command_line_refuses_an_answer_holding_a_control_token_in_one_line(tmp_path, capsys):
    from lensprobe.app.cli import main

    argv = ["sweep", "--model", "tiny", "--question", "What is 2+3?", "--metric", "logprob", "--answer", f" 5{END}",
            "--heads", "L0H0", "--out", str(tmp_path / "s"), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the answer ' 5{END}' holds the control token '{END}' (id 2)" in err
    assert not (tmp_path / "s").exists()


def test_resuming_a_row_written_before_its_prompt_was_refused_names_the_row(tiny, tmp_path, monkeypatch):
    import lensprobe.core.prompts.assembly as assembly

    problems = [lp.evals.Problem("a", "end|> What is 2+3?", "5")]
    raw = lp.Condition("raw", system="Answer. <|im_", template="raw")
    with monkeypatch.context() as before:  # the final ids unchecked, as when the row was written
        before.setattr(assembly, "check_control_ids", lambda *a: None)
        first = lp.evaluate(tiny, problems, [raw], max_new_tokens=2, progress=False, out=tmp_path / "run")
    assert first["finish"].ne("error").all()
    with pytest.raises(lp.LensprobeError, match=r"holds the row of condition 'raw', problem 'a', sample 0, whose "
                                                r"prompt this run refuses \(the prompt's token ids hold the control "
                                                r"token '<\|im_end\|>'.*\)\. Use a new output folder"):
        lp.evaluate(tiny, problems, [raw], max_new_tokens=2, progress=False, out=tmp_path / "run")
