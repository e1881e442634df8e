"""Hostile but realistic input, counted by family: what lensprobe does with each case.

Each case is run in this process (the CLI through ``lensprobe.app.cli.main``, on ``--model tiny``)
and classified:

- handled: the right answer, or a refusal (``LensprobeError``; CLI: exit 2, one line, and for
  command-line values no model loaded);
- silent wrong: a wrong number or a value accepted that should have been refused;
- traceback: any other exception (CLI: exit 1, "unexpected error");
- hang: not finished within 60 s (SIGALRM);
- lost: result rows missing after the case.

Usage: ``python benchmarks/hostile_inputs.py`` prints the table as Markdown (the README's
reliability section) and every case that is not handled.
"""

import contextlib
import errno
import io
import json
import logging
import math
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import pandas as pd

import lensprobe as lp
from lensprobe.app import common
from lensprobe.app.cli import main, write_error_log
from lensprobe.app.recipe import load_recipe
from lensprobe.core.models.testing import tiny_hf_model, tiny_model
from lensprobe.core.prompts.randomtext import random_sentence_text
from lensprobe.core.storage.identity import identity
from lensprobe.evals import Problem
from lensprobe.evals.problems import hub
from lensprobe.evals.results.folder import load_results, results_file
from lensprobe.evals.running import execute as running

BAD = "\udcff"
LOADS: list[int] = []
_real_load = common.load_model


def counting_load(*args, **kwargs):
    LOADS.append(1)
    return _real_load(*args, **kwargs)


common.load_model = counting_load


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang


def cli(argv: str, *, preload: bool = True, fragment: str | None = None) -> str:
    """Classify one command: exit 2 in one line (before any model load when ``preload``, naming
    ``fragment`` when given) is handled."""
    LOADS.clear()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(shlex.split(argv))
    text = err.getvalue().split("\r")[-1]
    if rc == 1:
        return "traceback"
    if rc == 0:
        return "silent wrong"
    if text.count("\n") != 1 or (preload and LOADS) or (fragment is not None and fragment not in text):
        return "silent wrong"  # refused, but late, in several lines or naming another cause
    return "handled"


def refuses(fn) -> str:
    try:
        fn()
    except lp.LensprobeError:
        return "handled"
    except Hang:
        raise
    except Exception:  # noqa: BLE001
        return "traceback"
    return "silent wrong"


def equals(fn, want) -> str:
    try:
        got = fn()
    except Hang:
        raise
    except Exception:  # noqa: BLE001
        return "traceback"
    return "handled" if got == want else "silent wrong"


def rows_cases(tiny, work: Path) -> list[tuple[str, object]]:
    probs = [Problem(id=f"q{i}", problem=f"What is {i}+{i}?", answer=str(2 * i)) for i in range(3)]
    base = work / "base"
    lp.evaluate(tiny, probs, "w/o", out=base, max_new_tokens=2, model_name="tiny", progress=False)
    cases = []

    def edited(name, change):
        out = work / name
        out.mkdir()
        (out / "config.json").write_bytes((base / "config.json").read_bytes())
        lines = results_file(base, 0).read_text(encoding="utf-8").splitlines()
        results_file(out, 0).write_text("\n".join(change(lines)) + "\n", encoding="utf-8")
        return out

    def field(key, value):
        return lambda lines: [json.dumps({**json.loads(lines[0]), key: value}), *lines[1:]]

    for key, value in [("math-verify", "false"), ("math-verify", "False"), ("math-verify", "0"), ("math-verify", -1),
                       ("math-verify", 0.5), ("paper", 1), ("sample", "0"), ("sample", -1), ("sample", True),
                       ("sample", 1.0), ("problem_id", 3), ("condition", None), ("finish", 5), ("prediction", 42)]:
        out = edited(f"f{len(cases)}", field(key, value))
        cases.append((f"row {key}={value!r}", lambda out=out: refuses(lambda: load_results(out))))
    for text in ("null", "[1,2,3]", "{}", '"row"', "7", json.dumps({"condition": "w/o", "sample": 0})):
        out = edited(f"n{len(cases)}", lambda lines, text=text: [lines[0], text, *lines[2:]])
        cases.append((f"line {text}", lambda out=out: cli(f"eval-report {out}")))
    out = edited("nan", lambda lines: [json.dumps({**json.loads(lines[0]), "math-verify": math.nan}), *lines[1:]])
    cases.append(("NaN verdict left out of n", lambda: equals(lambda: int(lp.evals.accuracy(load_results(out))["n"][0]),
                                                               2)))
    cases.append(("NaN verdict retried on resume", lambda: equals(lambda: int(lp.evaluate(
        tiny, probs, "w/o", out=out, max_new_tokens=2, model_name="tiny", progress=False)["math-verify"].notna().sum()),
        3)))

    def disagree(lines):
        first = json.loads(lines[0])
        return [*lines, json.dumps({**first, "math-verify": not first["math-verify"]})]

    out2 = edited("dup", disagree)

    def warned():  # named in a warning, or refused naming both lines
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                load_results(out2)
        except lp.LensprobeError as err:
            return "line 1 and" in str(err) and "line 4" in str(err)
        return any("line 1 and" in str(w.message) and "line 4" in str(w.message) for w in seen)

    cases.append(("disagreeing duplicate rows named", lambda: equals(warned, True)))
    for value in ("False", "0", -1, 0.5):
        df = pd.DataFrame({"condition": ["a", "b"], "problem_id": ["p", "p"], "sample": 0,
                           "math-verify": [value, False]})
        cases.append((f"accuracy on {value!r}", lambda df=df: refuses(lambda: lp.evals.accuracy(df,
                                                                                               grader="math-verify"))))
        cases.append((f"compare on {value!r}", lambda df=df: refuses(lambda: lp.evals.compare(df, "a", "b",
                                                                                             grader="math-verify"))))
    cases.append(("resume keeps every row", lambda: equals(lambda: len(lp.evaluate(
        tiny, probs, "w/o", out=base, max_new_tokens=2, model_name="tiny", progress=False)), 3)))
    return cases


