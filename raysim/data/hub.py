"""Loading HuggingFace ``datasets``, with one clear DataError for each way it fails.

``datasets.load_dataset`` fails on a user's mistake with errors that say little about the fix: a
glob matching no file ends in a bare ``StopIteration`` (datasets 5.2), an unreachable or disabled
hub in a ``ConnectionError``, neither of them a ``RaysimError``, so the CLI printed a traceback.
Recipes load through ``load_split``: each such failure becomes a ``DataError`` naming the dataset
or files and what to do, which the CLI prints in one line.

Usage:
    dataset = load_split("json", None, split="train", data_files="c4/*.json.gz", streaming=True)
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from typing import Any

from raysim.errors import DataError

DataFiles = str | list[str] | dict[str, Any] | None


def load_split(
    path: str,
    name: str | None = None,
    *,
    split: str,
    data_files: DataFiles = None,
    streaming: bool = False,
    local_hint: str = "give local files with data_files",
) -> Any:
    """``datasets.load_dataset(path, name, split=..., data_files=..., streaming=...)``.

    Args:
        path, name, split, data_files, streaming: as ``datasets.load_dataset`` takes them.
        local_hint: how to use local files instead of the hub, in the recipe's terms.

    Raises:
        DataError: the hub cannot be reached (or offline mode is on), a local data_files
            pattern matches no file, the files hold no records, or the dataset or split does not
            exist.
    """
    import datasets  # imported here: ~2 s, and only building a store needs it

    where = f"{path!r}" + (f" ({name})" if name else "") + f" split {split!r}"
    if data_files is not None:
        where += f" from data_files {data_files!r}"
    try:
        return datasets.load_dataset(path, name, split=split, data_files=data_files, streaming=streaming)
    except ConnectionError as e:  # the hub is unreachable, or HF_HUB_OFFLINE forbids it
        offline = (
            "HF_HUB_OFFLINE is set: unset it on a machine with network" if _is_offline() else "go online"
        )
        raise DataError(
            f"cannot load {where}: the HuggingFace hub cannot be reached ({e}). Either {offline} "
            f"(the HF cache then serves later runs offline), or {local_hint}"
        ) from e
    except (StopIteration, FileNotFoundError, datasets.exceptions.DatasetGenerationError) as e:
        unmatched = [p for p in _patterns(data_files) if _is_local(p) and not glob.glob(p, recursive=True)]
        if unmatched:  # datasets says StopIteration or SchemaInferenceError for a glob without files
            raise DataError(
                f"no file matches data_files {', '.join(map(repr, unmatched))} (relative paths start "
                f"at {os.getcwd()}): give existing files (globs allowed)"
            ) from e
        raise DataError(f"cannot load {where}: {_reason(e)}") from e
    except (OSError, ValueError) as e:  # e.g. no such split
        raise DataError(f"cannot load {where}: {type(e).__name__}: {e}") from e


def _reason(error: BaseException) -> str:
    if isinstance(error, StopIteration):  # the json and csv builders, on files without a record
        return "the files hold no records"
    cause = error.__cause__ or error  # DatasetGenerationError wraps the parser's error
    return f"{type(cause).__name__}: {cause}"


def _patterns(data_files: DataFiles) -> Iterator[str]:
    """Every path or glob in ``data_files`` (a string, a list, or a dict of split -> either)."""
    values = data_files.values() if isinstance(data_files, dict) else [data_files]
    for value in values:
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            yield from (v for v in value if isinstance(v, str))


def _is_local(pattern: str) -> bool:
    """False for URLs and fsspec paths (``hf://``, ``https://``, ``s3://``): only the hub knows."""
    return "://" not in pattern


def _is_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)
