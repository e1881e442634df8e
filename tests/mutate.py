"""Mutation testing of the modules results depend on, module by module (``make mutate``; docs/mutation.md).

For each module, mutmut (3.x) runs in a scratch copy of the tree (``build/mutate/<module>/``: the working
tree is never touched) with a ``[tool.mutmut]`` naming that module and the fast tests that exercise it:
it makes every mutant of the module, learns which of those tests reach each function, runs them against
each mutant (in forked processes, ``--jobs`` at a time) and counts the mutants they kill. A module's run
stops after ``--minutes``; the mutants it did not reach are counted as not checked. mutmut's own output is
kept in ``build/mutate/<module>/mutmut.log``.

    python tests/mutate.py                      # every module below
    python tests/mutate.py arm_rule stats       # the modules whose path holds these words
    python tests/mutate.py --list               # the modules and their tests

Runtime type checks are off in these runs (``--jaxtyping-packages=``): mutmut runs pytest several times in
one process, and jaxtyping's import hook must be installed before lensprobe is first imported. For the same
reason a test id must not change when its module is collected again in the same process: pytest escapes an
``ids=`` list again then (a backslash doubles), so ids holding one are given with ``pytest.param(..., id=)``.
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTMUT = Path(sys.executable).with_name("mutmut")

MODULES: dict[str, list[str]] = {
    # the results store and row files
    "lensprobe/core/storage/store.py": ["tests/core/test_store.py", "tests/core/test_shards.py",
                                       "tests/core/test_store_edges.py"],
    "lensprobe/core/storage/rowfiles.py": ["tests/core/test_store.py", "tests/evals/test_results_faults.py",
                                          "tests/core/test_rowfiles_edges.py"],
    "lensprobe/core/storage/shards.py": ["tests/core/test_shards.py", "tests/core/test_store.py",
                                        "tests/core/test_shards_edges.py"],
    # grading and statistics
    "lensprobe/evals/grading/grade.py": ["tests/evals/test_grading.py", "tests/evals/test_grading_bounded.py",
                                   "tests/evals/test_grading_paper_exact.py", "tests/evals/test_grading_edges.py"],
    "lensprobe/evals/results/stats.py": ["tests/evals/test_pass_at_k.py", "tests/evals/test_paper_metric.py",
                                 "tests/evals/test_data_stats.py", "tests/evals/test_rows_check.py",
                                 "tests/evals/test_results_faults.py", "tests/core/test_nonfinite.py",
                                 "tests/evals/test_stats_edges.py"],
    # the ARM rule, head ablation
    "lensprobe/interventions/arm_rule.py": ["tests/interventions/test_arm.py",
                                            "tests/interventions/test_arm_rule_edges.py",
                                            "tests/interventions/test_arm_gemma_quantile.py"],
    "lensprobe/interventions/ablation.py": ["tests/interventions/test_ablation.py",
                                            "tests/interventions/test_ablation_positions.py",
                                            "tests/interventions/test_ablation_edges.py"],
    # continuous batching's row handling
    "lensprobe/generation/batching/cacherows.py": ["tests/generation/test_cacherows.py", "tests/generation/test_refill.py",
                                          "tests/generation/test_cacherows_edges.py"],
    "lensprobe/generation/batching/rowstate.py": ["tests/generation/test_refill.py", "tests/generation/test_batch_proof.py",
                                         "tests/generation/test_rowstate_edges.py", "tests/generation/test_scheduler.py"],
    # metrics, prompt segments
    "lensprobe/core/measures/metrics.py": ["tests/core/test_metrics.py", "tests/core/test_metrics_edges.py"],
    "lensprobe/core/prompts/prompt.py": ["tests/core/test_prompts.py", "tests/core/test_prompts_raw.py",
                                         "tests/core/test_prompt_edges.py"],
    "lensprobe/core/prompts/assembly.py": ["tests/core/test_prompts.py", "tests/core/test_prompts_raw.py",
                                           "tests/core/test_prompt_edges.py", "tests/core/test_prompt_control_ids.py"],
}
PYTEST_ARGS = ["--jaxtyping-packages=", "-m", "not slow", "-p", "no:cacheprovider", "-q"]


def scratch_copy(module: str, tests: list[str]) -> Path:
    """A fresh copy of the package, the tests and the settings, configured to mutate ``module`` only."""
    work = ROOT / "build" / "mutate" / Path(module).stem
    shutil.rmtree(work, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("lensprobe", "tests"):
        shutil.copytree(ROOT / name, work / name, ignore=ignore)
    shutil.copy(ROOT / "conftest.py", work / "conftest.py")
    shared = ROOT.parent / "shared"  # the data tests/conftest.py finds beside the repository
    if shared.is_dir():
        (work / "shared").symlink_to(shared)
    settings = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    settings += ("\n[tool.mutmut]\n" f'source_paths = ["lensprobe"]\nonly_mutate = ["{module}"]\n'
                 f"pytest_add_cli_args = {json.dumps(PYTEST_ARGS)}\n"
                 f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n")
    (work / "pyproject.toml").write_text(settings, encoding="utf-8")
    return work


def run_module(module: str, tests: list[str], minutes: float, jobs: int) -> dict:
    """Run mutmut on one module; its counts (killed, survived, not checked), the survivors, the time-outs and
    the time."""
    work = scratch_copy(module, tests)
    pattern = module.removesuffix(".py").replace("/", ".") + "*"
    start = time.monotonic()
    with open(work / "mutmut.log", "w", encoding="utf-8") as log:  # mutmut's own output, for a run that fails
        try:
            subprocess.run([str(MUTMUT), "run", "--max-children", str(jobs), pattern], cwd=work,
                           timeout=minutes * 60, stdout=log, stderr=subprocess.STDOUT, check=False)
            capped = False
        except subprocess.TimeoutExpired:
            capped = True
    seconds = time.monotonic() - start
    listing = subprocess.run([str(MUTMUT), "results", "--all", "true"], cwd=work, capture_output=True, text=True,
                             check=False).stdout
    status = dict(re.findall(r"^\s*(\S+): (.+)$", listing, flags=re.MULTILINE))
    counts: dict[str, int] = {}
    for verdict in status.values():
        counts[verdict] = counts.get(verdict, 0) + 1
    checked = sum(n for verdict, n in counts.items() if verdict != "not checked")
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    return {"module": module, "mutants": len(status), "checked": checked, "killed": killed,
            "score": killed / checked if checked else None, "counts": counts, "minutes": seconds / 60,
            "capped": capped, "survivors": sorted(k for k, v in status.items() if v == "survived"),
            "timeouts": sorted(k for k, v in status.items() if v == "timeout"),
            "folder": str(work.relative_to(ROOT))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("words", nargs="*", help="run only the modules whose path holds one of these")
    parser.add_argument("--minutes", type=float, default=30, help="time cap per module (default 30)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at a time (default 2)")
    parser.add_argument("--list", action="store_true", help="list the modules and their tests, run nothing")
    args = parser.parse_args(argv)
    chosen = {m: t for m, t in MODULES.items() if not args.words or any(w in m for w in args.words)}
    if args.list or not chosen:
        for module, tests in (chosen or MODULES).items():
            print(f"{module}: {' '.join(tests)}")
        return 0 if chosen else 2
    for module, tests in chosen.items():
        result = run_module(module, tests, args.minutes, args.jobs)
        score = "-" if result["score"] is None else f"{100 * result['score']:.1f} %"
        print(f"{module}: {result['killed']}/{result['checked']} killed ({score}) of {result['mutants']} mutants "
              f"in {result['minutes']:.1f} min{' (time cap reached)' if result['capped'] else ''}", flush=True)
        for name in result["survivors"]:
            print(f"    survived: {name}  (see: cd {result['folder']} && mutmut show {name})")
        for name in result["timeouts"]:
            print(f"    timed out: {name}")
        (ROOT / result["folder"] / "score.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