def text_cases(tiny, work: Path) -> list[tuple[str, object]]:
    q = "--model tiny --question 'What is 2+3?'"
    cases = [(f"attention {a}", lambda a=a: cli(f"attention {q} --out {work}/t {a}")) for a in
             (f"--question 'What {BAD} is 2+3?'", f"--system 'S{BAD}'", f"--out '{work}/o{BAD}'")]
    cases += [(f"trace --question {BAD}", lambda: cli(f"trace --model tiny --question 'a{BAD}' --out {work}/t2")),
              (f"eval --data {BAD}", lambda: cli(f"eval --model tiny --data 'p{BAD}.jsonl' --out {work}/e")),
              (f"eval-report folder {BAD}", lambda: cli(f"eval-report '{work}/r{BAD}'")),
              (f"sweep --question {BAD}", lambda: cli(f"sweep --model tiny --question 'x{BAD}' --out {work}/s"))]
    for question in ("what \ud800 is", 123, None, "", b"bytes"):
        cases.append((f"build_prompt({question!r})", lambda question=question: refuses(
            lambda: lp.build_prompt(tiny, question))))
    cases.append(("build_prompt system surrogate", lambda: refuses(lambda: lp.build_prompt(tiny, "q", system=f"s{BAD}"))))
    cases.append(("Filler.text surrogate", lambda: refuses(lambda: lp.Filler.text(f"a{BAD}"))))

    def log_whole():
        path = write_error_log(f"lensprobe x {BAD}", f"Traceback {BAD}")
        return path.stat().st_size > 0 and path.read_bytes().decode("utf-8").startswith("lensprobe")

    cases.append(("error log with surrogates", lambda: equals(log_whole, True)))
    return cases


def size_cases(tiny, work: Path) -> list[tuple[str, object]]:
    q = "--model tiny --question 'What is 2+3?'"
    return [
        ("Filler.random_sentence(10**6) in build_prompt", lambda: refuses(
            lambda: lp.build_prompt(tiny, "q", filler=lp.Filler.random_sentence(10**6)))),
        ("random sentence of 200k tokens", lambda: equals(lambda: len(tiny.tokenizer.encode(
            random_sentence_text(tiny.tokenizer, 200_000), add_special_tokens=False)), 200_000)),
        ("--filler random --filler-count 1000000", lambda: cli(
            f"attention {q} --filler random --filler-count 1000000 --out {work}/a", preload=False)),
        ("--filler-count 10**11", lambda: cli(f"attention {q} --filler-count 100000000000 --out {work}/a")),
        ("question of 1 MB", lambda: refuses(lambda: lp.build_prompt(tiny, "x " * 500_000))),
        ("grade identical 1 MB", lambda: equals(lambda: lp.grade("x+" * 500_000 + "1", "x+" * 500_000 + "1"), True)),
        ("grade 1+...+1 (1000 terms)", lambda: equals(lambda: lp.grade("+".join(["1"] * 1000), "1000"), True)),
        ("grade slow input, timeout 1", lambda: equals(lambda: lp.grade("(10^{6})!", "1", timeout=1), None)),
        ("eval --max-new-tokens 10**12", lambda: cli(f"eval --model tiny --max-new-tokens 1000000000000 --out {work}/e")),
    ]


