"""The suite's warning policy (pyproject ``filterwarnings`` and the autouse fixture in tests/conftest.py):
a warning lensprobe issues fails the test, third-party warnings are shown, and nothing silences warnings
wholesale."""

import ast
import re
import sys
import warnings
from pathlib import Path

import pytest

import lensprobe as lp
from lensprobe.core.errors import LensprobeWarning


def test_a_warning_from_a_real_lensprobe_call_is_an_error(tiny):
    """ARM with whole-batch statistics warns through its hook (stacklevel names a frame outside
    lensprobe): the warning still fails a test that does not expect it."""
    arm = lp.ARM(c=0.1, percentile=95, per_row=False)
    tokens = lp.build_prompt(tiny, "What is 2+2?").tokens.expand(2, -1)
    with pytest.raises(LensprobeWarning, match="per_row=False"):
        lp.forward(tiny, tokens, arm)


def test_every_warning_lensprobe_issues_is_a_lensprobe_warning():
    """Every ``warnings.warn`` in the package names a category, and every category is a LensprobeWarning."""
    package = ROOT / "lensprobe"
    categories = set()
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "warn" \
                    and getattr(node.func.value, "id", None) == "warnings":
                assert len(node.args) >= 2 or any(k.arg == "category" for k in node.keywords), \
                    f"{path.relative_to(ROOT)}:{node.lineno}: name the warning's category"
                category = node.args[1] if len(node.args) >= 2 else next(k.value for k in node.keywords
                                                                          if k.arg == "category")
                categories.add(ast.unparse(category))
    classes = {name: value for module, loaded in list(sys.modules.items()) if module.startswith("lensprobe")
               for name, value in vars(loaded).items() if isinstance(value, type)}
    assert categories and all(issubclass(classes[c], LensprobeWarning) for c in categories), categories


def test_a_third_party_warning_is_shown_not_raised():
    with pytest.warns(DeprecationWarning, match="from elsewhere"):
        warnings.warn_explicit("from elsewhere", DeprecationWarning, "other.py", 1, module="other")


ROOT = Path(__file__).resolve().parents[1]
BLANKET = re.compile(
    r"""simplefilter\(\s*["']ignore["']"""  # warnings.simplefilter("ignore")
    r"""|filterwarnings\(\s*["']ignore(::\w*)?["']\s*[,)]"""  # filterwarnings("ignore") / ("ignore::Warning")
)


def test_no_other_configuration_file_overrides_the_policy():
    """pytest.ini, tox.ini or setup.cfg would take precedence over pyproject.toml's filterwarnings."""
    assert not [name for name in ("pytest.ini", "tox.ini", "setup.cfg", "tests/pytest.ini")
                if (ROOT / name).exists()]


def test_no_test_silences_warnings_wholesale():
    here = Path(__file__).resolve()
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path != here:
            lines = path.read_text(encoding="utf-8").splitlines()
            offenders += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(lines, 1) if BLANKET.search(line)]
    assert offenders == [], f"blanket warning filters: {offenders}"
    assert BLANKET.search('warnings.simplefilter("ignore")') and BLANKET.search("filterwarnings('ignore')")
    assert BLANKET.search('@pytest.mark.filterwarnings("ignore::DeprecationWarning")')
    assert not BLANKET.search('filterwarnings("ignore:the message:FutureWarning")')
