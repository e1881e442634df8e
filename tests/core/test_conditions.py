"""The one vocabulary of conditions: canonical names, aliases, the paper's conditions with other filler
settings, binding interventions, and stable JSON descriptions."""

import hashlib
import json

import pytest

import lensprobe as lp
from lensprobe.core.hooks.capabilities import bind_interventions
from lensprobe.core.prompts.conditions import (
    BUILTIN_CONDITIONS,
    MatchedRandomSentence,
    builtin_condition,
    canonical_condition_name,
    paper_conditions,
    resolve_conditions,
)
from lensprobe.core.storage.identity import identity
from lensprobe.core.storage.jsonable import json_digest, stable_repr, to_jsonable


@pytest.mark.parametrize(("spelling", "name"), [
    ("w/o", "w/o"), ("none", "w/o"), (" Without ", "w/o"), ("baseline", "w/o"),
    ("w/ Mless", "w/ Mless"), ("meaningless", "w/ Mless"), ("Mless", "w/ Mless"), ("w/mless", "w/ Mless"),
    ("w/ Mful", "w/ Mful"), ("meaningful", "w/ Mful"), ("MFUL", "w/ Mful"),
    ("random sentence", "random sentence"), ("random", "random sentence"), ("random_sentence", "random sentence"),
    ("my own condition", "my own condition"), ("  spaced  ", "spaced"),
])
def test_canonical_names_and_aliases(spelling, name):
    assert canonical_condition_name(spelling) == name


def test_builtin_conditions_are_the_paper_conditions():
    assert list(BUILTIN_CONDITIONS) == ["w/o", "w/ Mless", "w/ Mful", "random sentence"]
    assert paper_conditions() == BUILTIN_CONDITIONS
    assert BUILTIN_CONDITIONS["w/ Mless"].filler == lp.Filler.meaningless()
    assert BUILTIN_CONDITIONS["w/ Mful"].filler == lp.Filler.meaningful()
    assert BUILTIN_CONDITIONS["random sentence"].filler == MatchedRandomSentence()
    assert builtin_condition("meaningless") is BUILTIN_CONDITIONS["w/ Mless"]
    with pytest.raises(lp.LensprobeError, match="unknown condition 'loud'"):
        builtin_condition("loud")


def test_paper_conditions_with_other_filler_settings(tiny):
    conds = paper_conditions(count=4, symbol="#", word="it", seed=3, system=None)
    prompts = {name: c.prompt_builder(tiny)("What is 12+7?") for name, c in conds.items()}
    assert prompts["w/ Mless"].pieces["filler"] == "# # # #"
    assert prompts["w/ Mful"].pieces["filler"] == "it it it it"
    assert "system" not in prompts["w/o"].segments
    n = len(prompts["w/ Mless"].positions("filler"))
    assert len(prompts["random sentence"].positions("filler")) == n
    assert conds["random sentence"].filler == MatchedRandomSentence(reference=lp.Filler.meaningless("#", 4), seed=3)


def test_resolve_conditions_takes_aliases_and_other_builtins():
    short = paper_conditions(count=5)
    got = resolve_conditions("none, meaningless,random", builtins=short)
    assert [c.name for c in got] == ["w/o", "w/ Mless", "random sentence"]
    assert got[1] is short["w/ Mless"]
    assert [c.name for c in resolve_conditions(["w/ Mful", lp.Condition("mine")])] == ["w/ Mful", "mine"]
    with pytest.raises(lp.LensprobeError, match="unique"):
        resolve_conditions("w/o, none")
    with pytest.raises(lp.LensprobeError, match="unknown condition"):
        resolve_conditions("w/o, loud", builtins=short)


def test_fingerprint_is_the_sha256_of_the_sorted_description(tiny):
    cond = lp.Condition("ablated", interventions=(lp.ablate_heads("L0H1"),))
    blob = json.dumps(cond.describe(tiny), sort_keys=True, separators=(",", ":")).encode()
    assert cond.fingerprint(tiny) == hashlib.sha256(blob).hexdigest()[:16]
    assert json_digest({"b": 1, "a": [1, 2]}) == json_digest({"a": [1, 2], "b": 1})
    assert cond.describe(tiny)["interventions"] == [identity(cond.interventions[0])]  # by content, not repr


def test_stable_repr_has_no_addresses():
    def fn(x):
        return x

    class Thing:
        pass

    assert stable_repr(fn) == f"{__name__}.test_stable_repr_has_no_addresses.<locals>.fn"
    assert " at 0x" not in stable_repr(Thing())
    assert stable_repr(lp.ablate_heads("L0H3")) == repr(lp.ablate_heads("L0H3"))


def test_bind_interventions(tiny):
    p = lp.build_prompt(tiny, "What is 12+7?")
    plain = lp.ablate_heads("L0H1")
    by_segment = lp.ablate_heads("L0H1", positions="question")
    bound, changed = bind_interventions((plain,), p)
    assert bound == (plain,) and not changed
    bound, changed = bind_interventions((plain, by_segment), p)
    assert changed and bound[0] is plain and bound[1] is not by_segment
    assert bound[1].positions.fixed == frozenset(p.positions("question"))


def test_to_jsonable_without_importing_pandas_for_plain_values():
    import torch

    assert to_jsonable({"x": torch.tensor([1.0, float("nan")]), 2: (1, 2)}) == {"x": [1.0, None], "2": [1, 2]}
    import pandas as pd  # a dependency of lensprobe
    assert to_jsonable([pd.NA, pd.NaT]) == [None, None]
    with pytest.raises(lp.LensprobeError, match="cannot write object"):
        to_jsonable(object())
