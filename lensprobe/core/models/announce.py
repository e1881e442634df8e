"""The one-time conversion of a GGUF file, said out loud: a load that converts says so once on stderr before it
starts (what, where, about how long) and once when it is done (how long it took), so a first load that takes
half a minute or more is not mistaken for a hang. Later loads read the converted folder and say nothing.

Measured on the embedded SmolLM2-135M-Instruct (98 MB GGUF file, a 538 MB safetensors folder), converting into an
empty cache on a 2-core machine: 23 s and 35 s in two runs when the machine was otherwise quiet, 164 s with a load
average of 7 (other processes competing for both cores).

Example:
    >>> folder = cached_conversion(gguf, announced(convert_gguf))
    lensprobe: converting SmolLM2-135M-Instruct.Q4_1.gguf into a safetensors folder in /home/me/.cache/lensprobe,
    once (about 30 s on 2 CPU cores, minutes on a busy machine); later loads skip this
    lensprobe: converted SmolLM2-135M-Instruct.Q4_1.gguf in 36 s
"""

import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["CONVERSION_SECONDS", "announced", "conversion_notice"]

CONVERSION_SECONDS = 30
"""About how long converting the embedded model takes on a quiet 2-core machine (see the module docstring)."""


def conversion_notice(gguf: Path, folder: Path) -> str:
    """The line said before ``gguf`` is converted into ``folder`` (a folder of the model cache)."""
    return (f"lensprobe: converting {Path(gguf).name} into a safetensors folder in {Path(folder).parent}, once "
            f"(about {CONVERSION_SECONDS} s on 2 CPU cores for the embedded model, longer for a larger model or on "
            "a busy machine); later loads skip this")


def announced(convert: Callable[[Path, Path], None], *, clock: Callable[[], float] = time.monotonic
              ) -> Callable[[Path, Path], None]:
    """``convert(gguf, folder)`` that says on stderr, once each, that it starts and how long it took.

    Example:
        >>> announced(convert_gguf)(Path("model.gguf"), folder)
    """

    def run(gguf: Path, folder: Path) -> None:
        print(conversion_notice(gguf, folder), file=sys.stderr, flush=True)
        start = clock()
        convert(gguf, folder)
        print(f"lensprobe: converted {Path(gguf).name} in {clock() - start:.0f} s", file=sys.stderr, flush=True)

    return run
