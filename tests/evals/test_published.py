"""The published numbers shipped in the package equal the shared transcription of the paper, cell for cell.

The transcription (../shared/data/papers/arm-2510.01032-tables.md) is parsed here on its own terms
(markdown tables, "a/b" and "a, b, c" cells, bullet lists), independently of the package's TOML.
"""

import re
from pathlib import Path

import pytest

from lensprobe.core.errors import LensprobeError
from lensprobe.evals.results.published import published_numbers, published_table
from lensprobe.interventions.arm_presets import BENCHMARKS, PAPER_TABLE9

TABLES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "papers" / "arm-2510.01032-tables.md"
DASH = ("–", "-")


def _sections() -> dict[str, list[str]]:
    out, current = {}, None
    for line in TABLES.read_text(encoding="utf-8").splitlines():
        m = re.match(r"## Table (\w+)", line)
        if m:
            current = m.group(1)
            out[current] = []
        elif line.startswith("## "):
            current = None
        elif current is not None and line.strip():
            out[current].append(line)
    return out


def _number(text: str):
    text = text.strip()
    return None if text in DASH else float(text)


def _markdown_rows(lines: list[str]) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
    return [r for r in rows[1:] if not set("".join(r)) <= set("-: ")]  # drop the header and the rule


def _transcribed() -> dict[str, list[tuple[str, list]]]:
    """table -> [(row label, values in reading order)] from the markdown."""
    sec = _sections()
    out = {}
    for table in ("1", "2", "3b", "5", "8"):
        rows = []
        for label, *cells in _markdown_rows(sec[table]):
            values = []
            for cell in cells:
                values += [_number(v) for v in re.split(r"[/,]", cell)]
            rows.append((label, values))
        out[table] = rows
    out["3a"] = [(f"{m} {s}", [_number(v) for v in cells]) for m, s, *cells in _markdown_rows(sec["3a"])]
    out["4"] = [(line.split(":")[0], [_number(v) for v in line.split(":")[1].split("/")])
                for line in sec["4"] if line.startswith("- ")]
    out["7"] = [(line[2:].split(":")[0], [_number(v) for v in re.split(r"->|;", line.split(":")[1])])
                for line in sec["7"] if line.startswith("- ")]
    return out


def test_every_published_number_equals_the_shared_transcription():
    ours = published_numbers()
    by_table: dict[str, list] = {}
    for cell in ours:
        by_table.setdefault(cell.table, []).append(cell)
    transcribed = _transcribed()
    assert set(by_table) == set(transcribed) == {"1", "2", "3a", "3b", "4", "5", "7", "8"}
    for table, rows in transcribed.items():
        expected = [v for _, vs in rows for v in vs]
        assert [c.value for c in by_table[table]] == expected, f"table {table}"
    for table in ("1", "2", "3b", "5", "7"):  # rows are models: the names are the paper's
        n = len(by_table[table]) // len(transcribed[table])
        assert [c.model for c in by_table[table][::n]] == [label for label, _ in transcribed[table]], table
    assert sum(len(vs) for rows in transcribed.values() for _, vs in rows) == len(ours) == 250


def test_table9_in_the_presets_equals_the_shared_transcription():
    rows = _markdown_rows(_sections()["9"])
    assert len(rows) == len(PAPER_TABLE9) == 7
    columns = ("gpqa", "math500", "aime2024", "aime2025", "humaneval", "livecodebench")  # the table's order
    for (label, *cells), (key, ours) in zip(rows, PAPER_TABLE9.items(), strict=True):
        assert key.replace("-", "").replace(".", "") in label.lower().replace("-", "").replace(".", "")
        for bench, cell in zip(columns, cells, strict=True):
            expected = None if cell in DASH else tuple(float(v) for v in cell.replace("p ", "").split(","))
            assert ours[bench] == expected, (key, bench)
    assert set(BENCHMARKS) == set(columns)


def test_published_table_and_its_errors():
    t1 = published_table("1")
    row = t1[(t1["model"] == "Qwen2.5-Math-1.5B") & (t1["benchmark"] == "aime2024")]
    assert row.set_index("condition")["value"].to_dict() == {"w/o": 14.4, "w/ Mless": 17.5}
    below_5 = published_table("2").query("benchmark == 'livecodebench' and model == 'Qwen2.5-Math-7B'")
    assert below_5["value"].isna().all() and (below_5["text"] == "< 5").all()  # Table 2's "-": below 5%
    assert set(published_table("1")["text"]) >= {"63.9", "14.4"}
    t3b = published_table("3b").set_index(["model", "benchmark", "condition"])["value"]
    assert t3b[("Llama3.1-8B-Instruct", "openbookqa", "ARM")] == 50.8
    with pytest.raises(LensprobeError, match=r"no table '9'.*arm_presets"):
        published_table("9")
    with pytest.raises(LensprobeError, match=r"no published numbers for arXiv '1234.5678'"):
        published_numbers("1234.5678")