PRELOAD = [  # (command, bad values): each must exit 2 in one line before any model loads
    ("eval --model tiny --problems arithmetic --limit 2 --out {w}/e --max-new-tokens {}", ["0", "-5", "x"]),
    ("eval --model tiny --problems arithmetic --limit 2 --out {w}/e --batch-size {}", ["0", "-1"]),
    ("eval --model tiny --problems arithmetic --limit 2 --out {w}/e --n-samples {}", ["0", "2"]),
    ("eval --model tiny --problems arithmetic --limit 2 --out {w}/e --conditions {}", ["bogus", "''", "w/o,w/o"]),
    ("eval --model tiny --problems arithmetic --limit 2 --out {w}/e --sample --temperature {}",
     ["0", "-1", "nan", "inf", "1e-40"]),
    ("eval --model tiny --problems arithmetic --limit 2 --out {w}/e --sample --top-p {}", ["0", "1.5"]),
    ("eval --model tiny --problems arithmetic --limit {} --out {w}/e", ["0"]),
    ("eval --model tiny --data {} --out {w}/e", ["{w}", "/dev/null"]),
    ("eval --model tiny --problems arithmetic --out {w}/e --device {}", ["bogus", "cuda", "cuda:7"]),
    ("eval --model tiny --problems arithmetic --out {w}/e --ablate-heads {}", ["L٣H1", "L0Hx", "''", "','"]),
    ("eval --model tiny --problems arithmetic --out {w}/e --grade-timeout {}", ["0", "-1", "1.5", "x"]),
    ("eval --model tiny --problems arithmetic --out {}", ["''"]),
    ("attention --model tiny --question {} --out {w}/a", ["''", "'  '"]),
    ("attention --model tiny --question q --out {w}/a --heads {}", ["1,1", "=-1", "٣"]),
    ("attention --model tiny --question q --out {w}/a --layers {}", ["0,0", "-1"]),
    ("attention --model tiny --question q --out {w}/a --filler-count {}", ["0", "-3"]),
    ("attention --model tiny --question q --out {w}/a --no-system --system {}", ["SYS"]),
    ("sweep --model tiny --out {w}/s --metric {}", ["bogus", "logprob", "attention:"]),
    ("sweep --model tiny --out {w}/s --batch-size {}", ["0"]),
    ("mechanism --model tiny --question q --out {w}/m --bins {}", ["0"]),
    ("mechanism --model tiny --question q --out {w}/m --eps {}", ["-1", "nan"]),
    ("mechanism --model tiny --question q --out {w}/m --layer {}", ["-1"]),
    ("trace --model tiny --question q --out {w}/t --smooth {}", ["0"]),
    ("trace --model tiny --question q --out {w}/t --schedule {}", ["entropy:nan", "every:0"]),
    ("trace --model tiny --question q --out {w}/t --sample --temperature {}", ["inf"]),
    ("ablate --model tiny --question q --heads L0H1 --out {w}/b --top-k {}", ["0", "1000000"]),
    ("ablate --model tiny --question q --out {w}/b --heads {}", ["L٣H1", "''", "' , '"]),
    ("sweep --model tiny --out {w}/s --heads {}", ["''"]),
    ("demo --model tiny --quick --device {} --out {w}/d", ["cuda"]),
]


def preload_cases(tiny, work: Path) -> list[tuple[str, object]]:
    cases = []
    for template, values in PRELOAD:
        for v in values:
            argv = template.replace("{w}", str(work)).replace("{}", v.replace("{w}", str(work))).replace(" =", "=")
            cases.append((argv.split(" --out")[0][:70] + " " + v, lambda argv=argv: cli(argv)))
    return cases


