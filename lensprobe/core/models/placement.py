"""Models larger than one device: a Hugging Face model placed across GPUs, the CPU and the disk by accelerate.

:func:`~lensprobe.core.models.loading.load_model` takes ``device_map=`` (``"auto"``, ``"balanced"``,
``"balanced_low_0"``, ``"sequential"`` or a dict from module names to devices), ``max_memory=`` (a budget per
device) and ``offload_folder=`` (where ``"disk"`` weights go). The checks here run before any weight is read:

- :func:`check_placement`: the three arguments on their own (types, device names this machine has, a map
  that mixes offload with a GPU, which TransformerLens' bridge refuses);
- :func:`check_map_covers`: a dict map against the model's modules, built on ``meta`` from its configuration
  (every key a module, every weight under a key);
- :func:`spread_hooked`: a TransformerLens 3.x ``HookedTransformer`` takes only ``"auto"`` (its blocks spread
  over the visible GPUs with ``cfg.n_devices``).

A model placed this way runs where its modules are: the tokens go to the input embedding's execution device
(:func:`input_device`, also for an embedding offloaded to the disk), the activations move from block to block
with accelerate's hooks, and the logits come back to the input's device.

Example:
    >>> model = lp.load_model("Qwen/Qwen2.5-32B-Instruct", device_map="auto",
    ...                       max_memory={0: "78GiB", 1: "78GiB"})
    >>> is_dispatched(model), input_device(model)
    (True, device(type='cuda', index=0))
"""

import os
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from lensprobe.core.errors import LensprobeError, ModelLoadError
from lensprobe.core.lazy import heavy
from lensprobe.core.models.devices import check_device

__all__ = ["MAP_STRATEGIES", "Placement", "check_disk_offload", "check_map_covers", "check_placement", "input_device",
           "is_dispatched", "spread_hooked"]

MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
"""The ``device_map`` strings accelerate places a model by."""

_OFFLOAD = ("cpu", "disk")
_SIZE_UNITS = ("B", "KB", "MB", "GB", "TB", "KIB", "MIB", "GIB", "TIB")


@dataclass(frozen=True)
class Placement:
    """A checked ``device_map`` with its memory budget and offload folder (the keyword arguments of
    ``from_pretrained``: :meth:`kwargs`)."""

    device_map: str | dict[str, int | str]
    max_memory: dict[int | str, int | str] | None = None
    offload_folder: str | None = None

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device_map": self.device_map}
        if self.max_memory is not None:
            out["max_memory"] = self.max_memory
        if self.offload_folder is not None:
            out["offload_folder"] = self.offload_folder
        return out


def _target(value: Any, where: str) -> int | str:
    """One device of a map or a budget: a GPU index, ``"cpu"``, ``"disk"``, or a device name this machine has."""
    if isinstance(value, bool) or not isinstance(value, (int, str, torch.device)):
        raise LensprobeError(f"{where}: {value!r} is not a device: use a GPU index (0, 1, ...), 'cuda:1', 'cpu' "
                             "or 'disk'.")
    if isinstance(value, int):
        if value < 0:
            raise LensprobeError(f"{where}: GPU index {value} is negative: GPUs are counted from 0.")
        check_device(f"cuda:{value}")
        return value
    name = str(value).strip().lower()
    if name in _OFFLOAD:
        return name
    if name == "meta":
        raise LensprobeError(f"{where}: 'meta' holds no weights: put the module on a GPU, 'cpu' or 'disk'.")
    dev = check_device(name)
    if dev.type == "cuda":
        return dev.index if dev.index is not None else 0
    return str(dev)


def _size(value: Any, where: str) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise LensprobeError(f"{where}: {value!r} is not a memory size: give bytes (an int) or a string such as "
                             "'75GiB' or '70GB'.")
    if isinstance(value, int):
        if value <= 0:
            raise LensprobeError(f"{where}: {value} bytes: give a positive size.")
        return value
    text = value.strip().upper().replace(" ", "")
    number = text.rstrip("KMGTIB")
    unit = text[len(number):]
    try:
        ok = float(number) > 0 and unit in _SIZE_UNITS
    except ValueError:
        ok = False
    if not ok:
        raise LensprobeError(f"{where}: {value!r} is not a memory size: give bytes (an int) or a number with a "
                             "unit, such as '75GiB' or '70GB'.")
    return value.strip()


