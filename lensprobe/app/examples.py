"""One runnable example per ``lensprobe`` subcommand, shown at the end of its ``--help``, and the
subcommands grouped by study for ``lensprobe --help``.

``tests/app/test_examples.py`` runs each example on the tiny test model (``--model tiny`` added where the
example names no model) or, where that is not feasible, parses it.
"""

__all__ = ["EXAMPLES", "STUDIES", "describe", "studies_text"]

EXAMPLES: dict[str, str] = {
    "attention": "lensprobe attention --question 'What is 12+7?' --compare 'w/ Mless' --layers 0 --heads L0H1,L0H3 "
                 "--out attn",
    "mechanism": "lensprobe mechanism --question 'What is 12+7?' --layer 0 --heads 0,2 --out mech",
    "sinks": "lensprobe sinks --question 'What is 12+7?' --compare 'w/ Mless' --layers 0,1 --max-new-tokens 8 --out sinks",
    "eval": "lensprobe eval --problems arithmetic --limit 4 --conditions 'w/o,w/ Mless' --max-new-tokens 16 "
            "--out runs/arith",
    "eval-report": "lensprobe eval-report runs/arith --out runs/arith-report",
    "reproduce": "lensprobe reproduce arm-fig-filler-per-head --quick --out repro/filler",
    "ablate": "lensprobe ablate --heads L0H3,L1H2 --question 'What is 12+7?' --ablation zero --out abl",
    "sweep": "lensprobe sweep --question 'What is 12+7?' --heads L0H0,L0H1,L1H2 --ablation zero --out sweep",
    "attribute": "lensprobe attribute --question 'What is 12+7?' --attribution atp --verify 5 --out attr",
    "find-heads": "lensprobe find-heads --question 'What is 12+7?' --question 'What is 3*4?' --top 5 --out heads",
    "patch-heads": "lensprobe patch-heads --question 'What is 12+7?' --question 'What is 3*4?' --compare 'w/ Mless' "
                   "--heads L0H0,L0H1,L1H2 --out patched",
    "trace": "lensprobe trace --question 'What is 12+7?' --think fusion,pause --max-new-tokens 24 --out trace",
    "demo": "lensprobe demo --quick --out lensprobe-report",
}
"""Command -> an example command line (the ``Example:`` at the end of its ``--help``)."""

STUDIES: dict[str, tuple[str, ...]] = {
    "meaningless tokens (arXiv 2510.01032)": ("attention", "mechanism", "sinks", "eval", "eval-report", "reproduce"),
    "attention heads": ("ablate", "sweep", "attribute", "find-heads", "patch-heads"),
    "latent thinking tokens (arXiv 2602.10229)": ("trace",),
    "all of them": ("demo",),
}
"""Study -> its subcommands, the groups of ``lensprobe --help``."""


def describe(command: str, *, help: str, description: str) -> dict[str, str]:
    """The ``add_parser`` keywords of ``command``: its help, description and the example as epilog.

    Example:
        >>> subparsers.add_parser("sweep", **describe("sweep", help="...", description="..."))
    """
    return {"help": help, "description": description, "epilog": f"Example:\n  {EXAMPLES[command]}"}


def studies_text(helps: dict[str, str]) -> str:
    """The subcommands by study, each with its one-line help (``helps``: command -> help)."""
    width = max(len(c) for group in STUDIES.values() for c in group)
    lines = []
    for study, commands in STUDIES.items():
        lines.append(f"{study}:")
        lines += [f"  {c:<{width}}  {helps.get(c, '')}" for c in commands]
    return "\n".join(lines)