def library_cases(tiny, work: Path) -> list[tuple[str, object]]:
    return [
        ("wilson_interval(nan, 4)", lambda: refuses(lambda: lp.evals.wilson_interval(math.nan, 4))),
        ("GenerationConfig temperature=1e-40", lambda: refuses(lambda: lp.GenerationConfig(4, do_sample=True,
                                                                                          temperature=1e-40))),
        ("GenerationConfig temperature=inf", lambda: refuses(lambda: lp.GenerationConfig(4, temperature=math.inf))),
        ("schedule entropy_above(nan)", lambda: refuses(lambda: lp.generation.schedule.entropy_above(math.nan))),
        ("parse_heads('L٣H1')", lambda: refuses(lambda: lp.ablate_heads("L٣H1").resolve(tiny))),
        ("load_model(device='bogus')", lambda: refuses(lambda: lp.load_model(tiny, device="bogus"))),
        ("evaluate answer None", lambda: refuses(lambda: lp.evaluate(tiny, [Problem("a", "q?", None)], "w/o",
                                                                     max_new_tokens=2, progress=False))),
        ("evaluate answer 7", lambda: refuses(lambda: lp.evaluate(tiny, [Problem("a", "q?", 7)], "w/o",
                                                                  max_new_tokens=2, progress=False))),
        ("grade(3, '3')", lambda: refuses(lambda: lp.grade(3, "3"))),
        ("grade timeout=0", lambda: refuses(lambda: lp.grade("1", "1", timeout=0))),
        ("check_heads -1 message", lambda: equals(lambda: _message(lambda: lp.core.models.loading.check_heads(tiny, [-1])),
                                                  True)),
        ("ablate_heads([])", lambda: refuses(lambda: lp.ablate_heads([]))),
        ("ablate_heads('')", lambda: refuses(lambda: lp.ablate_heads(""))),
        ("ablate_kv_group([])", lambda: refuses(lambda: lp.interventions.ablate_kv_group([]))),
        ("EvalConfig(grade_timeout=0)", lambda: refuses(lambda: lp.EvalConfig(grade_timeout=0))),
        ("EvalConfig(grade_timeout=2.5)", lambda: refuses(lambda: lp.EvalConfig(grade_timeout=2.5))),
        ("grade_timeout at its default keeps the identity", lambda: equals(
            lambda: identity(lp.EvalConfig(grade_timeout=5)) == identity(lp.EvalConfig()), True)),
    ]


def _disk_full_report(work: Path) -> bool:
    """The report's index.html meets a full disk: the error names it, no empty file is left."""
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.suffix == ".html":
            open(self, "w").close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    out = work / "report"
    Path.write_text = full
    try:
        lp.viz.write_report(out, [lp.viz.Section("A", data={"n": 1})])
    except lp.LensprobeError as err:
        return str(out / "index.html") in str(err) and not [p for p in out.rglob("*") if p.stat().st_size == 0]
    finally:
        Path.write_text = real
    return False


def _folder_deleted(tiny, out: Path, probs) -> bool:
    """The output folder is deleted after the first row: the run stops at the next one."""
    made, real = [], running.make_row

    def make_row(*args, **kwargs):
        if len(made) == 1:
            shutil.rmtree(out)
        made.append(1)
        return real(*args, **kwargs)

    running.make_row = make_row
    try:
        lp.evaluate(tiny, probs, "w/o", out=out, max_new_tokens=2, batch_size=1, model_name="tiny", progress=False)
    except lp.LensprobeError as err:
        return len(made) == 2 and f"output folder {out} was deleted" in str(err)
    finally:
        running.make_row = real
    return False


def _stale_lock_taken_over(tiny, out: Path, probs) -> bool:
    """A finished rank's lock left by a killed process: the resume takes it over, with one warning."""
    lp.evaluate(tiny, probs, "w/o", out=out, max_new_tokens=2, model_name="tiny", progress=False)
    lock = out / ".results-rank0.jsonl.lock"
    lock.write_text(json.dumps({"pid": int(Path("/proc/sys/kernel/pid_max").read_text()) + 1,
                                "host": socket.gethostname(), "since": "earlier"}))
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    logging.getLogger("lensprobe.core.storage.locks").addHandler(handler)
    try:
        lp.evaluate(tiny, probs, "w/o", out=out, max_new_tokens=2, model_name="tiny", progress=False)
    finally:
        logging.getLogger("lensprobe.core.storage.locks").removeHandler(handler)
    return seen.getvalue().count("took over a stale lock") == 1 and not lock.exists()