def check_placement(device_map: Any, max_memory: Any = None, offload_folder: Any = None,
                    device: Any = None) -> Placement | None:
    """``device_map``, ``max_memory`` and ``offload_folder`` checked before any weight is read; ``None`` without
    a map.

    Raises:
        LensprobeError: ``device`` given with a map, a budget or offload folder without a map, a map that is
            not a strategy name or a dict of module names to devices, a device this machine lacks, ``"meta"``,
            a map that mixes ``"cpu"``/``"disk"`` with a GPU, ``"disk"`` without an offload folder, a budget
            that is not a dict of devices to sizes, or an offload folder that is a file.

    Example:
        >>> check_placement({"": "cpu"}).device_map
        {'': 'cpu'}
    """
    if device_map is None:
        for given, name in ((max_memory, "max_memory"), (offload_folder, "offload_folder")):
            if given is not None:
                raise LensprobeError(f"{name} is given without device_map: it only applies when a model is placed "
                                     "across devices; pass device_map='auto' (or a dict) with it, or leave it out.")
        return None
    if device is not None:
        raise LensprobeError("device and device_map are both given: device puts every weight on one device, "
                             "device_map spreads them; pass one of them.")
    if isinstance(device_map, str):
        if device_map.strip().lower() not in MAP_STRATEGIES:
            raise LensprobeError(f"device_map {device_map!r} is not a placement: use one of {list(MAP_STRATEGIES)} "
                                 "or a dict from module names to devices ({'model.layers.0': 0, 'lm_head': 'cpu'}).")
        placed: str | dict[str, int | str] = device_map.strip().lower()
        values: list = []
    elif isinstance(device_map, dict):
        if not device_map:
            raise LensprobeError("device_map is an empty dict: map module names to devices, e.g. {'': 0} for "
                                 "everything on GPU 0, or use device_map='auto'.")
        placed = {}
        for key, value in device_map.items():
            if not isinstance(key, str):
                raise LensprobeError(f"device_map key {key!r} is not a module name: keys are module names such as "
                                     "'model.layers.0' ('' for the whole model).")
            placed[key] = _target(value, f"device_map[{key!r}]")
        values = list(placed.values())
    else:
        raise LensprobeError(f"device_map must be one of {list(MAP_STRATEGIES)} or a dict from module names to "
                             f"devices, got a {type(device_map).__name__}.")
    has_gpu = any(isinstance(v, int) or str(v).startswith(("cuda", "mps", "xpu")) for v in values)
    if has_gpu and any(v in _OFFLOAD for v in values):
        raise LensprobeError("device_map mixes 'cpu'/'disk' offload with a GPU, which TransformerLens' bridge does "
                             "not run: map every module to GPUs (or use device_map='auto' with max_memory), or "
                             "every module to 'cpu'/'disk'.")
    budget = None
    if max_memory is not None:
        if not isinstance(max_memory, dict) or not max_memory:
            raise LensprobeError(f"max_memory must be a dict from devices to sizes, such as {{0: '75GiB', 1: "
                                 f"'75GiB', 'cpu': '200GiB'}}, got {type(max_memory).__name__} {max_memory!r}.")
        budget = {_target(k, "max_memory key"): _size(v, f"max_memory[{k!r}]") for k, v in max_memory.items()}
    folder = None
    if offload_folder is not None:
        if not isinstance(offload_folder, (str, os.PathLike)):
            raise LensprobeError(f"offload_folder must be a folder path, got a {type(offload_folder).__name__}.")
        path = Path(offload_folder).expanduser()
        if path.exists() and not path.is_dir():
            raise LensprobeError(f"offload_folder {path} is a file: give a folder (it is created when missing).")
        folder = str(path)
    check_disk_offload(placed if isinstance(placed, dict) else {}, "device_map")
    if "disk" in values and folder is None:
        raise LensprobeError("device_map puts modules on 'disk' but no offload_folder is given: pass "
                             "offload_folder='/path/with/space' (it holds those weights while the model is loaded).")
    return Placement(placed, budget, folder)


def check_disk_offload(placed: dict, where: str) -> None:
    """Refuse modules on the disk when TransformerLens is older than 4.0, whose bridge refuses them with an error
    of its own (CPU offload and GPUs are fine there). Checked on a dict ``device_map`` before any weight is read,
    and on the map accelerate resolved (``device_map="auto"``) before the bridge is built.

    Raises:
        ModelLoadError: names the modules on the disk, the TransformerLens version, and the two fixes.

    Example:
        >>> check_disk_offload({"model.layers.0": "cpu"}, "device_map")
    """
    on_disk = [module for module, where_to in placed.items() if str(where_to) == "disk"]
    tl = version("transformer-lens")
    if on_disk and int(tl.split(".")[0]) < 4:
        raise ModelLoadError(
            f"{where}: {len(on_disk)} module(s) on the disk ({', '.join(on_disk[:3])}"
            f"{', ...' if len(on_disk) > 3 else ''}), which the bridge of TransformerLens {tl} cannot run: install "
            "TransformerLens 4 (pip install 'transformer-lens>=4'), or keep every module in memory (a device_map "
            "without 'disk', or a max_memory that leaves room on the GPUs and the CPU).")


