"""Object storage (``s3://``, ``gs://``) for prepare and for a dataset's small files, through
``pyarrow.fs``.

Credentials: ``storage_options`` maps a scheme to the keyword arguments of pyarrow's
``S3FileSystem`` or ``GcsFileSystem`` (the prepare operator builds them from an Airflow
connection); without them pyarrow finds its own (``AWS_*`` variables, an instance or pod
role, ``GOOGLE_APPLICATION_CREDENTIALS``, workload identity), and the endpoint of a
compatible server from ``AWS_ENDPOINT_URL`` or ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` (a GCS
emulator, used without credentials). A scheme's options may also name the Airflow connection
they came from (``conn_id``), which an error then names.

Every request is bounded: a store, or a credential lookup (a cloud metadata server), that does
not answer fails within about :data:`GCS_RETRY_SECONDS` (GCS) or :data:`S3_CONNECT_SECONDS` times
:data:`S3_ATTEMPTS` (S3) with an error naming the location, the connection (or that none was
given) and what to set, instead of hanging in pyarrow's default lookup.
The options hold secrets: they never appear in an error message, a manifest or a log line."""

from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .errors import DataError, InputDataError

SCHEMES = ("s3", "gs")
StorageOptions = Mapping[str, Mapping[str, Any]]
"""Per scheme (``"s3"``, ``"gs"``), the keyword arguments of pyarrow's file system, and
optionally ``conn_id``: the Airflow connection they were read from (named in errors)."""

CONN_ID = "conn_id"
_CONN_PARAMETER = {"s3": "aws_conn_id", "gs": "gcp_conn_id"}
_ENVIRONMENT = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ~/.aws, an instance or pod role; AWS_ENDPOINT_URL "
          "for an S3-compatible server",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS, workload identity or the metadata server; "
          "CLOUD_STORAGE_EMULATOR_ENDPOINT for an emulator",
}
GCS_RETRY_SECONDS = 20
"""How long a GCS request (the credential lookup included) is retried before it fails;
pyarrow's default is 15 minutes, which looks like a hang."""
S3_CONNECT_SECONDS = 5
S3_REQUEST_SECONDS = 30  # a transfer stalled this long is aborted (and retried)
S3_ATTEMPTS = 3
FILESYSTEMS_KEPT = 8
"""File systems kept for reuse, the least recently used dropped first: one per set of
credentials, so a long-lived worker does not keep one for every rotated key."""

_FILESYSTEMS: OrderedDict[tuple[str, str], Any] = OrderedDict()
_LOCK = threading.Lock()


def scheme_of(uri: str | os.PathLike[str]) -> str | None:
    """``"s3"`` or ``"gs"`` for an object-storage URI; None for a local path or ``file://`` URI."""
    text = os.fspath(uri)
    if "://" not in text or text.startswith("file://"):
        return None
    return text.split("://", 1)[0].lower()


def is_remote(uri: str | os.PathLike[str]) -> bool:
    return scheme_of(uri) is not None


def check_location(uri: str | os.PathLike[str], what: str) -> None:
    """Refuse a URI whose scheme is neither local nor one of :data:`SCHEMES`, naming ``what``."""
    scheme = scheme_of(uri)
    if scheme is not None and scheme not in SCHEMES:
        raise DataError(f"{what} {os.fspath(uri)!r}: {scheme}:// is not supported; use a local or mounted "
                        "path, file://, s3:// or gs://")


def join(uri: str, *parts: str) -> str:
    """``uri`` with ``parts`` appended; DataError when ``uri`` names no bucket to put them in."""
    if is_remote(uri):
        _bucket_path(uri)
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def _bucket_path(uri: str) -> str:
    """The ``<bucket>/<path>`` of an object-storage URI; DataError naming the URI when it has no bucket."""
    path = uri.split("://", 1)[1].strip("/")
    if not path:
        raise DataError(f"{uri!r} names no bucket; use {scheme_of(uri)}://<bucket>/<path>")
    return path


