"""The source's write-ahead spool: a log of received messages on any pyarrow filesystem.

The log is a directory of Arrow IPC files, one per group of messages taken off the
socket together, named ``<after>-<last>.arrow`` by the sequence numbers they hold
(``after`` < seq <= ``last``). A file is complete or absent: on a local disk it is
written, fsynced, renamed into place and the directory fsynced; on an object store
(S3, GCS, Azure) the upload is atomic; elsewhere (HDFS) it is written under a
temporary name and moved. Offsets handed to Spark are positions in this log, so a
restart (in a new process, or on another host) finds every message a previous run
took off the wire.

Paths: a local path (made absolute), ``file://...``, or any URI pyarrow.fs
understands: ``hdfs://namenode:8020/dir``, ``s3://bucket/dir`` (credentials and
``?endpoint_override=host:port&scheme=http`` in the URI or the usual AWS variables).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from typing import Any, NamedTuple

import pyarrow as pa

from .. import _fork, platform
from ._options import SourceOptionError

_ATOMIC_PUT = ("s3", "gcs", "abfs")
_filesystems: dict[str, tuple[Any, str]] = {}
_fs_lock = _fork.process_lock()


def normalize(uri: str) -> str:
    """Local paths become absolute (executors do not share the driver's cwd)."""
    if "://" in uri:
        return uri
    return os.path.abspath(os.path.expanduser(uri))


def redact(uri: str) -> str:
    """The URI without credentials (``s3://key:secret@bucket`` -> ``s3://***@bucket``)."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}://{authority}{slash}{path.split('?')[0]}"


def _resolve(uri: str) -> tuple[Any, str]:
    with _fs_lock:
        found = _filesystems.get(uri)
        if found is None:
            from pyarrow import fs

            try:
                found = fs.FileSystem.from_uri(uri)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, ValueError) as exc:
                raise SourceOptionError(
                    f"spoolPath {redact(uri)}: not a filesystem pyarrow can open ({exc})") from None
            _filesystems[uri] = found
        return found


class Segment(NamedTuple):
    """One spool file: the messages ``after`` < seq <= ``last``, ``size`` bytes on disk."""

    after: int
    last: int
    path: str
    size: int


class Spool:
    """One query's spool directory (plain values; the filesystem is opened lazily)."""

    def __init__(self, uri: str) -> None:
        self.uri = normalize(uri)
        self.display = redact(self.uri)

    def __repr__(self) -> str:
        return f"<nanopy spool {self.display}>"

    def _fs(self) -> tuple[Any, str]:
        return _resolve(self.uri)

    def prepare(self) -> None:
        """Create the directory; raise a clear error if the filesystem refuses."""
        fs, root = self._fs()
        try:
            fs.create_dir(root, recursive=True)
            fs.get_file_info(root)
        except (OSError, pa.ArrowException) as exc:
            raise SourceOptionError(f"spoolPath {self.display} cannot be created or reached: {exc}") from None
        self.remove_partial()

    def remove_partial(self) -> int:
        """Delete ``*.tmp`` files: writes a crash cut short (their messages were never
        counted as received). Only the query's own receiver writes here, and it runs
        once, so anything temporary at its start is left over. Returns how many."""
        from pyarrow import fs as pafs

        filesystem, root = self._fs()
        try:
            infos = filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        except (OSError, pa.ArrowException):
            return 0
        removed = 0
        for info in infos:
            if info.base_name.endswith(".tmp"):
                try:
                    filesystem.delete_file(info.path)
                    removed += 1
                except (OSError, pa.ArrowException):
                    pass
        return removed

    def segments(self) -> list[Segment]:
        """Every complete file, in order."""
        from pyarrow import fs as pafs

        filesystem, root = self._fs()
        try:
            infos = filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        except (OSError, pa.ArrowException):
            return []
        out = []
        for info in infos:
            name = info.base_name
            if not name.endswith(".arrow"):
                continue
            a, _, b = name[:-6].partition("-")
            if a.isdigit() and b.isdigit():
                out.append(Segment(int(a), int(b), info.path, int(info.size or 0)))
        return sorted(out)

    def end(self) -> int:
        """The last sequence number in the log (0 when empty)."""
        found = self.segments()
        return found[-1][1] if found else 0

    def write(self, after: int, last: int, batch: pa.RecordBatch) -> Segment:
        """Append one group durably."""
        filesystem, root = self._fs()
        name = f"{after:020d}-{last:020d}.arrow"
        local = root if filesystem.type_name == "local" else None
        if local is not None:
            path, size = _write_local(local, name, batch)
            return Segment(after, last, path, size)
        path = f"{root.rstrip('/')}/{name}"
        target = path if filesystem.type_name in _ATOMIC_PUT else path + ".tmp"
        with filesystem.open_output_stream(target) as out:
            with pa.ipc.new_file(out, batch.schema) as writer:
                writer.write_batch(batch)
            size = out.tell()
        if target != path:
            filesystem.move(target, path)
        return Segment(after, last, path, size)

    def trim(self, committed: int, known: list[Segment] | None = None) -> None:
        """Delete every file whose messages are all at or below ``committed``."""
        filesystem, _ = self._fs()
        for _, last, path, _ in (known if known is not None else self.segments()):
            if last <= committed:
                try:
                    filesystem.delete_file(path)
                except (FileNotFoundError, OSError, pa.ArrowException):
                    pass

    def read(self, after: int, last: int, schema: pa.Schema,
             files: list[Segment] | None = None) -> list[pa.RecordBatch]:
        """The messages with ``after`` < seq <= ``last``; all of them, or a clear error.

        ``files`` (the planner's list) saves listing the directory."""
        return list(self.iter_read(after, last, schema, files))

    def iter_read(self, after: int, last: int, schema: pa.Schema,
                  files: list[Segment] | None = None) -> Any:
        """:meth:`read`, one file at a time (an executor holds one file in memory)."""
        filesystem, _ = self._fs()
        local = filesystem.type_name == "local"
        covered = 0
        for a, b, path, _ in (files if files is not None else self.segments()):
            if b <= after or a >= last:
                continue
            try:
                source = pa.memory_map(path) if local else filesystem.open_input_file(path)
            except (FileNotFoundError, OSError, pa.ArrowException):
                break  # counted as missing below
            with source:
                table = pa.ipc.open_file(source).read_all()
            # A file holds seq a+1 .. b in order: cut by position, not by a filter.
            lo, hi = max(after, a) - a, min(last, b) - a
            table = table.slice(lo, hi - lo)
            for field in schema:  # a column a file of an older nanopy lacks (parts) is null
                if field.name not in table.column_names:
                    table = table.append_column(field, pa.nulls(table.num_rows, field.type))
            table = table.select(schema.names)
            covered += table.num_rows
            for batch in table.to_batches():
                yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)
        if covered != last - after:
            raise RuntimeError(
                f"nanopy source: the spool {self.display} holds {covered} of the {last - after} messages "
                f"{after + 1}..{last} this batch needs. The files are missing: the spool must be on "
                "storage every executor can read (not a local disk of the driver host), and one "
                "spool directory serves one query only."
            )


