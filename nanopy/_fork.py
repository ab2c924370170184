"""Fork safety: the one place that knows nanopy's process-wide state and resets it in a child.

After ``os.fork()`` the child runs a single thread, the one that called ``fork``. The
parent's other threads (nanopy's engine, the user's threads, their trio and asyncio
loops) do not exist there, but everything they were doing is copied as it was at that
instant: a lock one of them held stays held for ever, a waiter names a loop that will
never run again, a registry names listeners served by the dead engine, and the child's
copies of the parent's descriptors keep the parent's connections and listening ports
open after the parent has closed them.

CPython's own modules (logging, random, threading, concurrent.futures) deal with this in
``os.register_at_fork`` hooks; nanopy does it here, in one registration (through
nanopy.platform: a system without ``fork``, Windows, has no child to reset):

* **before** ``fork`` (parent): take every :func:`loading_lock` (the plug-in registries),
  so that no import of a protocol or transport is half done when the child is made (the
  child would block for ever importing that module again). At most
  ``QUIESCE_TIMEOUT`` in all; a load that takes longer is logged and left as it is.
* **after** ``fork`` in the parent: release them.
* **in the child**, in this order: the loading locks taken before the fork are released
  (as in the parent); every other lock made by :func:`process_lock` or
  :func:`loading_lock` is made new (``_at_fork_reinit``, as CPython's modules do); the
  child's copy of every kernel socket given to :func:`own` is closed (only the copy:
  the parent's connections and listeners are untouched, and free when the parent closes
  them); every reset registered with :func:`reset_in_child` runs; every object given to
  :func:`track` gets its ``_after_fork_in_child()``.

Nothing in the child wakes, joins or signals anything of the parent's: a waiter of a
parent's thread or loop is dropped, never woken (waking a trio or asyncio waiter would
take that loop's lock, which may be held, and write into a descriptor the parent shares).

``PROCESS_STATE`` below names every piece of process-wide state and what a child gets;
``tests/test_fork_state.py`` keeps it complete (a module-level lock, counter, registry or
cache, or a global a function rebinds, that it does not name fails that test).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from . import platform

log = logging.getLogger("nanopy")

#: How long ``fork()`` may wait, in all, for plug-in loads in other threads to finish.
QUIESCE_TIMEOUT = 2.0

#: Every module-level piece of process-wide state in nanopy, and what a forked child gets.
PROCESS_STATE: dict[str, str] = {
    # the engine and its sockets
    "nanopy.engine.engine._lock": "process_lock: new in the child",
    "nanopy.engine.engine._engine": "dropped: the child starts its own engine on first use",
    "nanopy.engine.engine._test_engine": "dropped (nanopy.testing.engine_in_this_loop of a parent's thread)",
    "nanopy.engine.engine._sockets": "every socket in it fork-closed (calls raise Closed), then emptied",
    # ids and names
    "nanopy.socket.pipes._pipe_ids_lock": "process_lock: new in the child",
    "nanopy.socket.pipes._pipe_ids": "kept: ids stay unique within each process",
    "nanopy.socket.socket._socket_serials": "kept: serials stay unique within each process",
    "nanopy.socket.socket._OPTION_NAMES": "filled at import, read only",
    "nanopy.core.wire._blocks": "kept: a cache of immutable struct.Struct objects (a plain dict, no lock)",
    "nanopy.testing.conformance.target._counter": "kept: names also carry the pid",
    "nanopy.testing._counter": "kept: names also carry the pid",
    "nanopy.pipe.reading.handed_over": "kept: matched by identity with the chunk in hand; a stale slot costs a sum",
    # registries
    "nanopy.protocols._registry.protocols": "loading_lock taken before fork; loaded plug-ins kept",
    "nanopy.transports._registry.transports": "loading_lock taken before fork; loaded plug-ins kept",
    "nanopy.transports.inproc._registry": "ProcessTable: emptied (its listeners were the parent's)",
    "nanopy.transports._ws_server.servers": "ProcessTable: emptied, the child's copies of the ports closed",
    # metrics
    "nanopy.metrics._prometheus_lock": "process_lock: new in the child",
    "nanopy.metrics._prometheus_collectors": "kept: a registry's collector reads the child's own sockets",
    "nanopy.metrics._otel_lock": "process_lock: new in the child",
    "nanopy.metrics._otel_instruments": "kept: the instruments read the child's own sockets",
    "nanopy.metrics._recent_lock": "process_lock: new in the child",
    "nanopy.metrics._recent": "reset_in_child: dropped (a read of the parent's sockets)",
    "nanopy.metrics._recent_served": "reset_in_child: emptied",
    "nanopy.socket.series._counter_fields": "kept: a cache of dataclass fields, read only once filled",
    "nanopy.pipe.resend._wmem": "kept: the kernel's tcp_wmem ceiling, read once",
    "nanopy.platform.portable._warned_no_ifaddr": "kept: the missing ifaddr package is reported once",
    "nanopy.discovery.signing._warned_open": "kept: an open discovery group is reported once",
    "nanopy.socket.series._registry": "reset_in_child: emptied, the child's series start anew (it also checks its pid)",
    # Spark workers (the caches are keyed by os.getpid(): a child never uses the parent's entries)
    "nanopy.spark._source._receivers": "kept, keyed by pid: the parent's receivers are never used",
    "nanopy.spark._source._receivers_lock": "process_lock: new in the child",
    "nanopy.spark._sink._cache": "kept, keyed by pid (_cache_pid)",
    "nanopy.spark._sink._cache_pid": "kept: the pid the cache belongs to, so a child starts its own",
    "nanopy.spark._sink._cache_lock": "process_lock: new in the child",
    "nanopy.spark._spool._filesystems": "kept: pyarrow filesystem objects hold no thread",
    "nanopy.spark._spool._fs_lock": "process_lock: new in the child",
}

_S = TypeVar("_S")

# Appends are atomic under the GIL, and the hooks read copies: no lock of their own
# (the hook that would take it could itself be the one interrupted).
_locks: list[Any] = []  # every process_lock and loading_lock, in creation order
_loading: list[Any] = []  # the loading locks, taken before fork
_resets: list[Callable[[], None]] = []
_tracked: weakref.WeakSet[Any] = weakref.WeakSet()
_os_sockets: weakref.WeakSet[Any] = weakref.WeakSet()  # every kernel socket nanopy made
_taken: list[Any] = []  # loading locks the forking thread holds, between before and after


def process_lock() -> threading.Lock:
    """A lock of process-wide state: the child gets it new (free), whoever held it."""
    lock = threading.Lock()
    _locks.append(lock)
    return lock


def loading_lock() -> threading.RLock:
    """A lock held while code loads (a plug-in import): also taken before ``fork``, so the
    child never inherits a half-imported module. Reentrant: a thread that forks while it
    loads (a plug-in forking at import) does not wait for itself."""
    lock = threading.RLock()
    _locks.append(lock)
    _loading.append(lock)
    return lock


def reset_in_child(reset: Callable[[], None]) -> Callable[[], None]:
    """Register ``reset`` to run in every forked child (after the locks are new); usable
    as a decorator. Resets run in registration order and must not block."""
    _resets.append(reset)
    return reset


def track(obj: Any) -> None:
    """Call ``obj._after_fork_in_child()`` in a forked child while ``obj`` lives: for
    objects with a thread of their own (discovery services, announcers)."""
    _tracked.add(obj)


_SYNC_TYPES = (type(threading.Lock()), type(threading.RLock()), threading.Condition, threading.Event)


def renew_locks(obj: Any) -> None:
    """In a child: make every lock, condition and event among ``obj``'s attributes new
    (for a tracked object's ``_after_fork_in_child``); their waiters are dropped."""
    for value in vars(obj).values():
        if isinstance(value, _SYNC_TYPES):
            value._at_fork_reinit()  # type: ignore[union-attr]


def own(sock: _S) -> _S:
    """Note a kernel socket nanopy made (a listener, a dialed or accepted connection, a
    beacon's datagram socket): a forked child closes its copy (:func:`_release`)."""
    _os_sockets.add(sock)
    return sock


def _release(sock: Any) -> None:
    """In a child: close this process's copy of ``sock``. Only this copy goes: no
    shutdown, nothing on the wire, the parent's connection or listening socket is
    untouched; and once the parent closes its own, its peer sees the end and the
    address is free at once, however long the child lives."""
    try:
        fd = sock.detach()  # (the object forgets the fd: a later close or GC cannot close a reused number)
    except OSError:
        return
    if fd >= 0:
        os.close(fd)


def _before() -> None:
    deadline = time.monotonic() + QUIESCE_TIMEOUT
    for lock in list(_loading):
        if lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            _taken.append(lock)
        else:
            log.warning(
                "os.fork(): a nanopy protocol or transport was still loading in another thread after %g s; "
                "the child may block if it loads the same one", QUIESCE_TIMEOUT,
            )


def _after_in_parent() -> None:
    while _taken:
        _taken.pop().release()


def _after_in_child() -> None:
    # A loading lock taken in _before is held by this thread alone (the only one left):
    # released as in the parent, so a load this thread was itself inside stays balanced.
    # Every other lock may be held by a thread that no longer exists: made new.
    taken = {id(lock) for lock in _taken}
    _after_in_parent()
    for lock in list(_locks):
        if id(lock) not in taken:
            lock._at_fork_reinit()
    for sock in list(_os_sockets):
        _run_in_child(partial(_release, sock))
    _os_sockets.clear()
    for reset in list(_resets):
        _run_in_child(reset)
    for obj in list(_tracked):
        _run_in_child(obj._after_fork_in_child)
    _tracked.clear()


def _run_in_child(step: Callable[[], None]) -> None:
    """One step of the child's reset; a failing one must not stop the others."""
    try:
        step()
    except Exception:  # pragma: no cover - a bug, but the child must still get the rest
        log.exception("nanopy: resetting %r in a forked child failed", step)


platform.register_at_fork(before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child)
