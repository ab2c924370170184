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
import threading
from typing import Any

import pyarrow as pa

from ._options import SourceOptionError

_ATOMIC_PUT = ("s3", "gcs", "abfs")
_filesystems: dict[str, tuple[Any, str]] = {}
_fs_lock = threading.Lock()


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

    def segments(self) -> list[tuple[int, int, str]]:
        """``(after, last, path)`` of every complete file, in order."""
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
                out.append((int(a), int(b), info.path))
        return sorted(out)

    def end(self) -> int:
        """The last sequence number in the log (0 when empty)."""
        found = self.segments()
        return found[-1][1] if found else 0

    def write(self, after: int, last: int, batch: pa.RecordBatch) -> str:
        """Append one group durably; returns its path."""
        filesystem, root = self._fs()
        name = f"{after:020d}-{last:020d}.arrow"
        local = root if filesystem.type_name == "local" else None
        if local is not None:
            return _write_local(local, name, batch)
        path = f"{root.rstrip('/')}/{name}"
        target = path if filesystem.type_name in _ATOMIC_PUT else path + ".tmp"
        with filesystem.open_output_stream(target) as out, pa.ipc.new_file(out, batch.schema) as writer:
            writer.write_batch(batch)
        if target != path:
            filesystem.move(target, path)
        return path

    def trim(self, committed: int, known: list[tuple[int, int, str]] | None = None) -> None:
        """Delete every file whose messages are all at or below ``committed``."""
        filesystem, _ = self._fs()
        for _, last, path in (known if known is not None else self.segments()):
            if last <= committed:
                try:
                    filesystem.delete_file(path)
                except (FileNotFoundError, OSError, pa.ArrowException):
                    pass

    def read(self, after: int, last: int, schema: pa.Schema) -> list[pa.RecordBatch]:
        """The messages with ``after`` < seq <= ``last``; all of them, or a clear error."""
        import pyarrow.compute as pc

        filesystem, _ = self._fs()
        out: list[pa.RecordBatch] = []
        covered = 0
        for a, b, path in self.segments():
            if b <= after or a >= last:
                continue
            with filesystem.open_input_file(path) as f:
                table = pa.ipc.open_file(f).read_all()
            seq = table.column("seq")
            table = table.filter(pc.and_(pc.greater(seq, after), pc.less_equal(seq, last)))
            table = table.select(schema.names)
            covered += table.num_rows
            for batch in table.to_batches():
                out.append(pa.RecordBatch.from_arrays(batch.columns, schema=schema))
        if covered != last - after:
            raise RuntimeError(
                f"nanopy source: the spool {self.display} holds {covered} of the {last - after} messages "
                f"{after + 1}..{last} this batch needs. The files are missing: the spool must be on "
                "storage every executor can read (not a local disk of the driver host), and one "
                "spool directory serves one query only."
            )
        return out


def _write_local(root: str, name: str, batch: pa.RecordBatch) -> str:
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, name)
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        with pa.ipc.new_file(f, batch.schema) as writer:
            writer.write_batch(batch)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself is durable
    finally:
        os.close(fd)
    return final
