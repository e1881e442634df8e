"""The suite's warning policy (pyproject ``filterwarnings``): a warning lensprobe issues fails the test,
third-party warnings are shown, and nothing silences warnings wholesale."""

import re
import warnings
from pathlib import Path

import pytest


def test_a_lensprobe_warning_is_an_error():
    with pytest.raises(UserWarning, match="from lensprobe"):
        warnings.warn_explicit("from lensprobe", UserWarning, "lensprobe/core/models.py", 1,
                               module="lensprobe.core.models")


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