def filesystem(uri: str, options: StorageOptions | None = None) -> tuple[Any, str]:
    """(pyarrow file system, path inside it) of an ``s3://``/``gs://`` URI. With options for the
    scheme the file system is built from them, else from the environment (its credentials, the
    bucket's region), with every request bounded (see the module's notes)."""
    check_location(uri, "location")
    scheme = scheme_of(uri)
    if scheme is None:
        raise DataError(f"{uri!r} is a local path, not an object-storage URI")
    path = _bucket_path(uri)
    given = dict((options or {}).get(scheme) or {})
    conn_id = given.pop(CONN_ID, None)
    bucket = path.split("/", 1)[0]
    # Without options the bucket is part of the key: its region is part of the file system.
    key = (scheme, json.dumps([conn_id, given], sort_keys=True, default=str) + ("" if given else bucket))
    with _LOCK:
        cached = _FILESYSTEMS.get(key)
        if cached is None:
            try:
                cached = _s3(bucket, given) if scheme == "s3" else _gcs(given)
            except (OSError, TypeError, ValueError) as exc:
                # The message of a TypeError names an option, never its value.
                raise DataError(_failure(f"cannot open {scheme}://{bucket}", exc, scheme, conn_id)) from None
            _FILESYSTEMS[key] = cached
            while len(_FILESYSTEMS) > FILESYSTEMS_KEPT:
                _FILESYSTEMS.popitem(last=False)
        else:
            _FILESYSTEMS.move_to_end(key)
    return cached, path


def _gcs(given: dict[str, Any]) -> Any:
    import pyarrow.fs as pafs

    bounds: dict[str, Any] = {"retry_time_limit": timedelta(seconds=GCS_RETRY_SECONDS)}
    if not given and os.environ.get("CLOUD_STORAGE_EMULATOR_ENDPOINT"):
        bounds["anonymous"] = True  # an emulator takes no credentials
    return pafs.GcsFileSystem(**{**bounds, **given})


def _s3(bucket: str, given: dict[str, Any]) -> Any:
    import pyarrow.fs as pafs

    bounds: dict[str, Any] = {"connect_timeout": S3_CONNECT_SECONDS, "request_timeout": S3_REQUEST_SECONDS,
                              "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=S3_ATTEMPTS)}
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if not given and endpoint:  # pyarrow's S3FileSystem does not read it itself
        bounds.update(_endpoint(endpoint, "AWS_ENDPOINT_URL"))
    elif not given and not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        bounds["region"] = pafs.resolve_s3_region(bucket)  # as pyarrow does for an s3:// URI
    return pafs.S3FileSystem(**{**bounds, **given})


def _failure(what: str, exc: BaseException, scheme: str | None, conn_id: str | None) -> str:
    """``what`` failed: pyarrow's reason, then where the credentials came from and what to set."""
    if scheme not in _CONN_PARAMETER:
        return f"{what}: {_reason(exc)}"
    parameter = _CONN_PARAMETER[scheme]
    if conn_id:
        source = (f"credentials and endpoint from Airflow connection {conn_id!r} ({parameter}); "
                  "check that connection's fields")
    else:
        source = (f"no Airflow connection was given ({parameter}), so the environment's credentials were "
                  f"looked up ({_ENVIRONMENT[scheme]}); set {parameter}, or those credentials")
    return f"{what}: {_reason(exc)}; {source}"


def _conn_id(uri: str, options: StorageOptions | None) -> str | None:
    return ((options or {}).get(scheme_of(uri) or "") or {}).get(CONN_ID)


def _reason(exc: BaseException) -> str:
    """pyarrow's error text on one line (the AWS SDK's spans several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclass(frozen=True)
class RemoteFile:
    """An input file in object storage; equal and hashed by its URI. ``str()`` is the URI."""

    uri: str
    filesystem: Any = field(compare=False, repr=False)
    path: str = field(compare=False, repr=False)
    size: int = field(compare=False, repr=False)
    conn_id: str | None = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def stat(self) -> Any:
        return SimpleNamespace(st_size=self.size)

    def is_file(self) -> bool:
        return True

    def __str__(self) -> str:
        return self.uri

    def open_stream(self, decompress: bool = True) -> Any:
        """A sequential stream of the file (``.gz``/``.bz2`` decompressed unless told not to)."""
        try:
            return self.filesystem.open_input_stream(self.path, compression="detect" if decompress else None)
        except OSError as exc:
            raise InputDataError(_failure(f"cannot read input file {self.uri}", exc, scheme_of(self.uri),
                                          self.conn_id)) from None

    def open_random(self) -> Any:
        """A seekable file (Parquet footers, the members of a .npz)."""
        try:
            return self.filesystem.open_input_file(self.path)
        except OSError as exc:
            raise InputDataError(_failure(f"cannot read input file {self.uri}", exc, scheme_of(self.uri),
                                          self.conn_id)) from None


InputPath = Path | RemoteFile


def identity(path: InputPath | str) -> str:
    """What names an input file in the fingerprint (and, by its last part, in the split's hash): its
    absolute path, or its URI."""
    if isinstance(path, RemoteFile):
        return path.uri
    text = os.fspath(path)
    return text if is_remote(text) else os.path.abspath(text)


def open_binary(path: InputPath) -> Any:
    """The file's bytes as stored (no decompression), for fingerprinting."""
    return path.open_stream(decompress=False) if isinstance(path, RemoteFile) else open(path, "rb")


def open_text(path: RemoteFile) -> io.TextIOWrapper:
    """A text file (UTF-8, newlines kept for the csv module), decompressed by its suffix."""
    return io.TextIOWrapper(io.BufferedReader(path.open_stream()), encoding="utf-8", newline="")


def _info(fs: Any, path: str, uri: str, options: StorageOptions | None) -> Any:
    try:
        return fs.get_file_info(path)
    except OSError as exc:
        raise InputDataError(_failure(f"cannot read {uri}", exc, scheme_of(uri), _conn_id(uri, options))) from None


def _listing(fs: Any, path: str, uri: str, recursive: bool, options: StorageOptions | None) -> list[Any]:
    import pyarrow.fs as pafs

    try:
        return fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=recursive))
    except OSError as exc:
        raise InputDataError(_failure(f"cannot list {uri}", exc, scheme_of(uri), _conn_id(uri, options))) from None