def _hub_offline(work: Path) -> str:
    real = hub.hub_endpoint
    hub.hub_endpoint = lambda: "http://127.0.0.1:9"
    try:
        return cli(f"eval --model tiny --data hub --limit 1 --out {work}/hub")
    finally:
        hub.hub_endpoint = real


def fault_cases(tiny, work: Path) -> list[tuple[str, object]]:
    probs = [Problem(id=f"q{i}", problem=f"What is {i}+{i}?", answer=str(2 * i)) for i in range(3)]
    far = lp.Condition("far", interventions=(lp.ablate_heads("L0H1", positions=[10_000]),))
    (work / "empty").mkdir()

    def refused_leaves(out: Path, want: list) -> bool:
        refuses(lambda: lp.evaluate(tiny, probs, [far], out=out, max_new_tokens=2, progress=False))
        return (sorted(p.name for p in out.iterdir()) if out.exists() else None) == want

    def timeout_recorded() -> int:
        cli(f"eval --model tiny --problems arithmetic --limit 1 --conditions w/o --max-new-tokens 2 --grade-timeout 9 "
            f"--no-progress --out {work}/gt", preload=False)
        return json.loads((work / "gt" / "config.json").read_text())["settings"]["generation"]["grade_timeout"]

    return [
        ("report on a full disk", lambda: equals(lambda: _disk_full_report(work), True)),
        ("output folder deleted mid-run", lambda: equals(lambda: _folder_deleted(tiny, work / "gone", probs), True)),
        ("stale lock of a finished rank", lambda: equals(lambda: _stale_lock_taken_over(tiny, work / "lock", probs),
                                                         True)),
        ("--data hub offline", lambda: _hub_offline(work)),
        ("refused run, new folder", lambda: equals(lambda: refused_leaves(work / "new", None), True)),
        ("refused run, empty folder", lambda: equals(lambda: refused_leaves(work / "empty", []), True)),
        ("--grade-timeout 9 recorded", lambda: equals(timeout_recorded, 9)),
    ]


def _message(fn) -> bool:
    try:
        fn()
    except lp.LensprobeError as err:
        return "negative" in str(err) and "is head -2" not in str(err)
    return False


def _damaged_folder(whole: Path, out: Path, damage) -> Path:
    shutil.copytree(whole, out)
    damage(out)
    return out


def _reweigh(change):
    def damage(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        weights = load_file(folder / "model.safetensors")
        change(weights)
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})

    return damage


def model_folder_cases(tiny, work: Path) -> list[tuple[str, object]]:
    """Round three, incomplete weights: each damaged folder is refused naming the problem (CLI: exit 2)."""
    import torch

    hf, tok = tiny_hf_model(seed=1, n_layers=1)
    whole = work / "whole"
    hf.save_pretrained(whole)
    tok.save_pretrained(whole)
    q_proj = "model.layers.0.self_attn.q_proj.weight"

    def cut(folder):
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])

    def config(change):
        return lambda f: (f / "config.json").write_text(json.dumps(change(json.loads((f / "config.json").read_text()))))

    damages = {"missing tensor": _reweigh(lambda w: w.pop(q_proj)),
               "tensor of another shape": _reweigh(lambda w: w.update({q_proj: torch.zeros(3, 3)})),
               "truncated model.safetensors": cut,
               "no tokenizer": lambda f: [p.unlink() for p in f.iterdir() if p.name.startswith("tokenizer")],
               "unknown model_type": config(lambda c: {**c, "model_type": "nosuchmodel"})}
    cases = []
    for name, damage in damages.items():
        folder = _damaged_folder(whole, work / name.replace(" ", "-"), damage)
        cases.append((f"load_model: {name}", lambda folder=folder: refuses(lambda: lp.load_model(folder, device="cpu"))))
        cases.append((f"attention --model: {name}", lambda folder=folder: cli(
            f"attention --model {folder} --question q --out {work}/a", preload=False)))
    return cases


def _not_a_file(path: Path, kind: str) -> Path:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(kind)
    return path


