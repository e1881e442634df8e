"""The demo report (``lensprobe demo``) and the sections each study registers for it.

The report always holds the MATH-500 evaluation section: a missing data file makes the demo fail
with a message that names the file, never a report with a section left out.
"""

import json
import re

import pandas as pd
import pytest
import torch

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.app.demo import DEMO_SECTIONS, run_demo
from lensprobe.app.sections import evals as eval_sections
from lensprobe.app.sections import filler as filler_sections
from lensprobe.app.sections import heads as head_sections
from lensprobe.app.sections import thinking as thinking_sections
from lensprobe.evals import builtin_condition
from lensprobe.viz.report import write_report

EVAL_TITLE = "MATH-500 evaluation: w/o vs w/ Mless vs w/ Mful"
TITLES = (  # every registered section, in report order
    "Meaningless tokens: attention received with vs without filler",
    "Filler tokens vs a random sentence of the same length",
    "Attention per token class (ASCII grid), with vs without filler",
    "Layer 0 attention, interactive (Mless prompt)",
    "Mechanism: filler tokens rescale layer-0 attention",
    "Attention sinks and massive activations, without and with filler",
    "Logit lens per layer and generation step, without and with filler",
    "Head ablation sweep: which heads move the next-token entropy",
    "Average attention on head L0H",
    "next-token change",
    "Activation patching: layer 0 from the Mless run into the plain run",
    "Head attribution (AtP*) verified by exact ablation",
    "Latent thinking tokens: entropy and attention onto <thinking> per generation step",
    "Arithmetic evaluation (last-number grading)",
    EVAL_TITLE,
)


@pytest.fixture
def math500(math500_path, monkeypatch):
    """The demo reads MATH-500 from the shared data folder (the fixture fails when it is missing)."""
    monkeypatch.setenv("LENSPROBE_MATH500", str(math500_path))
    return math500_path


def check_report(out, model_name: str) -> dict:
    """Every section is in the page and the manifest, with its files; returns the manifest."""
    page = (out / "index.html").read_text(encoding="utf-8")
    manifest = json.loads((out / "report.json").read_text(encoding="utf-8"))
    titles = [s["title"] for s in manifest["sections"]]
    assert len(titles) == len(TITLES)
    for want, got in zip(TITLES, titles, strict=True):
        assert want in got, (want, got)
    assert "section skipped" not in page
    assert model_name in page and "0-based" in page
    assert not re.search(r"<script[^>]*\bsrc\s*=", page)  # self-contained
    for f in (f for s in manifest["sections"] for f in s["files"]):
        path = out / f
        if f.endswith(".csv"):
            assert len(pd.read_csv(path)) > 0, f
        else:
            json.loads(path.read_text(encoding="utf-8"))
    return manifest


def test_demo_report_on_the_tiny_model(tiny, tmp_path, math500):
    out = tmp_path / "report"
    index = run_demo(out, tiny, quick=True, progress=False)
    assert index == out / "index.html"
    manifest = check_report(out, "lensprobe-tiny-llama")
    evals = next(s for s in manifest["sections"] if s["title"] == EVAL_TITLE)
    answers = pd.read_csv(out / evals["slug"] / "answers.csv")
    assert sorted(set(answers["condition"])) == ["w/ Mful", "w/ Mless", "w/o"]
    # the first level-1 problems, in file order, whose prompts leave room for 8 new tokens in the context
    builders = [builtin_condition(c).prompt_builder(tiny) for c in ("w/o", "w/ Mless", "w/ Mful")]

    def fits(problem):
        try:
            return max(len(build(problem.problem)) for build in builders) + 8 <= tiny.cfg.n_ctx
        except lp.LensprobeError:  # longer than the context already
            return False

    first = [p.id for p in lp.load_math500(math500, levels=1) if fits(p)][:2]
    assert list(dict.fromkeys(answers["problem_id"])) == first


def test_demo_fails_loudly_when_the_math500_file_is_missing(tiny, tmp_path, monkeypatch, capsys):
    missing = tmp_path / "no-such-math500.jsonl"
    monkeypatch.setenv("LENSPROBE_MATH500", str(missing))
    with pytest.raises(lp.LensprobeError, match=r"LENSPROBE_MATH500=.*no-such-math500.jsonl.*is not a file"):
        run_demo(tmp_path / "report", tiny, quick=True, progress=False)
    # the command: exit code 2, one line naming the file, no report
    monkeypatch.setattr("lensprobe.app.common.load_model", lambda name=None, **kw: tiny)
    assert main(["demo", "--quick", "--out", str(tmp_path / "cli-report")]) == 2
    err = capsys.readouterr().err
    assert "no-such-math500.jsonl" in err and "Traceback" not in err
    assert not (tmp_path / "cli-report" / "index.html").exists()