def _file(uri: str, fs: Any, info: Any, options: StorageOptions | None) -> RemoteFile:
    """The object ``info`` lists, named with the scheme of ``uri``."""
    return RemoteFile(f"{scheme_of(uri)}://{info.path}", fs, info.path, int(info.size or 0), _conn_id(uri, options))


def _glob(uri: str, fs: Any, path: str, options: StorageOptions | None) -> list[RemoteFile]:
    """The objects matching a glob: ``*``, ``?`` and ``[...]`` inside one level, ``**`` across levels."""
    import pyarrow.fs as pafs

    base = path[:min(path.index(ch) for ch in "*?[" if ch in path)].rsplit("/", 1)[0]
    pattern = path.replace("**/", "*").replace("**", "*")
    depth = None if "**" in path else path.count("/")
    recursive = depth is None or depth > base.count("/") + 1
    matched = sorted((i for i in _listing(fs, base, uri, recursive, options) if i.type == pafs.FileType.File
                      and fnmatch.fnmatchcase(i.path, pattern) and depth in (None, i.path.count("/"))),
                     key=lambda i: i.path)
    if not matched:
        raise InputDataError(f"input glob {uri!r} matches no files; check the path and pattern")
    return [_file(uri, fs, i, options) for i in matched]


def resolve_remote(uri: str, options: StorageOptions | None, suffixes: tuple[str, ...]) -> list[RemoteFile]:
    """The files of an input URI: one object, every ``suffixes`` object directly under a
    prefix, or a glob (see :func:`_glob`)."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri, options)
    if any(ch in path for ch in "*?["):
        return _glob(uri, fs, path, options)
    info = _info(fs, path, uri, options)
    if info.type == pafs.FileType.File:
        return [_file(uri, fs, info, options)]
    if info.type == pafs.FileType.Directory:
        inside = sorted((i for i in _listing(fs, path, uri, False, options) if i.type == pafs.FileType.File
                         and i.base_name.lower().endswith(suffixes)), key=lambda i: i.path)
        if not inside:
            raise InputDataError(f"input directory {uri} holds no {', '.join(suffixes)} files")
        return [_file(uri, fs, i, options) for i in inside]
    raise InputDataError(f"input {uri} does not exist; check the bucket and path")


# -- a dataset's files ------------------------------------------------------------------------
def read_text(uri: str, options: StorageOptions | None = None) -> str:
    """The text of an object; FileNotFoundError when there is none."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri, options)
    if _info(fs, path, uri, options).type != pafs.FileType.File:
        raise FileNotFoundError(uri)
    try:
        with fs.open_input_stream(path, compression=None) as stream:
            return stream.read().decode("utf-8")
    except OSError as exc:
        raise DataError(_failure(f"cannot read {uri}", exc, scheme_of(uri), _conn_id(uri, options))) from None


