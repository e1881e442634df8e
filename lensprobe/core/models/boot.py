"""A TransformerBridge booted over a loaded Hugging Face model: its weights checked finite, moved to the device
(or left where accelerate placed them), and no package installed while TransformerLens boots it.

Example:
    >>> bridge = boot(TransformerBridge, "Qwen/Qwen2.5-Math-1.5B", hf, tok, torch.device("cpu"), torch.float32)
"""

import contextlib
import subprocess
from typing import Any

import torch

from lensprobe.core.errors import ModelLoadError
from lensprobe.core.models.placement import check_disk_offload, input_device

__all__ = ["boot", "check_finite_weights", "no_package_installs"]


def check_finite_weights(model: Any, name: str) -> None:
    """Refuse a model with a NaN or infinite weight, naming the first such parameter (before any forward:
    such a weight makes every later number NaN without an error).

    Raises:
        ModelLoadError: names the parameter, how many of its values are not finite, and the fix.

    Example:
        >>> check_finite_weights(torch.nn.Linear(2, 2), "tiny")
    """
    named = getattr(model, "named_parameters", None)  # a look-alike without torch parameters has none
    for pname, param in named() if callable(named) else ():
        if param.is_floating_point() and not param.is_meta and not bool(torch.isfinite(param).all()):
            bad = int((~torch.isfinite(param)).sum())
            raise ModelLoadError(
                f"{name}: the weight {pname.replace('._original_component', '')} holds {bad} NaN or infinite value(s) of {param.numel()}, so every "
                "number computed with it would be NaN: the weights' file is damaged or was saved from a run "
                "that diverged; download or convert the model again (a GGUF file: delete its folder in the "
                "model cache), or load another checkpoint.")


def boot(TransformerBridge, name: str, hf, tok, device: torch.device, dtype: torch.dtype):
    """A bridge over ``hf`` with every weight on ``device`` in ``dtype``, in eval mode.

    ``boot_transformers`` records the device of a preloaded model in ``cfg.device`` but leaves its
    weights where they are, so the weights are moved first. A model accelerate placed (``hf_device_map``)
    stays where it is, and ``cfg.device`` is where its token ids go (:func:`~lensprobe.core.models.placement.input_device`).
    """
    dispatched = bool(getattr(hf, "hf_device_map", None))
    check_disk_offload(getattr(hf, "hf_device_map", None) or {}, name)  # what device_map='auto' resolved to
    hf = (hf if dispatched else hf.to(device=device, dtype=dtype)).eval()
    check_finite_weights(hf, name)
    with no_package_installs():
        if not dispatched:
            return TransformerBridge.boot_transformers(name, hf_model=hf, tokenizer=tok, device=device, dtype=dtype)
        bridge = TransformerBridge.boot_transformers(name, hf_model=hf, tokenizer=tok, dtype=dtype)
    bridge.cfg.device = str(input_device(bridge))
    return bridge


@contextlib.contextmanager
def no_package_installs():
    """Refuse ``pip install`` / ``uv pip install`` commands run with ``subprocess.check_call`` inside the block.

    TransformerLens (3.9 and 4.3), booting a multimodal model such as ``Gemma3ForConditionalGeneration``
    (gemma-3-4b-it, 27b-it), installs torchvision with pip into the running environment when the
    model's image processor does not load (offline, or a folder without one); the release pip picks
    need not match the installed torch, and then every later ``transformers`` model import fails.
    lensprobe runs the text model and needs no processor: the install is refused, TransformerLens
    leaves ``bridge.processor`` unset and the boot goes on.

    Example:
        >>> with no_package_installs():
        ...     bridge = TransformerBridge.boot_transformers(name, hf_model=hf, tokenizer=tok)
    """
    run = subprocess.check_call

    def refuse(args, *rest, **kwargs):
        words = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
        if "pip" in words and "install" in words:
            raise subprocess.CalledProcessError(1, args, output="lensprobe refuses package installs while loading")
        return run(args, *rest, **kwargs)

    subprocess.check_call = refuse
    try:
        yield
    finally:
        subprocess.check_call = run
