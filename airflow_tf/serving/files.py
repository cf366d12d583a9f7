"""Small file helpers for serving: paths given as URIs, atomic writes of files others read."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


def local_path(uri: str | os.PathLike[str]) -> Path:
    """A local path from a path or ``file://`` URI (the storage the rest of the package uses)."""
    text = os.fspath(uri)
    if text.startswith("file://"):
        text = text[len("file://"):]
    elif "://" in text:
        raise ValueError(f"{text!r}: only local paths and file:// URIs are supported for serving paths")
    return Path(text)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` so that readers see either the old file or the complete new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    return atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def read_json(path: str | os.PathLike[str]) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); delete or regenerate the file") from exc