def _write_local(root: str, name: str, batch: pa.RecordBatch) -> tuple[str, int]:
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, name)
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        with pa.ipc.new_file(f, batch.schema) as writer:
            writer.write_batch(batch)
        f.flush()
        size = f.tell()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    platform.fsync_directory(root)  # the rename itself is durable
    return final, size


# -- the default spool (no spoolPath) ---------------------------------------------------
_DEFAULT_PREFIX = "nanopy-spool-"


def default_root() -> str:
    """Where default spools live: Spark's scratch space on the driver host
    (the first of ``SPARK_LOCAL_DIRS``, as Spark passes it to its Python helpers),
    else the temporary directory."""
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d.strip()]
    return dirs[0].strip() if dirs else tempfile.gettempdir()


class DefaultSpool(Spool):
    """A spool of this process only, for a source without ``spoolPath``.

    The directory holds a ``.lock`` that its process keeps locked while it lives;
    a directory whose lock can be taken belongs to a process that died and is
    removed by the next default spool made on this host.
    """

    def __init__(self, root: str | None = None) -> None:
        base = root or default_root()
        sweep_default_spools(base)
        path = os.path.join(base, f"{_DEFAULT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
        # Locked before it gets its name, so a sweep never sees it unlocked.
        os.makedirs(path + ".new")
        self._lock = open(os.path.join(path + ".new", ".lock"), "w")  # noqa: SIM115 - held for life
        platform.lock_file(self._lock, wait=True)
        os.rename(path + ".new", path)
        super().__init__(path)

    def __reduce__(self) -> Any:
        return (Spool, (self.uri,))  # executors get a plain reader of the same directory


def sweep_default_spools(base: str) -> int:
    """Remove default spools of dead processes under ``base``; returns how many."""
    removed = 0
    try:
        names = [n for n in os.listdir(base) if n.startswith(_DEFAULT_PREFIX) and not n.endswith(".new")]
    except OSError:
        return 0
    for name in names:
        path = os.path.join(base, name)
        try:
            with open(os.path.join(path, ".lock")) as lock:
                platform.lock_file(lock, wait=False)
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        except OSError:
            continue  # alive (locked), or not ours to remove
    return removed
