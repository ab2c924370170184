"""A loopback S3 server for spool tests: moto in server mode, started and stopped by PID."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from nanopy.testing import free_port

_free_port = free_port  # (nanopy.testing's shared helper)


@contextmanager
def s3_server(workdir: str) -> Iterator[str]:
    """Yield ``host:port`` of a fresh moto S3 server on 127.0.0.1."""
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    if exe is None:
        import pytest

        pytest.skip("moto[server] is not installed (it is in the 'test' extra)")
    port = _free_port()
    with open(os.path.join(workdir, "moto.log"), "wb") as log:
        proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log, cwd=workdir)
    try:
        deadline = time.monotonic() + 60
        while True:  # poll until the server accepts connections (an external process)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start (exit {proc.poll()})") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def bucket_uri(endpoint: str, bucket: str, path: str) -> str:
    """An s3:// spool URI for ``bucket`` (created if needed) on the loopback server."""
    from pyarrow import fs

    query = f"endpoint_override={endpoint}&scheme=http&region=us-east-1"
    filesystem, _ = fs.FileSystem.from_uri(f"s3://testing:testing@{bucket}?{query}&allow_bucket_creation=true")
    filesystem.create_dir(bucket)
    return f"s3://testing:testing@{bucket}/{path}?{query}"
