"""The demo's arithmetic evaluation section: the arithmetic set under w/o, w/ Mless, w/ Mful, each
answer read as the last number of its generation, and the page says so."""

import lensprobe as lp
from lensprobe.app.sections import evals as eval_sections
from lensprobe.evals.grading.extract import extract_last_number


def test_arithmetic_section_grades_the_last_number(tiny):
    sec = eval_sections.build_arithmetic_section(tiny, quick=True)
    assert sec.title == eval_sections.ARITHMETIC_TITLE
    answers = sec.tables["answers"]
    assert list(dict.fromkeys(answers["condition"])) == ["w/o", "w/ Mless", "w/ Mful"]  # the tiny model: no ARM preset
    expected = {p.id: p for p in lp.evals.arithmetic_problems(n=2, seed=0)}
    assert set(answers["problem_id"]) == set(expected)
    for _, row in answers.iterrows():
        assert row["answer"] == expected[row["problem_id"]].answer
        prediction = None if row["prediction"] != row["prediction"] else row["prediction"]
        assert prediction == extract_last_number(row["generation"])
    assert "last number of the generated text" in sec.intro and "ARM is left out" in sec.intro
    assert "last <code>\\boxed{...}</code>" not in sec.intro