def not_a_file_cases(tiny, work: Path) -> list[tuple[str, object]]:
    """Round three, files that are not files: FIFOs and links to devices where lensprobe reads a file."""
    probs = [Problem(id=f"q{i}", problem=f"What is {i}+{i}?", answer=str(2 * i)) for i in range(2)]
    cases = []
    for kind in ("fifo", "/dev/zero", "/dev/full"):
        out = work / f"run-{len(cases)}"
        lp.evaluate(tiny, probs, "w/o", out=out, max_new_tokens=2, model_name="tiny", progress=False)
        conf = work / f"conf-{len(cases)}"
        shutil.copytree(out, conf)
        _not_a_file(results_file(out, 0), kind)
        cases.append((f"eval-report, results file {kind}", lambda out=out: cli(f"eval-report {out} --out {out}-r",
                                                                                 preload=False)))
        cases.append((f"resumed eval, results file {kind}", lambda out=out: refuses(lambda: lp.evaluate(
            tiny, probs, "w/o", out=out, max_new_tokens=2, model_name="tiny", progress=False))))
        _not_a_file(conf / "config.json", kind)
        cases.append((f"eval-report, config.json {kind}", lambda conf=conf: cli(f"eval-report {conf}", preload=False)))
        data = _not_a_file(work / f"problems-{len(cases)}.jsonl", kind)
        cases.append((f"eval --data {kind}", lambda data=data: cli(f"eval --model tiny --data {data} --out {work}/e")))
        recipe = _not_a_file(work / f"recipe-{len(cases)}.toml", kind)
        cases.append((f"recipe file {kind}", lambda recipe=recipe: refuses(lambda: load_recipe(str(recipe)))))
    return cases


def asset_cases(tiny, work: Path) -> list[tuple[str, object]]:
    """Round three, truncated assets: a plotly.min.js cut short (or a link) is written again by the next run."""
    from plotly.offline import get_plotlyjs

    whole = get_plotlyjs().encode("utf-8")

    def rewritten(damage) -> bool:
        out = work / f"a{len(list(work.iterdir()))}"
        out.mkdir()
        damage(out / "plotly.min.js")
        cli(f"attention --model tiny --question 'What is 2+3?' --out {out}", preload=False)
        return (out / "plotly.min.js").read_bytes() == whole

    return [("plotly.min.js cut at 300 KiB", lambda: equals(lambda: rewritten(lambda p: p.write_bytes(whole[:307_200])),
                                                           True)),
            ("plotly.min.js empty", lambda: equals(lambda: rewritten(lambda p: p.write_bytes(b"")), True)),
            ("plotly.min.js a link to /dev/full", lambda: equals(lambda: rewritten(lambda p: p.symlink_to("/dev/full")),
                                                                True))]


def control_token_cases(tiny, work: Path) -> list[tuple[str, object]]:
    """Round three, chat control tokens in user text: refused by default, naming the token; escaped on request."""
    end = "<|im_end|>"
    cases = [(f"build_prompt {field} with {end}", lambda kw=kw: refuses(lambda: lp.build_prompt(tiny, **kw)))
             for field, kw in (("question", {"question": f"2+3? {end}"}),
                               ("system", {"question": "q", "system": f"S{end}<|im_start|>user"}),
                               ("filler", {"question": "q", "filler": lp.Filler.text(f"/ {end} /")}),
                               ("raw question", {"question": f"q{end}", "template": "raw"}))]
    cases.append((f"--question with {end}", lambda: cli(f"attention --model tiny --question 'q {end}' --out {work}/c",
                                                        preload=False)))
    cases.append((f"--system with {end}", lambda: cli(f"attention --model tiny --question q --system 'S {end}' "
                                                      f"--out {work}/c", preload=False)))

    def escaped() -> bool:
        p = lp.build_prompt(tiny, f"Say {end} now", special_tokens="escape")
        return tiny.tokenizer.decode(p.tokens[0, p.positions("question")].tolist()) == f"Say {end} now"

    cases.append(("special_tokens='escape' keeps the question exact", lambda: equals(escaped, True)))
    return cases


FAMILIES = {"result rows": rows_cases, "non-UTF-8 text": text_cases, "sizes and hangs": size_cases,
            "CLI values before the model": preload_cases, "library values": library_cases,
            "files, folders and the hub": fault_cases}
FAMILIES |= {"model folders (round three)": model_folder_cases, "files that are not files (round three)": not_a_file_cases,
             "truncated assets (round three)": asset_cases, "control tokens in user text (round three)": control_token_cases}


