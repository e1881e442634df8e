"""What every ``lensprobe`` subcommand shares: the ``--model`` and prompt arguments, loading the
model (with a progress bar), parsing lists, checking ``--out`` folders, writing figures and listing
written files."""

import argparse
import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from lensprobe.app.checks import FILLER_ALIASES as FILLER_ALIASES
from lensprobe.app.checks import filler_condition as filler_condition
from lensprobe.app.checks import int_list as int_list  # the list parsers' old home
from lensprobe.app.checks import str_list as str_list
from lensprobe.app.option_groups import ModelOptions
from lensprobe.app.parsing import add_config
from lensprobe.core.errors import LensprobeError
from lensprobe.core.models.loading import load_model
from lensprobe.core.models.testing import tiny_model
from lensprobe.core.progress import tqdm
from lensprobe.core.prompts.prompt import MATH_SYSTEM_PROMPT
from lensprobe.core.storage.outfolder import lock_folder, replace_pages
from lensprobe.core.storage.store import atomic_file
from lensprobe.core.storage.writer import probe_write, remove_empty_folder
from lensprobe.studies.settings import parse_layers as layer_list  # noqa: F401  (its old home)
from lensprobe.viz.report import check_report_listing

TEST_MODEL = "tiny"
"""``--model tiny``: lensprobe's tiny random test model (seeded; answers are gibberish)."""

def add_model_argument(parser) -> None:
    """``--model``, ``--device``, ``--dtype`` (:class:`~lensprobe.app.option_groups.ModelOptions`) on a
    :class:`~lensprobe.app.parsing.ConfigParser`."""
    add_config(parser, ModelOptions, "ModelOptions")


def add_inputs(parser, *groups: type) -> None:
    """The options of the dataclasses ``groups`` (:mod:`lensprobe.app.option_groups`, and the settings
    several commands share: :class:`~lensprobe.experiments.head_settings.HeadSelection`, ...), each under
    ``args.<class name>`` (``args.ModelOptions.model``)."""
    for cls in groups:
        add_config(parser, cls, cls.__name__)


def out_of(args, command: str) -> Path:
    """The ``--out`` folder: the one given, else ``lensprobe-<command>``."""
    out = args.OutputOptions.out
    return out if out is not None else Path(f"lensprobe-{command}")


def system_of(args) -> str | None:
    """The system prompt the ``--system``/``--no-system`` arguments ask for."""
    options = args.SystemOptions
    if options.no_system:
        return None
    return MATH_SYSTEM_PROMPT if options.system is None else options.system


def load_cli_model(args: argparse.Namespace, *, progress: bool = True):
    """The model ``--model`` names (``tiny``: the test model, else anything :func:`lensprobe.load_model`
    takes), on ``--device`` in ``--dtype``."""
    options: ModelOptions = args.ModelOptions
    name, device, dtype = options.model, options.device, options.dtype
    with tqdm(total=1, desc="loading model", leave=False, disable=not progress) as bar:
        if name == TEST_MODEL:
            model = load_model(tiny_model(seed=0), device=device, dtype=dtype)
        else:
            model = load_model(name, device=device, dtype=dtype)
        bar.update()
    return model


OUTPUT_KINDS: dict[str, tuple[str, ...]] = {
    "attention": ("attention_received.json",),
    "ablate": ("ablation.json",),
    "sweep": ("sweep.json",),
    "attribution": ("attribution.json",),
    "find_heads": ("find_heads.json",),
    "patch_heads": ("patch_heads.json",),
    "trace": ("summary.csv", "texts.csv"),
    "mechanism": ("mechanism.json",),
    "sinks": ("sinks.json",),
    "eval": ("config.json",),
    "report": ("report.json",),
    "reproduce": ("table.md", "figure.md"),
}
"""Kind of output -> files that mark a folder as holding it (``report``: ``demo`` and ``eval-report``)."""


def _nearest_existing(path: Path) -> Path:
    for folder in (path, *path.parents):
        if folder.exists():
            return folder
    return Path.cwd()


