"""The benchmarks' published problem files shipped as data: every digest, size and count recomputed here from the
files themselves (lensprobe's MATH-500 copy, the project's shared MATH-500 and AIME files), and ids that come from
the benchmark named, never from the file's name."""

import hashlib
import json
from pathlib import Path

from lensprobe.evals.problems.load import PACKAGED_MATH500
from lensprobe.evals.results.benchdata import data_reasons, load_benchmark, published_data

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _count(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def test_the_shipped_digests_are_the_files_own():
    known = published_data()
    files = {"math500": SHARED / "math500" / "test.jsonl", "aime2024": SHARED / "aime" / "aime_2022_2024.jsonl",
             "aime2025": SHARED / "aime" / "aime2025.jsonl"}
    assert set(known) == set(files)
    for bench, path in files.items():
        spec = known[bench]
        assert (spec["sha256"], spec["size"], spec["problems"]) == (_digest(path), path.stat().st_size, _count(path))
        assert spec["file"] == path.name and spec["source"]
    # lensprobe's own MATH-500 copy is the shared file, byte for byte
    assert _digest(PACKAGED_MATH500) == _digest(SHARED / "math500" / "test.jsonl") == known["math500"]["sha256"]
    assert known["aime2024"]["authors_sha256"] == "unknown" and "parquet" in known["aime2024"]["authors_file"]


def test_problems_are_named_after_the_benchmark_and_the_data_is_checked(tmp_path):
    aime25 = SHARED / "aime" / "aime2025.jsonl"
    problems, facts = load_benchmark("aime2024", aime25)  # an AIME 2025 file passed as AIME 2024
    assert [p.id for p in problems[:2]] == ["aime2024-0", "aime2024-1"]
    assert facts == {"path": str(aime25.resolve()), "size": aime25.stat().st_size, "problems": 30,
                     "sha256": _digest(aime25)}
    why = data_reasons("aime2024", facts)
    assert len(why) == 1 and _digest(aime25)[:16] in why[0] and "it is the published file of AIME 2025" in why[0]
    assert data_reasons("aime2025", facts) == []
    assert data_reasons("aime2024", load_benchmark("aime2024", SHARED / "aime" / "aime_2022_2024.jsonl")[1]) == []
    # 500 problems that are not MATH-500: every answer replaced
    rows = [json.loads(line) for line in PACKAGED_MATH500.read_text(encoding="utf-8").splitlines()]
    fake = tmp_path / "test.jsonl"
    fake.write_text("".join(json.dumps({**r, "answer": "0"}) + "\n" for r in rows), encoding="utf-8")
    problems, facts = load_benchmark("math500", fake)
    assert len(problems) == 500 and facts["problems"] == 500
    why = data_reasons("math500", facts)
    assert len(why) == 1 and "is not MATH-500's published file" in why[0] and facts["sha256"][:16] in why[0]
    assert data_reasons("math500", load_benchmark("math500")[1]) == []
    assert "not recorded" in data_reasons("math500", None)[0]
