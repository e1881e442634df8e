"""Prompt formats of the built-in conditions, and ARM condition names."""

import pytest
from oracles import authors_tokenizer

import lensprobe as lp
from lensprobe.core.prompts.conditions import (
    BUILTIN_CONDITIONS,
    Condition,
    arm_base,
    builtin_condition,
    canonical_condition_name,
    paper_conditions,
    resolve_conditions,
    with_arm,
)
from lensprobe.core.prompts.prompt import MATH_SYSTEM_PROMPT, PAPER_SYSTEM_PROMPT
from lensprobe.interventions.arm import ARM

MLESS = " ".join(["/"] * 55)
MFUL = " ".join(["he"] * 55)
Q = "What is 3+4?"


def test_paper_format_builds_the_authors_strings(tiny):
    conds = paper_conditions(prompt_format="paper")
    assert list(conds) == ["w/o", "w/ Mless", "w/ Mful", "random sentence"]
    texts = {name: c.prompt_builder(tiny)(Q).text for name, c in conds.items()}
    assert texts["w/o"] == PAPER_SYSTEM_PROMPT + Q
    assert texts["w/ Mless"] == PAPER_SYSTEM_PROMPT + MLESS + Q
    assert texts["w/ Mful"] == PAPER_SYSTEM_PROMPT + MFUL + Q
    rand = conds["random sentence"].prompt_builder(tiny)(Q)
    assert rand.text.startswith(PAPER_SYSTEM_PROMPT) and rand.text.endswith(Q)
    n_mless = len(tiny.tokenizer.encode(MLESS, add_special_tokens=False))
    assert len(tiny.tokenizer.encode(rand.pieces["filler"], add_special_tokens=False)) == n_mless
    own = authors_tokenizer(tiny.tokenizer.name_or_path)  # the authors' AutoTokenizer.from_pretrained(name)
    for name, c in conds.items():
        p = c.prompt_builder(tiny)(Q)
        assert p.tokens[0].tolist() == own(p.text).input_ids, name
        assert p.tokens[0, 0].item() != tiny.tokenizer.bos_token_id, name  # not the bridge tokenizer's BOS
    # the description (and so the condition hash) shows the raw string
    assert conds["w/ Mless"].describe(tiny)["prompt_template"] == PAPER_SYSTEM_PROMPT + MLESS + "{question}"


@pytest.mark.unchecked
def test_chat_format_is_the_default_and_unchanged(tiny):
    chat = paper_conditions()
    assert chat == paper_conditions(prompt_format="chat") == BUILTIN_CONDITIONS
    assert all(c.system == MATH_SYSTEM_PROMPT and c.template is None for c in chat.values())
    assert "<|im_start|>" in chat["w/o"].prompt_builder(tiny)(Q).text
    assert paper_conditions(prompt_format="paper", system=None)["w/o"].prompt_builder(tiny)(Q).text == Q
    with pytest.raises(lp.LensprobeError, match=r"unknown prompt format 'exact': use one of \('chat', 'paper'\)"):
        paper_conditions(prompt_format="exact")
    with pytest.raises(lp.LensprobeError, match="unknown template 'jinja'"):
        Condition("x", template="jinja")
    with pytest.raises(lp.LensprobeError, match="joiner applies to template='raw' only"):
        Condition("x", joiner=" ")


def test_raw_condition_with_a_joiner(tiny):
    cond = Condition("joined", system="Sys", filler=lp.Filler.meaningless(count=2), template="raw", joiner="\n")
    assert cond.prompt_builder(tiny)(Q).text == "Sys\n/ /\n" + Q


@pytest.mark.parametrize(("spelling", "name", "base"), [
    ("ARM", "ARM", "w/o"), ("arm", "ARM", "w/o"), ("w/o+ARM", "ARM", "w/o"), ("none+arm", "ARM", "none"),
    ("w/ Mless+ARM", "w/ Mless+ARM", "w/ Mless"), ("meaningless +ARM", "w/ Mless+ARM", "meaningless"),
    ("random sentence+ARM", "random sentence+ARM", "random sentence"),
])
def test_arm_names(spelling, name, base):
    assert canonical_condition_name(spelling) == name
    assert arm_base(spelling) == base


def test_resolve_arm_names_attaches_the_arm():
    arm = ARM(c=0.5, percentile=95)
    conds = resolve_conditions("w/o,ARM,w/ Mless+ARM", arm=arm)
    assert [c.name for c in conds] == ["w/o", "ARM", "w/ Mless+ARM"]
    assert conds[1].interventions == (arm,) and conds[1].filler is None
    assert conds[2].interventions == (arm,) and conds[2].filler == builtin_condition("w/ Mless").filler
    # paper-format built-ins are the base of "+ARM" names too
    paper = resolve_conditions("w/ Mless+ARM", builtins=paper_conditions(prompt_format="paper"), arm=arm)
    assert paper[0].system == PAPER_SYSTEM_PROMPT and paper[0].template == "raw"
    # a factory is called once, only when an ARM name is given
    calls = []

    def make():
        calls.append(1)
        return arm

    resolve_conditions("w/o", arm=make)
    assert calls == []
    resolve_conditions("ARM,w/ Mful+ARM", arm=make)
    assert calls == [1]
    with pytest.raises(lp.LensprobeError, match=r"repeated: \['ARM'\]"):
        resolve_conditions("ARM,w/o+ARM", arm=arm)


def test_arm_names_without_an_arm_say_how_to_pass_one():
    with pytest.raises(lp.LensprobeError, match=r"condition 'w/ Mless\+ARM' needs ARM settings: pass "
                                                r"arm=lp\.ARM\(c=\.\.\., percentile=\.\.\.\)"):
        resolve_conditions("w/ Mless+ARM")
    with pytest.raises(lp.LensprobeError, match="unknown condition 'bogus'"):
        resolve_conditions("bogus+ARM", arm=ARM(c=0.5, percentile=95))


@pytest.mark.unchecked
def test_with_arm():
    arm = ARM(c=0.5, percentile=95)
    assert with_arm(builtin_condition("w/o"), arm).name == "ARM"
    mine = with_arm(builtin_condition("w/ Mful"), arm, name="mful arm")
    assert mine.name == "mful arm" and mine.interventions == (arm,)
    with pytest.raises(lp.LensprobeError, match="with_arm needs a lensprobe Condition, got str"):
        with_arm("w/o", arm)
