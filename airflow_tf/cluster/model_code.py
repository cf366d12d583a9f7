"""The model's code travels with the run: a snapshot of the user's model module (or its
top-level package) in the run directory, on the storage every task shares.

A model kept next to the DAG file imports in the launcher (Airflow puts the DAGs folder on
``sys.path``) but not in a training task, a pod, or a later evaluation. The launch therefore
copies that code into ``<run_dir>/code/<hash>/`` and the runtime imports it from there first
(``TrainingConfig.code_dir``). The directory is named by the code's content hash: a retried
launch with the same code finds its snapshot already there, and a changed model never
overwrites the code a running group imports.

Pure Python: the module is located with :class:`importlib.machinery.PathFinder`, never
imported (a model module imports TensorFlow, which the Airflow side must not)."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.metadata
import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import NamedTuple

from airflow_tf.files import strip_file_scheme

log = logging.getLogger(__name__)

CODE_DIR = "code"
"""The snapshots' directory inside a run directory."""
MANIFEST_FILE = "model-code.json"
"""In each snapshot: the hash, the files, the model reference (not an importable name)."""
MAX_CODE_BYTES = 10 * 1024 * 1024
SKIPPED_DIRS = {"__pycache__", "node_modules", "site-packages"}
SKIPPED_SUFFIXES = (".pyc", ".pyo")
_HASH_PREFIX = 16


class ModelCodeError(ValueError):
    """The model's code cannot be snapshotted; the message names the module, directory and why."""


class ModelCode(NamedTuple):
    """A snapshot of a model's code: ``path`` is what ``TrainingConfig.code_dir`` is set to;
    ``sha256`` is the code's :func:`code_hash`."""

    path: str
    sha256: str


def snapshot_model_code(model: str, run_dir: str, search_path: list[str] | None = None, *,
                        max_bytes: int = MAX_CODE_BYTES) -> ModelCode | None:
    """Copy the code of ``model`` (``package.module:function``) into ``<run_dir>/code/<hash>/``.

    The module is looked up on ``search_path`` (default ``sys.path``) without importing it.
    Returns None, copying nothing, for a built-in model name, for a module of the standard
    library or of an installed distribution (site-packages, dist-packages, editable installs:
    the training image provides those), and for a module the launcher cannot find (it may exist
    only in the training image). Otherwise copies the module file, or its whole top-level
    package (without ``__pycache__``, compiled files, hidden files such as ``.git`` or ``.env``,
    and links to files outside the package), atomically; the same content is copied once. Raises :class:`ModelCodeError` for
    code above ``max_bytes`` or a submodule that is not where its package is."""
    module_name, sep, function = model.partition(":")
    if not sep:
        return None  # a built-in model
    if not all(part.isidentifier() for part in module_name.split(".")) or not function.isidentifier():
        raise ModelCodeError(f"model {model!r}: use 'package.module:function' (Python names separated by dots)")
    top = module_name.split(".")[0]
    search = list(sys.path if search_path is None else search_path)
    source = _top_level_source(model, module_name, search)
    if source is None:
        log.info("model %s: module %r is not on the launcher's import path; the training image must provide it",
                 model, top)
        return None
    if _installed(top, source):
        return None
    files = _files(source)
    size = sum(path.stat().st_size for _, path in files)
    if size > max_bytes:
        raise ModelCodeError(
            f"model {model!r}: {source} holds {size / 1e6:.1f} MB in {len(files)} files, above the "
            f"{max_bytes / 1e6:.0f} MB limit for model code copied into the run directory; keep data and other "
            "large files out of the model's package (read them from storage at run time), or install the "
            "package in the training image"
        )

    runs_code = Path(os.path.abspath(strip_file_scheme(run_dir))) / CODE_DIR
    runs_code.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=runs_code))
    try:
        for relative, path in files:
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        # The hash is of the copy: a file edited during the copy cannot be recorded wrongly.
        digest = code_hash(staging)
        snapshot = ModelCode(str(runs_code / digest[:_HASH_PREFIX]), digest)
        manifest = {"sha256": digest, "model": model, "source": str(source), "bytes": size,
                    "files": [relative.as_posix() for relative, _ in files]}
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        try:
            os.rename(staging, snapshot.path)
        except OSError:
            if not os.path.isdir(snapshot.path):  # not "already there" (a retry, a concurrent launch)
                raise
            log.info("model %s: code %s already in %s", model, digest[:_HASH_PREFIX], snapshot.path)
            return snapshot
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("model %s: copied %d file(s), %d bytes, from %s to %s (sha256 %s)",
             model, len(files), size, source, snapshot.path, digest)
    return snapshot


