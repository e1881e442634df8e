"""Cost of checking every row of a results file whole: writing and reading 10,000 rows with their digests.

Every line a :class:`~lensprobe.core.storage.rowfiles.RowWriter` writes carries ``row_digest``, the
digest of the row's canonical JSON, and :func:`~lensprobe.core.storage.rowfiles.read_row_file` checks
it. This script writes ``--rows`` rows shaped like an evaluation's (a few short strings, a generated
text of ``--text`` characters, numbers and verdicts) into a temporary folder, then reads them back,
and compares both with the same work without digests (``json.dumps`` per row; ``json.loads`` per line),
each the median of ``--repeats`` rounds in one process.

Usage:
    python benchmarks/row_digests.py --rows 10000 --repeats 5
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from lensprobe.core.storage.files import DATA_LIMIT, read_bytes
from lensprobe.core.storage.rowfiles import RowWriter, read_row_file, row_line
from lensprobe.core.storage.writer import OutputFolder


def _rows(n: int, text: int) -> list[dict]:
    return [{"condition": "w/ Mless", "problem_id": f"test/algebra/{i}.json", "sample": i % 4, "finish": "eos",
             "prediction": "x" * text, "answer": "42", "math-verify": i % 3 == 0, "paper": None,
             "prompt_tokens": 180, "generated_tokens": 512, "seconds": 1.2345 + i, "config_hash": "3f1c0a9e7d2b4c6a",
             "condition_hash": "9a0e2b7c5d3f1e8a", "prompt_ids": "0123456789abcdef", "rank": 0} for i in range(n)]


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--text", type=int, default=1500, help="characters of each row's generated text")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = _rows(args.rows, args.text)
    with tempfile.TemporaryDirectory() as tmp:
        folder = OutputFolder(tmp)
        path = Path(tmp) / "results-rank0.jsonl"

        def write() -> None:
            folder.remove(path.name)
            with RowWriter(path) as writer:
                for row in rows:
                    writer.write(row)

        write()
        plain = b"".join((json.dumps(r, ensure_ascii=False) + "\n").encode() for r in rows)
        results = {
            "encode, with digests (row_line)": _median_seconds(lambda: [row_line(r) for r in rows], args.repeats),
            "encode, plain json.dumps": _median_seconds(
                lambda: [json.dumps(r, ensure_ascii=False) for r in rows], args.repeats),
            "write 10k rows (RowWriter, one fsync)": _median_seconds(write, args.repeats),
            "read + check (read_row_file)": _median_seconds(lambda: list(read_row_file(path)), args.repeats),
            "read, plain json.loads": _median_seconds(
                lambda: [json.loads(line) for line in read_bytes(path, "row file", DATA_LIMIT).splitlines()],
                args.repeats),
        }
        size = path.stat().st_size
    print(f"{args.rows} rows, {size / 2**20:.1f} MiB with digests ({len(plain) / 2**20:.1f} MiB without), "
          f"median of {args.repeats}:")
    for name, seconds in results.items():
        print(f"  {name:<40} {seconds * 1000:8.1f} ms")
    print(f"  read with checks / plain read: {results['read + check (read_row_file)'] / results['read, plain json.loads']:.2f}x")
    print(f"  encode with digests / plain:   "
          f"{results['encode, with digests (row_line)'] / results['encode, plain json.dumps']:.2f}x")


if __name__ == "__main__":
    main()
