"""The public surface: every exported name exists, is documented and shows as nanopy.X."""

from __future__ import annotations

import importlib
import subprocess
import sys

import nanopy


def test_every_public_name_is_exported_and_documented() -> None:
    for name in nanopy.__all__:
        obj = getattr(nanopy, name)
        if isinstance(obj, str):  # protocol constants
            assert obj == name.lower()
            continue
        assert obj.__doc__, f"nanopy.{name} has no docstring"
        if isinstance(obj, type):
            assert obj.__module__ == "nanopy", f"nanopy.{name} shows as {obj.__module__}"


def test_error_hierarchy_matches_the_contract() -> None:
    assert issubclass(nanopy.Timeout, (nanopy.NanopyError, TimeoutError))
    assert issubclass(nanopy.AddressError, (nanopy.NanopyError, ValueError))
    assert issubclass(nanopy.AddressInUse, (nanopy.NanopyError, OSError))
    for cls in (nanopy.Closed, nanopy.ProtocolError, nanopy.MessageTooLarge):
        assert issubclass(cls, nanopy.NanopyError)


def test_public_modules_import() -> None:
    for module in ("nanopy.discovery", "nanopy.transports", "nanopy.protocols", "nanopy.testing", "nanopy.metrics"):
        importlib.import_module(module)


def run_python(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (which must exit 0)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_starts_no_thread_and_no_loop() -> None:
    # Spark workers and forked children rely on this: nothing runs until a socket needs it.
    code = (
        "import threading, nanopy, nanopy.discovery, nanopy.transports, nanopy.protocols; "
        "s = nanopy.Socket('push'); print(threading.active_count()); s.close()"
    )
    assert run_python(code) == "1"


def test_metrics_module_surface() -> None:
    import nanopy.metrics

    for name in nanopy.metrics.__all__:
        obj = getattr(nanopy.metrics, name)
        assert obj.__doc__, f"nanopy.metrics.{name} has no docstring"
    assert nanopy.PipeStats.__module__ == "nanopy"


def test_importing_metrics_needs_no_extra() -> None:
    # prometheus_client and opentelemetry are imported only by the calls that need them.
    code = (
        "import sys; sys.modules['prometheus_client'] = None; sys.modules['opentelemetry'] = None; "
        "import nanopy.metrics; print(nanopy.metrics.render() == '')"
    )
    assert run_python(code) == "True"
