"""The codebase's shape, checked so it stays changeable: modules of at most 450 lines (those of folders
already split by concern at most 420), functions of at most 60 lines of code, imports that flow one way
by role in exactly the order CONTRIBUTING.md writes (its first code block: the core's concerns, then
interventions -> generation -> experiments -> studies, evals -> viz -> app) with no import circle, and no
type check on a concrete intervention outside its own module (the loop and harness read capabilities
instead)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lensprobe"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def written_order() -> dict[str, int]:
    """Role -> rank from CONTRIBUTING.md's first code block (``a -> b, c -> d``: b and c side by side)."""
    block = re.search(r"```\n(.*?)```", (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"), re.DOTALL)
    assert block, "CONTRIBUTING.md has no code block with the import order"
    steps = [s.strip() for s in block.group(1).replace("\n", " ").split("->")]
    return {role.strip(): rank for rank, step in enumerate(steps) for role in step.split(",")}


RANK = written_order()


def role_of(module: str) -> str | None:
    """``core.<concern>`` for a module of a core subpackage, ``core`` for the core's base modules, else the
    top-level folder (``None``: the package itself)."""
    parts = module.split(".")[1:]
    if not parts:
        return None
    if parts[0] == "core":
        return f"core.{parts[1]}" if len(parts) > 1 and f"core.{parts[1]}" in RANK else "core"
    return parts[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def code_lines(node: ast.AST, source: list[str]) -> int:
    """Lines of code in ``node``: blank lines, comments and its docstring left out."""
    body = getattr(node, "body", [])
    doc = (body[0].lineno, body[0].end_lineno) if body and isinstance(body[0], ast.Expr) and isinstance(
        getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str) else (0, -1)
    end = node.end_lineno or node.lineno
    return sum(1 for n in range(node.lineno, end + 1)
               if not doc[0] <= n <= doc[1] and source[n - 1].strip() and not source[n - 1].strip().startswith("#"))


def imports_of(path: Path) -> set[str]:
    """lensprobe modules ``path`` imports at module level (not inside functions)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        nodes = [node] if not isinstance(node, ast.If) else node.body  # TYPE_CHECKING blocks count too
        for n in nodes:
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("lensprobe") and n.level == 0:
                names.add(n.module)
            elif isinstance(n, ast.Import):
                names.update(a.name for a in n.names if a.name.startswith("lensprobe"))
    return names


def test_modules_are_at_most_450_lines():
    long = {module_name(p): n for p in MODULES if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these modules by concern: {long}"


# No module is packed to the cap: each keeps room under it, so a module is split when it needs to, not
# trimmed to fit it (the cap is never raised).
HEADROOM = 30


def test_every_module_keeps_room_under_the_module_cap():
    packed = {module_name(p): n for p in MODULES if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES - HEADROOM}
    assert packed == {}, (f"these modules are within {HEADROOM} lines of the {MAX_MODULE_LINES}-line cap: "
                          f"split them by concern (one module per thing they hold): {packed}")


MAX_FOLDER_MODULES = 16


def test_no_folder_holds_more_than_16_modules():
    """A folder past 16 modules is split into rooms that say what they hold (``evals/problems``, ...)."""
    counts: dict[str, int] = {}
    for p in MODULES:
        if p.name != "__init__.py":
            folder = ".".join(p.parent.relative_to(PACKAGE.parent).parts)
            counts[folder] = counts.get(folder, 0) + 1
    crowded = {f: n for f, n in counts.items() if n > MAX_FOLDER_MODULES}
    assert crowded == {}, f"split these folders by concern (at most {MAX_FOLDER_MODULES} modules each): {crowded}"
    assert counts["lensprobe.evals.running"] >= 1  # the count sees subfolders


def test_functions_are_at_most_60_lines_of_code():
    long = {}
    for path in MODULES:
        source = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(source))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = code_lines(node, source)
                if n > MAX_FUNCTION_LINES:
                    long[f"{module_name(path)}.{node.name}"] = n
    assert long == {}, f"split these functions: {long}"


def test_the_checker_counts_code_lines_only():
    source = 'def f(x):\n    """Doc.\n\n    More."""\n    # a comment\n\n    y = x\n    return y\n'.splitlines()
    fn = ast.parse("\n".join(source)).body[0]
    assert code_lines(fn, source) == 3


def test_every_folder_has_its_place_in_the_written_order():
    folders = {role_of(module_name(p)) for p in MODULES if p.parent != PACKAGE}  # __init__, __main__: the package
    assert folders <= set(RANK), f"add these to CONTRIBUTING.md's import order: {sorted(folders - set(RANK))}"
    assert RANK["core"] < RANK["core.storage"] < RANK["core.measures"] < RANK["interventions"] < RANK["app"]


def test_imports_flow_one_way_by_role_and_form_no_circle():
    graph = {module_name(p): imports_of(p) for p in MODULES}
    upward = []
    for mod, deps in graph.items():
        role = role_of(mod)
        for dep in deps:
            dep_role = role_of(dep)
            if role in RANK and dep_role in RANK and RANK[dep_role] > RANK[role]:
                upward.append((mod, dep))
    assert upward == []
    # no circle among modules (package __init__ files re-export and are left out)
    edges = {m: {d for d in deps if d in graph and not (PACKAGE.parent / Path(*d.split("."), "__init__.py")).exists()}
             for m, deps in graph.items() if not (PACKAGE.parent / Path(*m.split("."), "__init__.py")).exists()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in edges.get(m, ()):
            if state.get(d) == 1:
                pytest.fail(f"import circle: {' -> '.join([*path[path.index(d):], d])}")
            if d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in edges:
        if m not in state:
            visit(m, [m])


def test_no_type_check_on_a_concrete_intervention_outside_its_module():
    concrete = {"ARM": "lensprobe.interventions.arm", "HeadAblation": "lensprobe.interventions.ablation"}
    found = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} if len(node.args) > 1 else set()
                for cls in names & set(concrete):
                    if module_name(path) != concrete[cls]:
                        found.append((module_name(path), cls))
    assert found == []


def private_names_crossing(path: Path, modules: set[str], own: str) -> list[str]:
    """``from lensprobe.x import _name`` and ``lensprobe.x._name`` (through any import of the module) in
    ``path`` (module ``own``): a private name of another file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    private = re.compile(r"_(?!_)")  # one leading underscore; dunders such as __version__ are public
    modules_by_alias: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lensprobe":
            for alias in node.names:
                if private.match(alias.name):
                    found.append(f"from {node.module} import {alias.name}")
                if f"{node.module}.{alias.name}" in modules:
                    modules_by_alias[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "lensprobe":
                    modules_by_alias[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or "lensprobe"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private.match(node.attr):
            dotted = ast.unparse(node.value)
            head, _, rest = dotted.partition(".")
            module = modules_by_alias.get(head, head) + (f".{rest}" if rest else "")
            if module in modules and module != own:
                found.append(f"{module}.{node.attr}")
    return found


def test_no_private_name_crosses_a_file():
    modules = {module_name(p) for p in MODULES}
    crossing = {str(p.relative_to(ROOT)): found for p in MODULES 
                if (found := private_names_crossing(p, modules, module_name(p)))}
    assert crossing == {}, f"private names used from another file (make them public where they live): {crossing}"


def test_the_private_name_check_sees_both_spellings(tmp_path):
    modules = {"lensprobe.experiments.sweep", "lensprobe.experiments"}
    source = tmp_path / "user.py"
    source.write_text("from lensprobe.experiments.sweep import _CHUNK, sweep_prompt\n"
                      "from lensprobe.experiments import sweep\nimport lensprobe.experiments.sweep as sw\n"
                      "sweep._cost(1)\nsw._cost(2)\nsweep.__doc__\nsweep_prompt._cache\n", encoding="utf-8")
    assert private_names_crossing(source, modules, "lensprobe.user") == [
        "from lensprobe.experiments.sweep import _CHUNK", "lensprobe.experiments.sweep._cost",
        "lensprobe.experiments.sweep._cost"]
WRITER = "lensprobe.core.storage.writer"
WRITES = {"write_text", "write_bytes", "write_json", "write_html", "to_csv", "to_parquet", "write_image",
          "write_images", "savefig", "write_table"}
OS_CALLS = {"remove", "unlink", "replace", "rename", "rmdir", "removedirs"}
# (module, call) pairs that write or delete outside the writer on purpose, and why
RAW_ALLOWED = {
    ("lensprobe.core.storage.files", "os.open"): "the checked reader, which opens read-only (O_RDONLY)",
    ("lensprobe.app.commands.attribution", ".to_csv"): "lensprobe's own to_csv, which writes through atomic_file",
    ("lensprobe.app.commands.heads", ".to_csv"): "lensprobe's own to_csv, which writes through atomic_file",
}


def _raw_call(node: ast.Call) -> str | None:
    """The raw write, rename or delete ``node`` makes (``None``: not one). A write into ``tmp``, the
    temporary file the writer hands out, is the writer's own."""
    func = node.func
    first = node.args[0] if node.args else None
    into_tmp = isinstance(first, ast.Name) and first.id == "tmp"
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else ""
        if owner in ("os", "shutil") and (func.attr in OS_CALLS or func.attr == "rmtree"):
            return f"{owner}.{func.attr}"
        if (owner, func.attr) in (("os", "open"), ("tempfile", "mkstemp")):
            return f"{owner}.{func.attr}"  # a file or folder made in place: row and lock files go through open_in
        if owner == "tmp":
            return None
        if func.attr in ("unlink", "rmdir"):
            return f".{func.attr}"
        if func.attr == "rename" and len(node.args) == 1 and not node.keywords and not isinstance(first, ast.Constant):
            return ".rename"
        if func.attr in WRITES and len(node.args) == 1 and not into_tmp:
            return f".{func.attr}"
    if isinstance(func, ast.Name) and func.id == "open" and len(node.args) > 1:
        mode = node.args[1]
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
            return "open"
    return None


def test_every_write_and_delete_goes_through_the_one_writer():
    """A module that writes, renames or deletes a file itself (not through
    :mod:`lensprobe.core.storage.writer`) could leave its folder or overwrite another output."""
    found = []
    for path in MODULES:
        module = module_name(path)
        if module == WRITER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            raw = _raw_call(node) if isinstance(node, ast.Call) else None
            if raw and (module, raw) not in RAW_ALLOWED:
                found.append(f"{module}:{node.lineno} {raw}")
    assert found == [], f"write or delete these through lensprobe.core.storage.writer: {found}"


def test_the_raw_write_check_sees_each_kind():
    source = ("p.unlink()\nshutil.rmtree(p)\nos.replace(a, b)\np.write_text('x')\ndf.to_csv(path)\n"
              "open(p, 'w')\np.rename(q)\ndf.to_csv(tmp)\nout.write_text('a.csv', 'x')\ns.rename('x')\n"
              "os.open(p, os.O_CREAT)\ntempfile.mkstemp(dir=d)\n")
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    assert sorted(filter(None, map(_raw_call, calls))) == sorted(
        [".unlink", "shutil.rmtree", "os.replace", ".write_text", ".to_csv", "open", ".rename", "os.open",
         "tempfile.mkstemp"])