def check_out_dir(out: str | os.PathLike, kind: str) -> Path:
    """Check an ``--out`` folder before any work: it must be a folder (or not exist yet) that this
    user can write in, and must not hold another kind of lensprobe output.

    Args:
        out: the folder.
        kind: what the command writes there: a key of :data:`OUTPUT_KINDS`.

    Returns:
        ``out`` as a path (``~`` expanded); nothing is created.

    Raises:
        LensprobeError: ``out`` (or a folder above it) is a file, cannot be written, or holds the
            output of another command.

    Example:
        >>> check_out_dir("runs/attn", "attention")
        PosixPath('runs/attn')
    """
    if kind not in OUTPUT_KINDS:
        raise LensprobeError(f"unknown output kind {kind!r}; use one of {', '.join(OUTPUT_KINDS)}.")
    out = Path(out).expanduser()
    base = _nearest_existing(out)
    if not base.is_dir():
        what = "is a file" if base == out else f"is inside {base}, which is a file"
        raise LensprobeError(f"--out {out} {what}: give a folder path (it is created if missing).")
    try:  # a real write: permissions, read-only mounts and full quotas all show here
        probe_write(base)
    except OSError as err:
        raise LensprobeError(f"--out {out}: cannot write in {base} ({err.strerror}): choose a folder you can "
                             "write to.") from None
    if base == out and kind == "report":
        check_report_listing(out)  # before the work: a listing it would refuse costs nothing
    if base == out:
        for other, markers in OUTPUT_KINDS.items():
            found = [m for m in markers if (out / m).is_file()]
            if other != kind and found:
                raise LensprobeError(f"--out {out} holds the output of another command ({other}: {found[0]}): "
                                     f"give this {kind} run its own folder.")
    return out


@contextlib.contextmanager
def writing_out_dir(out: Path, command: str, *, rank: int = 0, pages: bool = True) -> Iterator[list[Path]]:
    """Hold the ``--out`` folder's lock while a command runs (:func:`~lensprobe.core.storage.outfolder.lock_folder`).

    A second command into the same folder is refused at once (it does not wait), naming the folder
    and the fix: wait for the first, or use another ``--out``. The command appends every file it
    writes to the yielded list; when it ends without an error, the files an earlier run listed and
    this one did not write again are deleted (:func:`~lensprobe.core.storage.outfolder.replace_pages`), so a
    rerun with other settings leaves no page of the earlier run behind. Ranks other than 0 of a
    sharded run write only into the store's shard files: they take no lock. A folder this call
    created is removed again when the command leaves it empty.

    Args:
        out: the folder (checked by :func:`check_out_dir` before).
        command: the command's name (``"sweep"``), named in the messages and the listing.
        rank: this process's rank.
        pages: ``False`` for commands whose files the store or the report page keep track of
            (``eval``, ``demo``, ``eval-report``): the lock only.

    Example:
        >>> with writing_out_dir(Path("runs/sweep"), "sweep") as files:
        ...     files.append(write_figure(fig, Path("runs/sweep/sweep_heatmap.html")))
    """
    written: list[Path] = []
    if rank != 0:
        yield written
        return
    created = not out.exists()
    lock = lock_folder(out, f"lensprobe {command}")
    try:
        yield written
        if pages:
            replace_pages(out, f"lensprobe {command}", written)
    finally:
        lock.release()
        if created:
            with contextlib.suppress(OSError):
                remove_empty_folder(out)  # only when empty: a run that failed before writing anything


def write_plotly_bundle(folder: Path) -> Path:
    """``folder/plotly.min.js``, plotly's own bundle: kept when it holds exactly plotly's bytes, else
    (missing, cut short by a full disk or a file-size limit, edited, a link or a pipe in its place)
    written again atomically (:func:`~lensprobe.core.storage.store.atomic_file`).

    Example:
        >>> write_plotly_bundle(Path("runs/attn")).stat().st_size > 1_000_000
        True
    """
    from plotly.offline import get_plotlyjs

    bundle = Path(folder) / "plotly.min.js"
    want = get_plotlyjs().encode("utf-8")
    if bundle.is_symlink() or not bundle.is_file() or bundle.stat().st_size != len(want) or bundle.read_bytes() != want:
        with atomic_file(bundle) as tmp:
            tmp.write_bytes(want)
    return bundle


def write_figure(fig, path: Path) -> Path:
    """Write a plotly figure as HTML, with ``plotly.min.js`` once beside it (works offline; checked
    against plotly's own bytes by :func:`write_plotly_bundle` and written again when it differs); both
    written atomically (:func:`~lensprobe.core.storage.store.atomic_file`)."""
    write_plotly_bundle(path.parent)
    with atomic_file(path) as tmp:
        fig.write_html(tmp, include_plotlyjs="directory", full_html=True)
    return path


def print_files(out: Path, files: Sequence[Path]) -> None:
    """List the files a command wrote (``plotly.min.js`` included when it is there)."""
    files = list(files)
    if (out / "plotly.min.js").exists() and out / "plotly.min.js" not in files:
        files.append(out / "plotly.min.js")
    print(f"wrote {len(files)} files to {out.resolve()}:")
    for f in files:
        print(f"  {f.name}")
