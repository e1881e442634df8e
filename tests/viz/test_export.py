"""Saving figures: PDF, SVG and PNG through kaleido and the machine's Chromium, HTML and JSON."""

import plotly.graph_objects as go
import plotly.io as pio
import pytest

import lensprobe as lp
from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.locks import pid_alive
from lensprobe.viz import export


def figure():
    import pandas as pd

    table = pd.DataFrame({"condition": ["w/o", "w/ Mless"], "model": "m", "accuracy": [0.25, 0.5], "low": [0.1, 0.3],
                          "high": [0.4, 0.7], "n": 8, "correct": [2, 4], "grader": "math-verify"})
    return lp.viz.accuracy_bars(table, title="Export check")


def test_a_figure_is_saved_as_png_svg_and_pdf_in_one_call(tmp_path):
    assert export.browser_path() is not None  # this machine has Chromium: the export must run
    fig = figure()
    png, svg, pdf, html, js = lp.viz.save(fig, tmp_path / "f.png", tmp_path / "f.svg", tmp_path / "f.pdf",
                                          tmp_path / "f.html", tmp_path / "f.json")
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert svg.read_text(encoding="utf-8").lstrip().startswith("<svg") and "Export check" in svg.read_text()
    assert pdf.read_bytes().startswith(b"%PDF-")
    assert "Plotly.newPlot" in html.read_text(encoding="utf-8")
    assert pio.read_json(js).layout.title.text == "Export check"
    height = fig.layout.height
    assert int.from_bytes(png.read_bytes()[20:24], "big") == 2 * height  # the figure's own height, scale 2


def test_without_a_browser_one_line_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "browser_path", lambda: None)
    with pytest.raises(lp.LensprobeError) as err:
        lp.viz.save(figure(), tmp_path / "f.pdf")
    text = str(err.value)
    assert "\n" not in text and "apt-get install chromium" in text and "plotly_get_chrome" in text
    assert not (tmp_path / "f.pdf").exists()


def test_an_unknown_suffix_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(lp.LensprobeError, match=r"\.html, \.json or .*\.pdf"):
        lp.viz.save(figure(), tmp_path / "f.html", tmp_path / "f.eps")
    assert not (tmp_path / "f.html").exists()


@pytest.mark.unchecked
@pytest.mark.parametrize(("sizes", "message"), [
    ({"scale": 0}, "scale: expected a finite number > 0 and <= 100000, got 0"),
    ({"scale": float("nan")}, "scale: expected a finite number"),
    ({"scale": True}, "scale: expected a finite number"),
    ({"width": -5}, "width: expected a whole number between 1 and 100,000, got -5"),
    ({"height": 0}, "height: expected a whole number between 1 and 100,000, got 0"),
    ({"width": 600.5}, r"width: expected a whole number .*got 600.5 \(float\)"),
])
def test_a_bad_scale_or_size_is_refused_before_anything_is_written(tmp_path, sizes, message):
    with pytest.raises(lp.core.errors.SettingError, match=message):
        lp.viz.save(figure(), tmp_path / "f.html", **sizes)
    assert not (tmp_path / "f.html").exists()


def test_a_browser_that_never_answers_is_stopped_at_the_time_limit(tmp_path, monkeypatch):
    browser = tmp_path / "chromium"
    pidfile = tmp_path / "browser.pid"
    browser.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 600\n")
    browser.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(browser))
    monkeypatch.setenv(export.EXPORT_TIMEOUT_VAR, "10")  # time for the export process to start the browser
    fig = go.Figure(go.Bar(x=["a"], y=[1]))
    with pytest.raises(LensprobeError, match=rf"did not finish within 10 s: the browser {browser} did not answer.*"
                                             rf"BROWSER_PATH.*{export.EXPORT_TIMEOUT_VAR}"):
        lp.viz.save(fig, tmp_path / "f.png")
    assert not (tmp_path / "f.png").exists() and [p.name for p in tmp_path.glob(".f.*")] == []
    assert not pid_alive(int(pidfile.read_text()))  # the browser it started was stopped with it


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf"])
def test_an_export_limit_that_is_not_a_positive_number_is_refused(monkeypatch, value):
    monkeypatch.setenv(export.EXPORT_TIMEOUT_VAR, value)
    with pytest.raises(LensprobeError, match=export.EXPORT_TIMEOUT_VAR):
        export.export_limit()