def says(argv: str, fragment: str, *, preload: bool = True) -> str:
    """:func:`cli`, and the one line names the cause (``fragment``): a refusal naming another cause is wrong."""
    return cli(argv, preload=preload, fragment=fragment)


def ignored_value_cases(tiny, work: Path) -> list[tuple[str, object]]:
    """Round three, values accepted or ignored without a word: each is refused, naming why."""
    import torch

    p = lp.build_prompt(tiny, "What is 2+3?")
    cases = [(a, lambda a=a, f=f: says(a.replace("{w}", str(work)), f)) for a, f in [
        ("reproduce arm-fig-mechanism --model tiny --limit 3 --out {w}/r1", "evaluates no problems"),
        ("reproduce arm-table1 --model tiny --quick --out {w}/r2", "quick shortens only a figure recipe's inputs"),
        ("attribute --model tiny --sample 3 --verify 0 --out {w}/a1", "but verify is 0"),
        ("attribute --model tiny --answer 7 --out {w}/a2", "reads no answer"),
        ("attribute --model tiny --tokens 7,8 --out {w}/a3", "reads no tokens"),
        ("sweep --model tiny --answer 7 --out {w}/s1", "reads no answer"),
        ("sweep --model tiny --tokens 7,8 --out {w}/s2", "reads no tokens"),
        ("attention --model tiny --question '\u200b\u200b' --out {w}/t1", "only invisible characters"),
        ("trace --model tiny --question '\ufeff' --out {w}/t2", "only invisible characters")]]
    cases += [
        ("build_prompt('\\u200b')", lambda: refuses(lambda: lp.build_prompt(tiny, "\u200b"))),
        ("Problem of '\\ufeff' in evaluate", lambda: refuses(lambda: lp.evaluate(
            tiny, [Problem("a", "\ufeff", "1")], "w/o", max_new_tokens=2, progress=False))),
        ("GenerationConfig temperature=True", lambda: refuses(lambda: lp.GenerationConfig(4, do_sample=True,
                                                                                         temperature=True))),
        ("GenerationConfig top_p=True", lambda: refuses(lambda: lp.GenerationConfig(4, do_sample=True, top_p=True))),
        ("sweep, complex metric", lambda: refuses(lambda: lp.ablation_sweep(
            tiny, p, lambda lg, q: lg[:, -1, 0].to(torch.complex64), heads="L0H0", progress=False))),
        ("attribute_heads, complex metric", lambda: refuses(lambda: lp.attribute_heads(
            tiny, p, lambda lg, q: lg[:, -1, 0].to(torch.complex64)))),
        ("sweep entropy with answers", lambda: refuses(lambda: lp.ablation_sweep(tiny, p, "entropy", answers="5",
                                                                                 heads="L0H0", progress=False))),
    ]
    return cases


def _nan_model_eval(work: Path) -> str:
    """``eval`` on a tiny model with one NaN weight: refused as NaN logits, before any generation."""
    import torch

    nan = tiny_model(seed=0)
    with torch.no_grad():
        next(w for n, w in nan.named_parameters() if "q_proj" in n)[0, 0] = float("nan")
    real = common.tiny_model
    common.tiny_model = lambda seed=0: nan
    try:
        return says(f"eval --model tiny --problems arithmetic --limit 1 --conditions w/o --max-new-tokens 2 "
                    f"--no-progress --out {work}/nan", "NaN or inf logits", preload=False)
    finally:
        common.tiny_model = real


def misleading_refusal_cases(tiny, work: Path) -> list[tuple[str, object]]:
    """Round three, refusals that named the wrong cause, or came after all the work."""
    recipe = work / "long.toml"
    recipe.write_text('title = "long filler"\nkind = "table"\nbenchmarks = ["math500"]\nconditions = ["w/o", '
                      '"w/ long"]\n[define."w/ long"]\nbase = "w/ Mless"\ncount = 400\n', encoding="utf-8")
    started = []
    real = running.make_row

    def long_condition() -> str:
        running.make_row = lambda *a, **k: started.append(1) or real(*a, **k)
        try:
            out = says(f"reproduce {recipe} --model tiny --limit 2 --max-new-tokens 2 --no-progress --out {work}/rl",
                       "fits no problem in the model's context", preload=False)
        finally:
            running.make_row = real
        return out if not started else "silent wrong"

    return [("eval, a NaN weight", lambda: _nan_model_eval(work)),
            ("reproduce, a condition longer than the context", long_condition)]


