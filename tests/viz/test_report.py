"""write_report: one self-contained page, plotly.js inlined once, every table and data entry on disk."""

import json
import math
import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch
from plotly.offline import get_plotlyjs

from lensprobe.core.errors import LensprobeError
from lensprobe.core.storage.jsonable import to_jsonable
from lensprobe.viz.report import Section, slugify, write_report


def sections():
    fig1 = go.Figure(go.Scatter(x=[0, 1, 2], y=[3, 1, 2], name="curve"))
    fig2 = go.Figure(go.Bar(x=["a", "b"], y=[1, 2]))
    df = pd.DataFrame({"layer": [0, 0, 1], "head_label": ["L0H0", "L0H1", "L1H0"], "attention": [0.5, 0.25, math.nan]})
    s1 = Section(
        title="First <study>", intro="<p>intro one</p>", figures=[fig1, fig2],
        html=['<div id="custom-block">block</div>'],
        tables={"attention received": df},
        data={"study": {"model": "tiny", "values": torch.tensor([0.5, 0.25]), "nan": float("nan"),
                        "np": np.float32(1.5), "span": (2, 5), "ints": np.arange(3)}},
    )
    s2 = Section(title="First <study>", intro="<p>same title</p>", tables={"t": df.head(1)})
    return [s1, s2]


def test_report_is_self_contained_and_writes_numbers(tmp_path):
    index = write_report(tmp_path / "rep", sections(), title="My report", meta={"model": "tiny-llama"})
    assert index == tmp_path / "rep" / "index.html"
    page = index.read_text(encoding="utf-8")
    assert page.count(get_plotlyjs()[:500]) == 1  # plotly.js inline, exactly once
    assert not re.search(r"<script[^>]*\bsrc\s*=", page)  # nothing loaded from elsewhere
    assert page.count('class="plotly-graph-div"') == 2
    assert '<div id="custom-block">block</div>' in page
    assert "First &lt;study&gt;" in page and "First <study>" not in page  # titles escaped
    assert "tiny-llama" in page and "0-based" in page and "My report" in page

    manifest = json.loads((tmp_path / "rep" / "report.json").read_text())
    slugs = [s["slug"] for s in manifest["sections"]]
    assert slugs == ["first-study", "first-study-2"]
    files = [f for s in manifest["sections"] for f in s["files"]]
    assert files == ["first-study/figure-1.json", "first-study/figure-2.json", "first-study/attention-received.csv",
                     "first-study/study.json", "first-study-2/t.csv"]
    for i in (1, 2):  # each figure: its PNG and SVG drawn by plotly in the browser, its JSON for a PDF
        fig_id = f"first-study-figure-{i}"
        assert f"lpImage('{fig_id}', 'png')" in page and f"lpImage('{fig_id}', 'svg')" in page
        assert f'id="{fig_id}"' in page and f'lp.viz.save(plotly.io.read_json("first-study/figure-{i}.json")' in page
    for f in files:
        assert (tmp_path / "rep" / f).is_file()
        assert f'href="{f}"' in page  # linked from the page

    csv = pd.read_csv(tmp_path / "rep" / "first-study" / "attention-received.csv")
    assert csv["head_label"].tolist() == ["L0H0", "L0H1", "L1H0"]
    assert csv["attention"].iloc[:2].tolist() == [0.5, 0.25] and math.isnan(csv["attention"].iloc[2])
    data = json.loads((tmp_path / "rep" / "first-study" / "study.json").read_text())
    assert data == {"model": "tiny", "values": [0.5, 0.25], "nan": None, "np": 1.5, "span": [2, 5], "ints": [0, 1, 2]}


def test_rewrite_removes_only_previous_report_files(tmp_path):
    out = tmp_path / "rep"
    write_report(out, sections())
    (out / "notes.txt").write_text("mine")
    write_report(out, [Section(title="Other", tables={"x": pd.DataFrame({"a": [1]})})])
    assert not (out / "first-study").exists() and not (out / "first-study-2").exists()
    assert (out / "other" / "x.csv").is_file()
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.unchecked
def test_single_section_and_bad_input(tmp_path):
    index = write_report(tmp_path, Section(title="Only"))
    assert "Only" in index.read_text()
    with pytest.raises(LensprobeError, match="Section"):
        write_report(tmp_path, ["not a section"])
    with pytest.raises(LensprobeError, match="JSON"):
        to_jsonable({"x": object()})


def test_slugify():
    assert slugify("Filler vs random (L0H3)") == "filler-vs-random-l0h3"
    assert slugify("???") == "section"
    long = slugify("word " * 30)
    assert len(long) <= 60 and not long.endswith("-") and long.endswith("word")
