"""Untrusted text (model, condition and folder names, questions, generated text) is inert in both reports:
a headless Chromium loads each page, and no payload's JavaScript runs."""

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import lensprobe as lp
from lensprobe.evals.results.folder import RowWriter, prepare_folder, results_file
from lensprobe.studies import filler as fs
from lensprobe.viz import (
    attention_received_figure,
    attention_view_html,
    generation_trace_figure,
    write_eval_report,
)
from lensprobe.viz.report import Section, write_report

PAYLOADS = [
    "<script>window.__pwned = 1</script>",
    "</script><script>window.__pwned = 2</script>",
    '"><img src=x onerror="window.__pwned = 3">',
    "'><svg onload='window.__pwned = 4'>",
    "<!--<script>window.__pwned = 5</script>",
]
FOLDER_PAYLOAD = "<img src=x onerror=window.__pwned=6>"  # no '/': a folder can carry it in its name
PROBE = ("<script>setTimeout(function () { document.body.setAttribute('data-lp-pwned', "
         "String(window.__pwned || 'none')); document.body.setAttribute('data-lp-intact', "
         "String(!!document.getElementById('lp-intact'))); }, 1500);</script>")


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise AssertionError("no chromium binary on PATH: `make test` installs Debian's `chromium` package "
                             "(apt-get install chromium); these tests load the report in a real browser")
    return path


def pwned(page: Path, *, intact: bool = False) -> str:
    """Load a copy of ``page`` (beside it, so its files resolve) with a probe script, in headless Chromium;
    return what the probe saw in ``window.__pwned`` (``"none"``: no payload ran). ``intact``: also check
    that the element ``#lp-intact`` (put last on the page) is an element of the page, not swallowed text."""
    text = page.read_text(encoding="utf-8")
    assert text.count("</body>") >= 1
    probe = page.with_name("probe-" + page.name)
    cut = text.rindex("</body>")
    probe.write_text(text[:cut] + PROBE + text[cut:], encoding="utf-8")
    dom = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--dump-dom", probe.resolve().as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    probe.unlink()
    found = re.search(r'data-lp-pwned="([^"]*)"', dom)
    assert found, f"the probe did not run: {dom[:500]}"
    if intact:
        assert 'data-lp-intact="true"' in dom, "the page's end was swallowed by a script"
    return found.group(1)


@pytest.mark.slow  # launches a browser
def test_the_probe_sees_a_payload_that_runs(tmp_path):
    page = tmp_path / "index.html"
    page.write_text(f"<!DOCTYPE html><html><body><p>x</p>{PAYLOADS[2]}</body></html>", encoding="utf-8")
    assert pwned(page) == "3"  # the check can fail
    page.write_text(f"<!DOCTYPE html><html><body><p>{html.escape(PAYLOADS[2])}</p></body></html>", encoding="utf-8")
    assert pwned(page) == "none"


def untrusted_eval_folder(root: Path) -> Path:
    """A result folder whose model, condition names, questions and generations are payloads."""
    out = root / f"run {FOLDER_PAYLOAD}"
    conditions = PAYLOADS[:3]
    config_hash = prepare_folder(out, {"model": PAYLOADS[3]}, {c: {"hash": str(i)} for i, c in enumerate(conditions)})["hash"]
    with RowWriter(results_file(out, 0)) as writer:
        for i, cond in enumerate(conditions):
            for p in range(3):
                ok = (p + i) % 2 == 0
                writer.write({"condition": cond, "problem_id": f"q{p}", "sample": 0, "model": PAYLOADS[3],
                              "level": 1 + p, "subject": PAYLOADS[4], "answer": PAYLOADS[1],
                              "prediction": PAYLOADS[0], "math-verify": ok, "paper": ok, "paper-lenient": ok,
                              "paper-exact": ok, "finish": PAYLOADS[2], "generation": " ".join(PAYLOADS),
                              "prompt": PAYLOADS[0], "problem": PAYLOADS[4], "config_hash": config_hash,
                              "condition_hash": str(i)})
    return out


@pytest.mark.slow  # launches a browser
def test_the_evaluation_report_runs_no_untrusted_text(tmp_path):
    chromium()
    index = write_eval_report([untrusted_eval_folder(tmp_path)], tmp_path / "report")
    text = index.read_text(encoding="utf-8")
    assert html.escape(PAYLOADS[0]) in text and html.escape(FOLDER_PAYLOAD) in text  # shown, as text
    assert pwned(index) == "none"


@pytest.mark.slow  # launches a browser
def test_the_report_page_runs_no_untrusted_text(tmp_path, tiny):
    chromium()
    question = " ".join(PAYLOADS)
    setup = fs.FillerSetup(conditions=("w/o", "w/ Mless"), system=PAYLOADS[1], count=8)
    res = fs.attention_received_by_condition(tiny, question, layers=[0], heads=[0], setup=setup)
    prompt = res.prompts["w/ Mless"]
    view = attention_view_html(fs.attention_view_pattern(tiny, prompt, 0), prompt.str_tokens, layer=0,
                               span=res.filler_span("w/ Mless"), caption=question)
    tokens = ["<!--", "<script>", "x"] + [f"t{i}" for i in range(len(prompt) - 3)]  # text a model can make
    raw_view = attention_view_html(fs.attention_view_pattern(tiny, prompt, 0), tokens, layer=0)
    trace = lp.trace_generation(tiny, lp.build_prompt(tiny, question), max_new_tokens=4)
    summary = lp.generation.trace_summary({PAYLOADS[0]: trace, PAYLOADS[2]: trace})
    sections = [
        Section(PAYLOADS[1], intro=f"<p>{html.escape(question)}</p>",
                figures=[attention_received_figure(res.table, [(0, 0)], title=question),
                         generation_trace_figure(summary, title=PAYLOADS[1])],
                html=[view], tables={PAYLOADS[0]: res.table.head()},
                data={PAYLOADS[2]: {"question": question, "text": trace.texts}}),
        Section(PAYLOADS[4], intro="", html=[raw_view]),
        Section("end", html=['<p id="lp-intact">the end of the page</p>']),
    ]
    index = write_report(tmp_path / "rep", sections, title=PAYLOADS[0], meta={PAYLOADS[2]: question})
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["title"] == PAYLOADS[0] and len(report["sections"]) == 3
    assert pwned(index, intact=True) == "none"


def test_inline_scripts_cannot_be_put_in_escaped_mode(tmp_path):
    block = '<script>var tokens = ["<!--", "<script>", "x"];</script><p id="lp-intact">after</p>'
    index = write_report(tmp_path, [Section("s", html=[block])])
    text = index.read_text(encoding="utf-8")
    assert 'var tokens = ["\\x3C!--", "<script>", "x"];</script><p id="lp-intact">' in text
    assert "<!--" not in text