def test_demo_command_takes_the_tiny_model(tmp_path, math500, capsys):
    """``--model tiny`` (documented for every command) works for ``lensprobe demo`` too."""
    out = tmp_path / "report"
    assert main(["demo", "--model", "tiny", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    manifest = check_report(out, "lensprobe-tiny-llama")
    # the progress bars name the studies by their titles and show their inner progress
    assert all(entry.title in printed.err for entry in DEMO_SECTIONS)
    assert "build_section" not in printed.err and "lensprobe.app" not in printed.err
    assert "ablation sweep" in printed.err and "problem" in printed.err
    # at the end: what the report holds and where
    assert f"report: {(out / 'index.html').resolve()}" in printed.out
    assert f"{len(TITLES)} sections" in printed.out
    for sec in manifest["sections"]:
        assert sec["title"] in printed.out
        assert not sec["files"] or f"numbers: {sec['slug']}/" in printed.out


def test_demo_quick_end_to_end_on_the_embedded_model(smol, tmp_path, math500, capsys):
    out = tmp_path / "report"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    assert str((out / "index.html").resolve()) in capsys.readouterr().out
    check_report(out, "SmolLM2-135M-Instruct")


# ----- the sections ----------------------------------------------------------------------------
def test_demo_question_sources(tmp_path, monkeypatch, math500):
    first = next(json.loads(line) for line in math500.open() if json.loads(line)["level"] == 1)
    q, src = filler_sections.demo_question()
    assert q == first["problem"] and first["unique_id"] in src
    own = tmp_path / "mine.jsonl"
    own.write_text("".join(json.dumps(r) + "\n" for r in ({"problem": "hard", "level": 3},
                                                          {"problem": "easy", "level": 1})))
    monkeypatch.setenv("LENSPROBE_MATH500", str(own))
    assert filler_sections.demo_question()[0] == "easy"
    q, src = filler_sections.demo_question(quick=True)
    assert src == "built-in example question"


def test_filler_sections_on_tiny_model(tiny):
    sections = filler_sections.build_demo_sections(tiny, quick=True)
    titles = [s.title for s in sections]
    assert len(sections) == 4 and len(set(titles)) == 4
    s1, s2, s3, s4 = sections
    assert len(s1.figures) == 2 and set(s1.tables) == {"attention_received", "condition_changes"}
    shown = s1.data["study"]["heads_shown"]
    assert len(shown) == 2 and all(h.startswith("L0H") for h in shown)
    assert set(s1.tables["attention_received"]["head_label"]) == set(shown)
    # the heads shown are the layer-0 heads whose series the Mless filler changes most
    changes = s1.tables["condition_changes"]
    mless = changes[(changes["condition"] == "w/ Mless") & (changes["layer"] == 0)]
    assert set(shown) == set(mless.nlargest(2, "change")["head_label"])
    assert "lensprobe-tiny-llama" in s1.intro and "0-based" in s1.intro
    assert set(s2.tables["filler_vs_random"]["condition"]) == {"w/ Mless", "random sentence"}
    assert set(s3.tables["token_class_attention"]["group"]) == {"w/o filler", "Mless"}
    view = s4.data["attention_L0"]
    assert len(view["pattern"]) == tiny.cfg.n_heads and "«" in s4.html[0]


def test_head_sections_on_tiny_model(tiny, tmp_path):
    sections = head_sections.build_section(tiny, quick=True)
    assert len(sections) == 4
    sweep, attention, single, patching = sections
    assert len(sweep.figures) == 2 and sweep.tables["sweep_long"].shape[0] == 2 * 8
    assert set(sweep.tables["sweep_long"]["label"]) == {f"L{layer}H{h}" for layer in (0, 1) for h in range(4)}
    assert len(attention.figures) == 2
    assert set(single.tables["single_ablations"]["condition"]) == {"w/o filler", "Mless", "Mful"}
    df = patching.tables["patching"]
    assert len(df) == 3 * 3 + 1 and df["kl"].min() >= 0 and df["kl"].max() > 0
    (heat,) = patching.figures[0].data  # hook x segment shares, as in the table
    cells = df[df["site"] != "all sites"].set_index(["hook", "segment"])["share"]
    assert [v for row in heat.z for v in row] == pytest.approx(
        [cells[(h, s)] for h in heat.y for s in heat.x], nan_ok=True)
    index = write_report(tmp_path, sections)
    assert index.is_file() and "Head ablation sweep" in index.read_text(encoding="utf-8")


def test_thinking_section_does_not_touch_the_shared_model(tiny, math500):
    vocab = tiny.cfg.d_vocab
    sec = thinking_sections.build_demo_section(tiny, quick=True)
    assert tiny.cfg.d_vocab == vocab and len(tiny.tokenizer) == vocab  # worked on a copy
    assert "never trained" in sec.intro and "&lt;thinking&gt;" in sec.intro
    assert len(sec.figures) == 1 and {"per_step", "texts"} <= set(sec.tables)
    per_step = sec.tables["per_step"]
    assert set(per_step["condition"]) == {"LatentFusion (alpha=0.6)", "Pause", "no thinking"}
    assert sec.data["summary"]["settings"]["steps"] == 8


def test_eval_section_rows_are_greedy_generations(tiny, tiny_hf, math500):
    sec = eval_sections.build_math500_section(tiny, quick=True)
    assert sec.title == EVAL_TITLE
    assert "135M" in sec.intro and "solves very few" in sec.intro
    answers = sec.tables["answers"]
    assert sorted(set(answers["condition"])) == ["w/ Mful", "w/ Mless", "w/o"]
    problems = {p.id: p for p in lp.load_math500(math500, levels=1)}
    eos = tiny.tokenizer.eos_token_id
    for row in answers.itertuples():
        prompt = builtin_condition(row.condition).prompt_builder(tiny)(problems[row.problem_id].problem)
        with torch.inference_mode():
            out = tiny_hf.generate(prompt.tokens, attention_mask=torch.ones_like(prompt.tokens), max_new_tokens=8,
                                   do_sample=False, pad_token_id=tiny.tokenizer.pad_token_id)
        ids = out[0, prompt.tokens.shape[1]:].tolist()
        ids = ids[: ids.index(eos)] if eos in ids else ids
        assert row.generation == tiny.tokenizer.decode(ids), (row.condition, row.problem_id)
        assert row.answer == problems[row.problem_id].answer