def _file_size_limit(work: Path) -> str:
    """``--model tiny`` set up under ``ulimit -f 4`` (Python ignores SIGXFSZ: writes fail with EFBIG)."""
    import resource

    from lensprobe.core.models import testing

    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    testing.tiny_tokenizer.cache_clear()
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, before[1]))
    try:
        return says(f"attention --model tiny --question q --out {work}/ul", "ulimit -f", preload=False)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
        testing.tiny_tokenizer.cache_clear()


def traceback_cases(tiny, work: Path) -> list[tuple[str, object]]:
    """Round three, what ended in a traceback: each is one line (CLI: exit 2) before any work."""
    (work / "latin.toml").write_bytes('title = "caf\u00e9"\nkind = "figure"\nfigure = "mechanism"\n'.encode("latin-1"))
    (work / "p16.jsonl").write_text('{"problem": "What is 1+1?", "answer": "2"}\n', encoding="utf-16")
    (work / "psur.jsonl").write_text('{"problem": "What is 1+1?", "answer": "2\\udcff"}\n', encoding="utf-8")
    for name, file in (("mlist", "config.json"), ("plist", "recipe.json")):
        (work / name).mkdir()
        (work / name / file).write_text("[1, 2]", encoding="utf-8")
    bad = [[1, 2, int(tiny.cfg.d_vocab) + 5]]
    p = lp.build_prompt(tiny, "What is 2+3?")
    cases = [(a, lambda a=a, f=f, pre=pre: says(a.replace("{w}", str(work)), f, preload=pre)) for a, f, pre in [
        ("reproduce {w}/latin.toml --model tiny --out {w}/rl", "is not UTF-8 text", True),
        ("eval --model tiny --data {w}/p16.jsonl --out {w}/e1", "is not UTF-8 text", True),
        ("eval --model tiny --data {w}/psur.jsonl --max-new-tokens 2 --out {w}/e2", "holds a lone surrogate", True),
        ("attention --model {w}/mlist --question q --out {w}/a1", "config.json", False),
        ("reproduce arm-fig-mechanism --model tiny --out {w}/plist", "is not a recipe record", True)]]
    cases += [
        ("--model tiny under ulimit -f 4", lambda: _file_size_limit(work)),
        ("forward, token id outside the vocabulary", lambda: refuses(lambda: lp.forward(tiny, bad))),
        ("attribute_heads, token id outside the vocabulary", lambda: refuses(lambda: lp.attribute_heads(
            tiny, bad, "entropy"))),
        ("sweep, metric returning None", lambda: refuses(lambda: lp.ablation_sweep(
            tiny, p, lambda lg, q: None, heads="L0H0", progress=False))),
        ("attribute_heads, metric returning a string", lambda: refuses(lambda: lp.attribute_heads(
            tiny, p, lambda lg, q: "high"))),
    ]
    return cases


FAMILIES |= {"values ignored (round three)": ignored_value_cases,
             "misleading refusals (round three)": misleading_refusal_cases,
             "tracebacks (round three)": traceback_cases}


def main_() -> int:
    tiny = tiny_model(seed=0)
    table, failures = {}, []
    signal.signal(signal.SIGALRM, _alarm)
    with tempfile.TemporaryDirectory() as tmp:
        for family, make in FAMILIES.items():
            work = Path(tmp) / family.replace(" ", "-")
            work.mkdir()
            counts = Counter()
            for name, case in make(tiny, work):
                signal.alarm(60)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        outcome = case()
                except Hang:
                    outcome = "hang"
                finally:
                    signal.alarm(0)
                counts[outcome] += 1
                if outcome != "handled":
                    failures.append((family, name, outcome))
            table[family] = counts
    cols = ["handled", "silent wrong", "traceback", "hang", "lost"]
    print("| family | tried | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * (len(cols) + 1))
    for family, c in table.items():
        print(f"| {family} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in cols) + " |")
    total = sum(table.values(), Counter())
    print(f"| all | {sum(total.values())} | " + " | ".join(str(total[k]) for k in cols) + " |")
    for family, name, outcome in failures:
        print(f"not handled: {family}: {name}: {outcome}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main_())