def check_map_covers(placement: Placement | None, config: Any) -> None:
    """Refuse a dict map whose keys are not modules of the model built from ``config`` (on ``meta``: no weight
    is made) or that leaves a weight unplaced.

    Raises:
        LensprobeError: names the unknown keys or the first weights no key covers, and the model's top modules.

    Example:
        >>> check_map_covers(check_placement({"": "cpu"}), hf.config)
    """
    if placement is None or not isinstance(placement.device_map, dict):
        return
    with torch.device("meta"):
        skeleton = heavy("transformers").AutoModelForCausalLM.from_config(config)
    modules = {name for name, _ in skeleton.named_modules()}
    keys = list(placement.device_map)
    unknown = [k for k in keys if k not in modules]
    tops = sorted({n.split(".")[0] for n in modules if n})
    inner = sorted({".".join(n.split(".")[:2]) for n in modules if n.count(".") >= 1})[:6]
    if unknown:
        raise LensprobeError(f"device_map names {unknown[:4]}, which are not modules of this model: use module "
                             f"names such as {inner} ('' for the whole model; top modules: {tops}).")
    names = [n for n, _ in [*skeleton.named_parameters(), *skeleton.named_buffers()]]
    loose = [n for n in names if not any(k == "" or n == k or n.startswith(k + ".") for k in keys)]
    if loose:
        raise LensprobeError(f"device_map places no module holding {loose[:3]} ({len(loose)} tensor(s)): add their "
                             "modules (or a parent) to the map, or use device_map='auto'.")


def is_dispatched(model: Any) -> bool:
    """Whether ``model`` (a bridge or its Hugging Face model) was placed by accelerate with a ``device_map``, or
    is a ``HookedTransformer`` spread over several devices (``cfg.n_devices > 1``).

    Example:
        >>> is_dispatched(tiny_model())
        False
    """
    hf = getattr(model, "original_model", model)
    if getattr(hf, "hf_device_map", None):
        return True
    return int(getattr(getattr(model, "cfg", None), "n_devices", 1) or 1) > 1 and not hasattr(model, "original_model")


def input_device(model: Any) -> torch.device | None:
    """Where a dispatched model takes its token ids: its input embedding's execution device (accelerate's hook
    says it for an offloaded embedding, whose weight is on ``meta``); ``None`` for a model on one device.

    Example:
        >>> input_device(lp.load_model(folder, device_map={"": "cpu"}))
        device(type='cpu')
    """
    hf = getattr(model, "original_model", model)
    if not getattr(hf, "hf_device_map", None):
        return None
    embed = hf.get_input_embeddings() if hasattr(hf, "get_input_embeddings") else None
    hook = getattr(embed, "_hf_hook", None)
    execution = getattr(hook, "execution_device", None)
    if execution is not None:
        return torch.device(f"cuda:{execution}" if isinstance(execution, int) else execution)
    for p in (embed.parameters() if embed is not None else ()):
        if not p.is_meta:
            return p.device
    return torch.device("cpu")


def spread_hooked(model: Any, device_map: Any, max_memory: Any, offload_folder: Any, device: Any) -> Any:
    """Spread a TransformerLens 3.x ``HookedTransformer`` over the visible GPUs (``device_map="auto"``).

    Its blocks go in order over ``cfg.n_devices`` GPUs, the embedding with the first block and the final norm
    and unembedding with the last, as TransformerLens' forward moves the residual stream between them. Without
    a GPU the model stays where it is.

    Raises:
        LensprobeError: a dict map, another strategy, ``max_memory``, ``offload_folder`` or ``device`` given
            with it: a ``HookedTransformer`` cannot offload or take a budget.
    """
    if not (isinstance(device_map, str) and device_map.strip().lower() == "auto"):
        raise LensprobeError(f"device_map={device_map!r}: a HookedTransformer spreads its blocks over GPUs only "
                             "(TransformerLens' n_devices): pass device_map='auto' for every visible GPU, or load "
                             "the model as a TransformerBridge (lp.load_model with its name or folder) to offload "
                             "to 'cpu'/'disk' or place modules by name.")
    for given, name in ((max_memory, "max_memory"), (offload_folder, "offload_folder"), (device, "device")):
        if given is not None:
            raise LensprobeError(f"{name} cannot be given with a HookedTransformer's device_map='auto' (it takes "
                                 "every visible GPU in equal shares of blocks): leave it out, or load the model as "
                                 "a TransformerBridge.")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return model
    multi_gpu = heavy("transformer_lens.utilities.multi_gpu")
    cfg = model.cfg
    cfg.n_devices = min(count, int(cfg.n_layers))
    cfg.device = "cuda:0"
    at = [multi_gpu.get_device_for_block_index(i, cfg) for i in range(int(cfg.n_layers))]
    for name in ("embed", "hook_embed", "pos_embed", "hook_pos_embed"):
        if hasattr(model, name):
            getattr(model, name).to(at[0])
    for block, dev in zip(model.blocks, at, strict=True):
        block.to(dev)
    for name in ("ln_final", "unembed"):
        if hasattr(model, name):
            getattr(model, name).to(at[-1])
    return model
