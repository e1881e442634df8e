"""Where a model runs: the default device, a model's device and dtype, and whether the hub answers.

Every tensor lensprobe makes for a model is made on :func:`model_device`; results come back on
the CPU. :func:`default_device` is what :func:`~lensprobe.core.models.loading.load_model` uses when no
device is given: CUDA when available, then Apple's MPS, else the CPU.

Example:
    >>> default_device()          # on a machine without a GPU
    device(type='cpu')
    >>> model_device(model), model_dtype(model)
    (device(type='cpu'), torch.float32)
"""

import os
import socket

import torch

from lensprobe.core.errors import LensprobeError

__all__ = ["DTYPES", "default_device", "hub_reachable", "model_device", "model_dtype", "place", "resolve_dtype"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
"""The weight dtypes :func:`~lensprobe.core.models.loading.load_model` accepts, by name."""


def default_device() -> torch.device:
    """CUDA when a GPU is visible, then Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def check_device(device: "str | torch.device") -> torch.device:
    """``device`` as a torch device, checked: a device name torch knows, and one this machine has.

    Raises:
        LensprobeError: an unknown name (``"bogus"``), CUDA or MPS asked for where there is none,
            or a GPU index beyond the GPUs visible.

    Example:
        >>> check_device("cpu")
        device(type='cpu')
    """
    try:
        dev = device if isinstance(device, torch.device) else torch.device(str(device).strip())
    except (RuntimeError, ValueError):
        raise LensprobeError(f"device {str(device)!r} is not a torch device: use cpu, cuda, cuda:1 or mps.") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise LensprobeError(f"device {str(device)!r}: torch sees no CUDA GPU here (is it a CPU-only build of "
                                 "torch, or CUDA_VISIBLE_DEVICES empty?): use cpu, or leave the device out.")
        if dev.index is not None and dev.index >= count:
            raise LensprobeError(f"device {str(device)!r}: only {count} CUDA GPU(s) are visible (cuda:0-"
                                 f"cuda:{count - 1}).")
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise LensprobeError(f"device {str(device)!r}: Apple's MPS is not available here: use cpu.")
    if dev.type not in ("cpu", "cuda", "mps", "meta", "xpu"):
        raise LensprobeError(f"device {str(device)!r}: lensprobe runs on cpu, cuda or mps.")
    return dev


def resolve_dtype(dtype: "torch.dtype | str | None") -> torch.dtype:
    """A torch floating dtype from a dtype or its name (``"bf16"``, ``"float16"``, ...); ``None`` is float32.

    Raises:
        LensprobeError: not one of :data:`DTYPES`.
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.lower().removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.lower().removeprefix("torch.")]
    raise LensprobeError(
        f"dtype {dtype!r} is not a weight dtype lensprobe runs: use torch.float32, torch.bfloat16 or "
        "torch.float16 (or 'fp32', 'bf16', 'fp16')."
    )


def model_device(model) -> torch.device:
    """The device of the model's weights (its first parameter; the CPU for a model without any); for a model
    accelerate placed across devices, where its token ids go
    (:func:`~lensprobe.core.models.placement.input_device`)."""
    from lensprobe.core.models.placement import input_device  # placement builds on this module

    placed = input_device(model)
    if placed is not None:
        return placed
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def model_dtype(model) -> torch.dtype:
    """The dtype of the model's floating weights (float32 for a model without any)."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face hub answers (a TCP connection within ``timeout`` seconds).

    ``False`` at once when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set. The tutorials
    use it to pick a paper model when it can be downloaded and the embedded one otherwise.
    """
    if any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
           for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def place(model, device: torch.device | None = None, dtype: torch.dtype | None = None):
    """Move a loaded TransformerLens model to ``device`` and cast its weights to ``dtype`` (``None``: as it is).

    Both kinds of TransformerLens model update ``model.cfg`` (device, dtype) as they move.
    Returns the model.
    """
    for target in (device, dtype):
        if target is not None:
            model.to(target, print_details=False)
    return model
