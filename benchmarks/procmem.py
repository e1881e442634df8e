"""Process memory readings shared by the benchmark scripts (Linux /proc)."""

from pathlib import Path


def rss_kib() -> tuple[int, int]:
    """(current resident set size, peak since the last reset), in KiB."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values["VmRSS"], values["VmHWM"]


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS counter; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False