def exists(uri: str, options: StorageOptions | None = None) -> bool:
    """Whether an object, or any object under the prefix, exists."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri, options)
    return _info(fs, path, uri, options).type != pafs.FileType.NotFound


def _files_by_child(uri: str, options: StorageOptions | None) -> Iterator[tuple[str, Any]]:
    """(name of a prefix directly under ``uri``, file info) for every file below such a prefix.
    Derived from the files: stores list an implicit directory's prefix in differing ways, and an
    empty directory marker (pyarrow writes them to S3) outlives its files."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri, options)
    for info in _listing(fs, path, uri, True, options):
        child, _, rest = info.path[len(path) + 1:].partition("/")
        if info.type == pafs.FileType.File and info.path.startswith(path + "/") and rest:
            yield child, info


def child_directories(uri: str, options: StorageOptions | None = None) -> list[str]:
    """Names of the prefixes directly under ``uri`` that hold files (none when it does not exist)."""
    return sorted({child for child, _ in _files_by_child(uri, options)})


def abandoned_children(uri: str, prefix: str, max_age: float, options: StorageOptions | None = None) -> list[str]:
    """Names of the prefixes directly under ``uri`` that start with ``prefix`` and whose newest
    file was written more than ``max_age`` seconds ago (a younger one may still be in use)."""
    newest: dict[str, float] = {}
    for child, info in _files_by_child(uri, options):
        if child.startswith(prefix) and info.mtime is not None:
            newest[child] = max(newest.get(child, 0.0), info.mtime.timestamp())
    now = time.time()
    return sorted(child for child, written in newest.items() if now - written > max_age)


def delete(uri: str, options: StorageOptions | None = None) -> None:
    """Delete every object under the prefix ``uri`` (nothing to delete is fine); a file named
    ``_SUCCESS`` goes first, so no reader takes what is left for complete."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri, options)
    listing = _listing(fs, path, uri, True, options)
    objects = sorted((i.path for i in listing if i.type == pafs.FileType.File), key=lambda p: not p.endswith("/_SUCCESS"))
    for name in objects:
        try:
            fs.delete_file(name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise DataError(_failure(f"cannot delete {scheme_of(uri)}://{name}", exc, scheme_of(uri),
                                     _conn_id(uri, options))) from None
    # Then the empty directory markers pyarrow writes to S3, deepest first: left behind, the
    # prefix would still exist. A store without markers has nothing left to delete.
    markers = sorted((i.path for i in listing if i.type == pafs.FileType.Directory), key=len, reverse=True)
    for marker in [*markers, path]:
        with contextlib.suppress(OSError):
            fs.delete_dir(marker)
    if exists(uri, options):
        raise DataError(f"cannot delete {uri}: objects are still listed under it after deleting them; delete them by hand")


def upload_tree(directory: Path, uri: str, options: StorageOptions | None = None,
                last: str | None = None) -> Iterator[str]:
    """Copy every file under ``directory`` to ``uri`` (same relative names), the file named
    ``last`` after all others (a marker that says the rest is complete). Yields each URI written."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri, options)
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == last)  # stable: the marker moves to the end
    local = pafs.LocalFileSystem()
    for source in files:
        relative = source.relative_to(directory).as_posix()
        target = f"{path}/{relative}"
        try:
            pafs.copy_files(str(source), target, source_filesystem=local, destination_filesystem=fs)
        except OSError as exc:
            raise DataError(_failure(f"uploading {source.name} to {join(uri, relative)} failed", exc,
                                     scheme_of(uri), _conn_id(uri, options))) from None
        yield join(uri, relative)


def copy_tree(source: str, target: str, options: StorageOptions | None = None, last: str | None = None) -> int:
    """Copy every object under ``source`` to the same names under ``target`` inside the store
    (server-side copies), the object named ``last`` after all others; returns how many."""
    import pyarrow.fs as pafs

    fs, source_path = filesystem(source, options)
    _, target_path = filesystem(target, options)
    names = sorted(i.path[len(source_path) + 1:] for i in _listing(fs, source_path, source, True, options)
                   if i.type == pafs.FileType.File)
    names.sort(key=lambda name: name.rsplit("/", 1)[-1] == last)  # stable: the marker moves to the end
    for name in names:
        try:
            fs.copy_file(f"{source_path}/{name}", f"{target_path}/{name}")
        except OSError as exc:
            raise DataError(_failure(f"copying {join(source, name)} to {join(target, name)} failed", exc,
                                     scheme_of(source), _conn_id(source, options))) from None
    return len(names)