def read_model_code(code_dir: str | None) -> ModelCode | None:
    """The snapshot in ``code_dir``, or None when there is none."""
    record = model_code_record(code_dir)
    return None if record is None else ModelCode(str(record["path"]), str(record["sha256"]))


def model_code_record(code_dir: str | None) -> dict[str, object] | None:
    """What ``metrics.json`` and an export's metadata record of the run's model code: its
    ``sha256``, the ``model`` reference, the ``source`` it was copied from, its ``path``, the
    number of ``files`` and their ``bytes``; None for a run without a snapshot."""
    if not code_dir:
        return None
    directory = Path(strip_file_scheme(code_dir))
    path = directory / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {"sha256": str(data["sha256"]), "model": data["model"], "source": data["source"],
                "path": str(directory), "files": len(data["files"]), "bytes": data["bytes"]}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelCodeError(f"model code manifest {path} cannot be read ({exc!r}); launch the run again") from None


def code_hash(directory: str | os.PathLike[str]) -> str:
    """sha256 over every file below ``directory`` but the manifest, in sorted order of their
    relative paths: each file adds its relative path, a NUL byte, and the sha256 of its bytes."""
    root = Path(directory)
    digest = hashlib.sha256()
    paths = sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() != MANIFEST_FILE)
    for path in paths:
        digest.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _top_level_source(model: str, module_name: str, search: list[str]) -> Path | None:
    """The module file (a top-level module) or package directory that holds ``module_name``;
    None when the top-level name is not found. Checks that the submodule exists in it."""
    parts = module_name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], search)
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if not locations:
        if len(parts) > 1:
            raise ModelCodeError(f"model {model!r}: {spec.origin} is a module, not a package, so it has no "
                                 f"submodule {module_name!r}")
        if not spec.has_location or not spec.origin or not os.path.isfile(spec.origin):
            return None  # built into the interpreter: nothing to copy
        return Path(spec.origin).resolve()
    if len(locations) > 1:
        raise ModelCodeError(
            f"model {model!r}: namespace package {parts[0]!r} is spread over {', '.join(locations)}; "
            "give it an __init__.py in one directory so its code can be copied with the run"
        )
    package = Path(locations[0]).resolve()
    found = spec
    for depth in range(1, len(parts)):
        below = importlib.machinery.PathFinder.find_spec(".".join(parts[:depth + 1]),
                                                         list(found.submodule_search_locations or []))
        if below is None:
            raise ModelCodeError(
                f"model {model!r}: package {parts[0]!r} ({package}) has no module {'.'.join(parts[:depth + 1])!r}; "
                "check the model reference"
            )
        found = below
    return package


def _installed(top: str, source: Path) -> bool:
    """Whether the code comes with the Python installation or an installed distribution."""
    installed_roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    if any(part in ("site-packages", "dist-packages") for part in source.parts):
        return True
    if any(source.is_relative_to(Path(root).resolve()) for root in installed_roots if root):
        return True
    # Editable installs live outside site-packages but are distributions all the same.
    return top in importlib.metadata.packages_distributions()


def _files(source: Path) -> list[tuple[Path, Path]]:
    """(path relative to the snapshot, source path) of every file to copy, sorted."""
    if source.is_file():
        return [(Path(source.name), source)]
    files = []
    for directory, subdirs, names in os.walk(source):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS and not d.startswith("."))
        for name in sorted(names):
            path = Path(directory) / name
            if name.startswith(".") or name.endswith(SKIPPED_SUFFIXES) or not path.is_file():
                continue
            if path.is_symlink() and not path.resolve().is_relative_to(source):
                log.warning("model code: not copying %s, a link to %s outside the package", path, path.resolve())
                continue
            files.append((Path(source.name) / path.relative_to(source), path))
    return files


__all__ = ["CODE_DIR", "MANIFEST_FILE", "MAX_CODE_BYTES", "ModelCode", "ModelCodeError", "code_hash",
           "model_code_record", "read_model_code", "snapshot_model_code"]
