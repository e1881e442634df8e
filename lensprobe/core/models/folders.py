"""A Hugging Face model folder checked before and after it loads.

transformers loads a folder that lacks weight tensors with those tensors randomly initialised and a
warning that loading silences; a model whose outputs differ is worse than an error. So a folder is
refused, naming the problem and the fix, when:

- a file in it is not a regular file (a FIFO, a link to a device);
- its ``config.json`` is not a regular file holding a JSON object whose ``model_type`` the installed
  transformers knows;
- it holds no tokenizer file;
- it holds no weights, a shard its ``model.safetensors.index.json`` lists is missing, or a safetensors
  file is shorter than its header says (a download or copy cut short): checked on the headers, before
  any weight is read;
- after loading, transformers' loading report lists a tensor of the model that the folder lacks (it
  would be random) or holds in another shape (:func:`check_loading_info`).

Example:
    >>> check_model_folder(Path("models/half-copied"))
    Traceback (most recent call last):
    lensprobe.core.errors.ModelLoadError: models/half-copied/model.safetensors is truncated: ...
"""

import json
import struct
from pathlib import Path
from typing import Any

from lensprobe.core.errors import LensprobeError, ModelLoadError
from lensprobe.core.lazy import heavy
from lensprobe.core.storage.files import check_file, read_text
from lensprobe.core.storage.nesting import parse_json

__all__ = ["TOKENIZER_FILES", "check_loading_info", "check_model_folder", "folder_load_error"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model", "tekken.json")
"""Files of which a folder must hold one to have a tokenizer."""
_INDEX = "model.safetensors.index.json"
_BINARY = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_HEADER_LIMIT = 100 * 2**20


def check_model_folder(folder: Path) -> None:
    """Refuse a model folder that would load with random or unreadable weights, or without a tokenizer.

    Raises:
        ModelLoadError: ``config.json`` is not a JSON object or names an unknown ``model_type``; no
            tokenizer file; no weights, a missing shard or a truncated safetensors file.

    Example:
        >>> check_model_folder(tiny_family_folder("qwen2", tmp_path / "qwen2"))
    """
    folder = Path(folder)
    for path in folder.iterdir():  # transformers would wait forever on a FIFO, or read a device without end
        if path.exists() and not path.is_dir():  # (a broken link is left to the loader, which may not need it)
            check_file(path, "model file", limit=2**62)
    _check_config(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"{folder} holds no tokenizer (none of {', '.join(TOKENIZER_FILES[:4])}, ...): save "
                             "the model's tokenizer into the folder (tokenizer.save_pretrained(folder)) or copy its "
                             "tokenizer files there.")
    for path in _weight_files(folder):
        _check_safetensors(path)


def _check_config(folder: Path) -> None:
    path = folder / "config.json"
    try:
        config = parse_json(read_text(path, "model settings file"), f"model settings file {path}")
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{path} is not valid JSON ({err.msg}): restore the folder's config.json from the "
                             "model's source.") from None
    except LensprobeError as err:  # a key given twice
        raise ModelLoadError(f"{path}: {err}: restore it from the model's source.") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} holds a JSON {type(config).__name__}, not the model's settings (a JSON "
                             "object): restore it from the model's source.")
    model_type = config.get("model_type")
    known = heavy("transformers.models.auto.configuration_auto").CONFIG_MAPPING
    if not isinstance(model_type, str) or model_type not in known:
        version = heavy("transformers").__version__
        raise ModelLoadError(f"{path} names model_type {model_type!r}, which transformers {version} does not know: "
                             "check the folder's config.json, or install a transformers release that has this "
                             "architecture (pip install -U transformers).")


def _weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files (every shard its index lists, each checked to exist)."""
    index = folder / _INDEX
    if index.exists():
        try:
            listed = parse_json(read_text(index, "weights index"), f"weights index {index}")["weight_map"].values()
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise ModelLoadError(f"{index} is not a safetensors index (a JSON object with a 'weight_map'): restore "
                                 "it from the model's source.") from None
        shards = [folder / str(name) for name in sorted(set(listed))]
        missing = [p.name for p in shards if not p.exists()]
        if missing:
            raise ModelLoadError(f"{folder} lacks {len(missing)} of the {len(shards)} weight files its {_INDEX} "
                                 f"lists ({', '.join(missing[:3])}): copy or download them again.")
        return shards
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    if any((folder / name).exists() for name in _BINARY):
        return []  # PyTorch pickles: transformers' loading report is the check
    raise ModelLoadError(f"{folder} holds no weights (no model.safetensors, {_INDEX} or pytorch_model.bin): save "
                         "the model into it (model.save_pretrained(folder)) or copy its weight files there.")


def _check_safetensors(path: Path) -> None:
    """A safetensors file as long as its header says: an 8-byte header length, the JSON header, the data."""
    size = check_file(path, "weights file", limit=2**62)
    if size < 8:
        raise ModelLoadError(f"{path} is truncated ({size} bytes, less than a safetensors header): copy or "
                             "download it again.")
    header_len, header = _header(path, size)
    try:
        tensors = parse_json(header, f"weights file {path}")
        end = max((int(t["data_offsets"][1]) for k, t in tensors.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise ModelLoadError(f"{path} has a damaged safetensors header: copy or download it again.") from None
    need = 8 + header_len + end
    if size < need:
        raise ModelLoadError(f"{path} is truncated: its header describes {need} bytes but the file has {size}; "
                             "copy or download it again.")


def _header(path: Path, size: int) -> tuple[int, bytes]:
    """The header length and header bytes of a safetensors file of ``size`` bytes."""
    with open(path, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        if header_len > min(size - 8, _HEADER_LIMIT):
            raise ModelLoadError(f"{path} is truncated or not a safetensors file: its header length {header_len} "
                                 f"does not fit in its {size} bytes; copy or download it again.")
        return header_len, fh.read(header_len)


def check_loading_info(info: dict[str, Any], where: str) -> None:
    """Refuse a model whose loading report (``from_pretrained(..., output_loading_info=True)``) lists tensors
    the checkpoint lacks (randomly initialised) or holds in another shape. Unexpected extra tensors are
    left alone (they change no output).

    Example:
        >>> hf, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
        >>> check_loading_info(info, str(folder))
    """
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        names = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ModelLoadError(f"{where} lacks {len(missing)} weight tensor(s) of the model ({names}): transformers "
                             "would fill them with random numbers. Copy or download the model's weights again.")
    mismatched = list(info.get("mismatched_keys") or ())
    if mismatched:
        key, got, want = mismatched[0]
        raise ModelLoadError(f"{where}: weight {key} has shape {list(got)} but the model's config.json asks for "
                             f"{list(want)} ({len(mismatched)} tensor(s) differ): the weights and config.json are "
                             "of different models; copy or download the model again.")
    errors = list(info.get("error_msgs") or ())
    if errors:
        raise ModelLoadError(f"{where}: the weights did not load ({str(errors[0]).splitlines()[0][:200]}): copy or "
                             "download the model again.")


def folder_load_error(folder: Path, err: BaseException) -> ModelLoadError:
    """The error for a folder transformers could not load (``err``): the folder, what failed, the fix.

    Example:
        >>> str(folder_load_error(Path("models/x"), ValueError("bad header")))
        'cannot load the model folder models/x: ValueError: bad header. Check that ...'
    """
    if isinstance(err, ModelLoadError):
        return err
    detail = (str(err).strip().splitlines() or [""])[0][:200].rstrip(".")
    return ModelLoadError(f"cannot load the model folder {folder}: {type(err).__name__}: {detail}. Check that its "
                          "files are whole and of one model (copy or download them again).")