# -- options from a connection's fields ------------------------------------------------------
def _endpoint(url: str, what: str) -> dict[str, str]:
    """``http://host:port`` -> pyarrow's ``scheme`` and ``endpoint_override``."""
    scheme, _, host = str(url).partition("://")
    if not host or scheme not in ("http", "https") or "/" in host.rstrip("/"):
        raise DataError(f"{what} {url!r} is not an endpoint URL; use http(s)://host[:port]")
    return {"scheme": scheme, "endpoint_override": host.rstrip("/")}


def s3_options(login: str | None, password: str | None, extra: Mapping[str, Any], conn_id: str) -> dict[str, Any]:
    """pyarrow ``S3FileSystem`` options from an AWS connection as Airflow's Amazon provider
    keeps it: access key id (login), secret key (password); extra ``region_name``,
    ``aws_session_token``, ``endpoint_url`` (an S3-compatible server; also read from
    ``service_config.s3.endpoint_url``). ``conn_id`` is kept to be named in errors."""
    options: dict[str, Any] = {CONN_ID: conn_id}
    if login or password:
        if not (login and password):
            raise DataError(f"connection {conn_id!r}: give both the access key id (login) and the secret key "
                            "(password), or neither to use the environment's credentials")
        options.update(access_key=login, secret_key=password)
        if extra.get("aws_session_token"):
            options["session_token"] = extra["aws_session_token"]
    if extra.get("region_name"):
        options["region"] = str(extra["region_name"])
    endpoint = extra.get("endpoint_url") or ((extra.get("service_config") or {}).get("s3") or {}).get("endpoint_url")
    if endpoint:
        options.update(_endpoint(endpoint, f"connection {conn_id!r}: endpoint_url"))
    return options


def gcs_options(extra: Mapping[str, Any], conn_id: str) -> dict[str, Any]:
    """pyarrow ``GcsFileSystem`` options from a Google Cloud connection: extra ``key_path`` or
    ``keyfile_dict`` (a service-account key: needs the ``google-auth`` package, which the
    Google provider installs, to turn it into an access token), ``project``, and
    ``endpoint_url`` (a GCS-compatible server; without a key it is used anonymously); and
    ``conn_id``, named in errors."""
    def get(name: str) -> Any:  # the provider's newer bare keys, or its older prefixed ones
        return extra.get(name) or extra.get(f"extra__google_cloud_platform__{name}")

    options: dict[str, Any] = {CONN_ID: conn_id}
    if get("project"):
        options["project_id"] = str(get("project"))
    key = get("keyfile_dict") or get("key_path")
    if key:
        options.update(_access_token(key, conn_id))
    if get("endpoint_url"):
        options.update(_endpoint(get("endpoint_url"), f"connection {conn_id!r}: endpoint_url"))
        options.setdefault("anonymous", not key)
    return options


def _access_token(key: Any, conn_id: str) -> dict[str, Any]:
    """An access token minted from a service-account key (a file path or the key's JSON)."""
    try:
        from google.auth.transport.requests import Request
        from google.oauth2 import service_account
    except ImportError:
        raise DataError(f"connection {conn_id!r} holds a service-account key, which needs the google-auth "
                        "package (installed with apache-airflow-providers-google); install it, or leave "
                        "gcp_conn_id out to use the environment's credentials (GOOGLE_APPLICATION_CREDENTIALS, "
                        "workload identity)") from None
    scopes = ["https://www.googleapis.com/auth/devstorage.read_write"]
    try:
        info = key if isinstance(key, Mapping) else json.loads(key) if str(key).lstrip().startswith("{") else None
        credentials = (service_account.Credentials.from_service_account_info(info, scopes=scopes) if info
                       else service_account.Credentials.from_service_account_file(str(key), scopes=scopes))
        credentials.refresh(Request())
    except Exception as exc:  # google-auth's errors vary; the key itself never reaches the message
        raise DataError(f"connection {conn_id!r}: its service-account key gave no access token "
                        f"({type(exc).__name__}); check the key") from None
    return {"access_token": credentials.token, "credential_token_expiration": credentials.expiry}
