"""Prompts for each family: the paper format's token ids equal what the authors' scripts feed (one call of
the model's own tokenizer on instruction + filler + problem, BOS as that tokenizer adds it), and the chat
format equals ``tokenizer.apply_chat_template`` with the family's published template."""

import pytest

import lensprobe as lp
from lensprobe.core.prompts.assembly import FILLER_SEP
from lensprobe.core.prompts.conditions import paper_conditions

PROBLEM = "What is 12+7? Find x if 2x+3=11."
# the authors' Python source: a plain (not formatted) string, so the model sees the doubled braces
AUTHORS_INSTRUCTION = "Please reason step by step and put your final answer within \\boxed{{}}."
AUTHORS_FILLERS = {"w/o": "", "w/ Mless": " ".join(["/"] * 55), "w/ Mful": " ".join(["he"] * 55)}


@pytest.mark.parametrize("condition", list(AUTHORS_FILLERS))
def test_paper_format_ids_equal_the_authors_one_tokenizer_call(fam, condition):
    built = paper_conditions(prompt_format="paper")[condition].prompt_builder(fam.model)(PROBLEM)
    text = AUTHORS_INSTRUCTION + AUTHORS_FILLERS[condition] + PROBLEM
    want = fam.tokenizer(text).input_ids  # AutoTokenizer.from_pretrained(folder), as in their scripts
    assert built.text == text
    assert built.tokens[0].tolist() == want
    assert (want[0] == fam.tokenizer.bos_token_id) == (fam.family.bos is not None)  # Llama, Gemma: one BOS


@pytest.mark.parametrize("filler", [None, lp.Filler.meaningless()])
def test_chat_format_equals_apply_chat_template(fam, filler):
    built = lp.build_prompt(fam.model, PROBLEM, system=lp.MATH_SYSTEM_PROMPT, filler=filler)
    user = PROBLEM if filler is None else filler.resolve(fam.tokenizer) + FILLER_SEP + PROBLEM
    messages = [{"role": "system", "content": lp.MATH_SYSTEM_PROMPT}, {"role": "user", "content": user}]
    text = fam.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = fam.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert built.text == text
    assert built.tokens[0].tolist() == list(ids)
    assert fam.tokenizer.decode(built.tokens[0].tolist()[built.positions("question")[0]:]).startswith(PROBLEM)
