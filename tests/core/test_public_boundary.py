"""The public boundary: what escapes a public function or command is one line of lensprobe's own error
family (the original chained and, where Python allows, still its class); deep data, damaged settings,
unwritable folders, figure exports and lm-eval's errors among the inputs it covers."""

import importlib
import inspect
import json

import pytest

import lensprobe as lp
from lensprobe.app.cli import main
from lensprobe.core.boundary import public_function
from lensprobe.core.errors import LensprobeError, UnexpectedError
from lensprobe.core.storage.jsonable import json_digest
from lensprobe.core.storage.nesting import MAX_NESTING, parse_json, parse_toml
from lensprobe.core.storage.runconfig import open_run, read_run

NAMESPACES = ("models", "prompts", "interventions", "metrics", "generation", "experiments", "studies", "evals", "viz")
DEEP = 100_000


def public_functions() -> dict[str, object]:
    names = {f"lp.{n}": getattr(lp, n) for n in lp.__all__}
    for ns in NAMESPACES:
        module = importlib.import_module(f"lensprobe.{ns}")
        names.update({f"lp.{ns}.{n}": getattr(module, n) for n in module.__all__})
    return {k: v for k, v in names.items() if inspect.isfunction(v)}


def test_every_public_function_is_behind_the_boundary_and_keeps_its_face():
    functions = public_functions()
    assert len(functions) > 50
    for path, fn in functions.items():
        assert getattr(fn, "__lensprobe_boundary__", False), f"{path} is not behind the boundary"
        raw = fn.__wrapped__
        assert (fn.__name__, fn.__doc__, inspect.signature(fn)) == (raw.__name__, raw.__doc__, inspect.signature(raw))
    assert lp.generate is lp.generation.generate and lp.reproduce is lp.reproduce


def _raising(exc: BaseException):
    def fn(x=1):
        """Raises."""
        raise exc

    return public_function(fn, "lp.demo.fn")


@pytest.mark.parametrize("exc, kind", [(KeyError("n_rows"), KeyError), (TypeError("bad"), TypeError),
                                       (RecursionError("deep"), RecursionError),
                                       (PermissionError(13, "Permission denied", "/ro/x"), PermissionError),
                                       (OSError(28, "No space left on device", "/full/x"), OSError)])
def test_an_unexpected_exception_becomes_one_chained_line_still_of_its_class(exc, kind):
    with pytest.raises(UnexpectedError) as info:
        _raising(exc)()
    err = info.value
    assert isinstance(err, LensprobeError) and isinstance(err, kind) and err.__cause__ is exc
    assert "\n" not in str(err) and str(err).startswith("lp.demo.fn: ")
    if isinstance(exc, OSError):
        assert err.filename == exc.filename and exc.filename in str(err)


@pytest.mark.parametrize("exc", [LensprobeError("mine"), KeyboardInterrupt(), SystemExit(3), lp.LensprobeWarning("w")])
def test_lensprobe_errors_warnings_interrupts_and_exits_pass_unchanged(exc):
    with pytest.raises(type(exc)) as info:
        _raising(exc)()
    assert info.value is exc


def test_nesting_deeper_than_the_limit_is_refused_in_one_line():
    assert parse_json("[" * MAX_NESTING + "]" * MAX_NESTING, "x") is not None
    for text in ("[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1), "[" * DEEP + "]" * DEEP):
        with pytest.raises(LensprobeError, match=f"x nests data deeper than {MAX_NESTING} levels"):
            parse_json(text, "x")
    with pytest.raises(LensprobeError, match="deeper than"):
        parse_toml("a = " + "[" * DEEP + "]" * DEEP, "x")


def test_a_deep_config_json_a_problem_file_and_a_recipe_are_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("[" * DEEP + "]" * DEEP)
    with pytest.raises(LensprobeError, match="config.json nests data deeper"):
        read_run(tmp_path / "run")
    (tmp_path / "p.jsonl").write_text('{"problem": ' + "[" * DEEP + "]" * DEEP + "}\n")
    with pytest.raises(LensprobeError, match="p.jsonl line 1 nests data deeper"):
        lp.evals.load_problems(tmp_path / "p.jsonl")
    (tmp_path / "r.toml").write_text("title = 'x'\nnotes = " + "[" * DEEP + "]" * DEEP + "\n")
    with pytest.raises(LensprobeError, match="r.toml nests data deeper"):
        lp.load_recipe(tmp_path / "r.toml")


@pytest.mark.parametrize("edit, named", [({"kind": 3}, "a text 'kind'"), ({"parts": {"a": [1]}}, "an object for part 'a'"),
                                         ({"labels": "x"}, "an object 'labels'")])
def test_a_config_json_with_entries_of_the_wrong_type_is_refused(tmp_path, edit, named):
    open_run(tmp_path, "patch", {"n": 1}, parts={"a": {"x": 1}})
    config = {k: v for k, v in json.loads((tmp_path / "config.json").read_text()).items() if k != "digest"}
    edited = {**config, **edit}  # edited with its digest made again, so the check of each entry's type is reached
    (tmp_path / "config.json").write_text(json.dumps({**edited, "digest": json_digest(edited)}))
    with pytest.raises(LensprobeError, match=f"lacks {named}: it was edited or damaged"):
        open_run(tmp_path, "patch", {"n": 1})


def test_an_unwritable_report_folder_is_one_error_naming_it(tmp_path, monkeypatch):
    import lensprobe.core.storage.writer as writer

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "report"))

    monkeypatch.setattr(writer.OutputFolder, "write_text", denied)
    with pytest.raises(LensprobeError, match=r"lp.viz.write_report: permission denied on .*report: choose a folder"):
        lp.viz.write_report(tmp_path / "report", [lp.viz.Section("A", "text")])


def test_saving_what_is_no_figure_names_the_function_and_the_fix(tmp_path):
    with pytest.raises(LensprobeError, match=r"lp.viz.save: unexpected AttributeError: .*help\(lp.viz.save\)") as info:
        lp.viz.save("not a figure", tmp_path / "x.html")
    assert isinstance(info.value, AttributeError) and not (tmp_path / "x.html").exists()


def test_an_unknown_published_table_is_refused_when_the_recipe_loads(tmp_path):
    (tmp_path / "r.toml").write_text('benchmarks = ["math500"]\nconditions = ["w/o"]\ntable = "99"\n')
    with pytest.raises(LensprobeError, match=r"r.toml: no table '99' in lensprobe's data of arXiv 2510.01032"):
        lp.load_recipe(tmp_path / "r.toml")


def test_lm_eval_errors_become_one_line_naming_the_task(tiny):
    from lensprobe.evals.lmeval import lm_eval_accuracy

    with pytest.raises(LensprobeError, match=r"lm-eval on no_such_task under 'w/o': KeyError: .*lm_eval --tasks list"):
        lm_eval_accuracy(tiny, ["no_such_task"], limit=1)


def test_the_command_prints_tracebacks_only_under_debug_or_its_variable(tmp_path, monkeypatch, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("[" * DEEP + "]" * DEEP)
    argv = ["eval-report", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nests data deeper" in err and "Traceback" not in err
    monkeypatch.setenv("LENSPROBE_DEBUG", "1")
    assert main(argv) == 2
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.delenv("LENSPROBE_DEBUG")
    assert main(["--debug", *argv]) == 2
    assert "Traceback" in capsys.readouterr().err
