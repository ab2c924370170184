"""The transport conformance kit: :func:`check_transport` (re-exported by nanopy.testing).

It holds a transport -- built-in or a plug-in's -- to the rules of
docs/transports.md, "Conformance rules": each rule has a stable id (:data:`RULES`),
and a failure (:class:`ConformanceError`) names it and the section that states it.
The rules are checked on the plug-in interface directly (raw.py, wire.py, caps.py:
cancellation, a stalled reader, partial writes, ``aclose``, cuts by a proxy,
capabilities) and through real sockets (sockets.py: messages, many pipes, the
receive limit, reconnects, subscriptions).

May call: the plug-in interface, the public Socket API and the registries.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from ... import transports
from . import caps, raw, sockets, wire
from .rules import DOC, RULES, RULES_BY_ID, TABLE, ConformanceError, NotApplicable, Report, Rule, select
from .target import Check, Target, free_port, local_url, wait_for

__all__ = [
    "DOC", "RULES", "RULES_BY_ID", "TABLE", "ConformanceError", "Report", "Rule",
    "check_transport", "free_port", "local_url", "wait_for",
]

#: bytes a transport may take for a peer that reads nothing before rule T10 calls
#: it unbounded (loopback kernel buffers take a few MiB)
BUFFER_LIMIT = 32 << 20

Step = Callable[[Check], Awaitable[None]] | Callable[[Check], None]

#: each rule's steps, run in order (async ones on the plug-in interface in a trio
#: run of their own, plain ones through sockets)
STEPS: dict[str, tuple[Step, ...]] = {
    "T1": (raw.addresses,),
    "T2": (raw.bind,),
    "T3": (raw.refused_dial,),
    "T4": (raw.round_trip,),
    "T5": (raw.wrong_peer,),
    "T6": (sockets.messages,),
    "T7": (raw.accept_cancellation,),
    "T8": (raw.dial_cancellation,),
    "T9": (raw.receive_cancellation,),
    "T10": (wire.stalled_reader, sockets.stalled_reader),
    "T11": (raw.send_cancellation,),
    "T12": (wire.partial_writes,),
    "T13": (raw.aclose_rules,),
    "T14": (wire.peer_eof,),
    "T15": (wire.cut_mid_message,),
    "T16": (wire.recv_max_size, sockets.recv_max_size),
    "T17": (sockets.many_pipes,),
    "T18": (sockets.reconnect,),
    "C1": (caps.direct_readable,),
    "C2": (caps.sink_attachable,),
    "C3": (sockets.subscriptions,),
    "C4": (caps.judges_silence,),
    "C5": (caps.other_wire_protocol,),
    "C6": (caps.kernel_socket_backed,),
    "C7": (caps.reports_write_wait,),
    "C8": (caps.counts_unwritten,),
    "C9": (caps.discards_messages,),
    "C10": (caps.peer_watching,),
    "C11": (caps.write_window,),
}


def check_transport(
    scheme: str,
    *,
    url: str | None = None,
    bind_options: Mapping[str, Any] | None = None,
    connect_options: Mapping[str, Any] | None = None,
    timeout: float = 10.0,
    rules: Iterable[str] | str | None = None,
    skip: Iterable[str] = (),
    keep_going: bool = False,
    buffer_limit: int = BUFFER_LIMIT,
) -> Report:
    """Check that transport ``scheme`` keeps every conformance rule nanopy's own transports keep.

    The rules (:data:`RULES`; docs/transports.md, "Conformance rules") run in table
    order, each in a trio run of its own with every step bounded: addresses and
    binds, refused dials, batches both ways, a peer of another protocol, messages
    from empty to 4 MiB, cancellation of accept/dial/handshake/receive/send, a
    stalled reader (the sender held, bounded memory), a channel's partial writes,
    ``aclose()`` idempotent and prompt, the peer's end between messages and inside
    one (through a cutting proxy), ``recv_max_size``, 16 pipes at once, reconnects,
    subscriptions, and each capability the connection declares. A rule that does
    not apply (a capability not declared, no wire to cut) is skipped.

    Args:
        scheme: the registered scheme to check (``nanopy.transports.schemes()``).
        url: the address to bind; default a fresh :func:`local_url` for each
            listener (``scheme://127.0.0.1:0`` for host:port schemes). A given
            ``url`` is bound by each step's first listener (one step at a time);
            a second listener of the same step gets a fresh :func:`local_url`.
        bind_options, connect_options: endpoint options, e.g. an ``ssl_context``;
            they reach the transport in ``PipeContext.options`` as a socket's would.
        timeout: seconds one step may take (a cancellation or a close gets 2 s).
        rules: ids of the rules to run (``["T10", "C1"]``); default all.
        skip: ids of rules not to run.
        keep_going: run every rule and report all failures at once (the
            :class:`ConformanceError` raised lists them in ``failures``).
        buffer_limit: bytes the transport may take for a peer that reads nothing
            before rule T10 calls its memory unbounded.

    Returns:
        A :class:`Report`: the rules passed, skipped (with why) and their seconds.

    Raises:
        ConformanceError: a rule was broken (an ``AssertionError``); the message
            names the rule (``[T10 stalled reader]``) and the docs section.
        ValueError: ``scheme`` is not registered, or a rule id is unknown.
    """
    if scheme not in transports.schemes():
        raise ValueError(f"no transport registered for {scheme!r}; registered: {', '.join(transports.schemes())}")
    skipped = {rule.id for rule in select(list(skip))} if skip else set()
    chosen = [rule for rule in select(rules) if rule.id not in skipped and rule.id in STEPS]
    target = Target(
        scheme=scheme, transport=transports.get(scheme), url=url or local_url(scheme, "check"),
        bind_options=dict(bind_options or {}), connect_options=dict(connect_options or {}),
        timeout=timeout, buffer_limit=buffer_limit, fixed_url=url is not None,
    )
    report = Report(scheme)
    failures: list[ConformanceError] = []
    for rule in chosen:
        started = time.monotonic()
        try:
            _run_rule(target, rule)
        except NotApplicable as why:
            report.skipped[rule.id] = str(why)
        except ConformanceError as failure:
            if not keep_going:
                raise
            failures.append(failure)
        else:
            report.passed.append(rule.id)
        report.seconds[rule.id] = time.monotonic() - started
    if failures:
        first = failures[0]
        raise ConformanceError(first.rule, scheme, first.detail, failures)
    return report


def _run_rule(target: Target, rule: Rule) -> None:
    """Run a rule's steps; an unexpected error is the rule's failure too."""
    for step in STEPS[rule.id]:
        ck = Check(target, rule)
        try:
            if inspect.iscoroutinefunction(step):
                ck.run(step)
            else:
                step(ck)
        except (ConformanceError, NotApplicable):
            raise
        except Exception as exc:  # noqa: BLE001 - reported under the rule it broke
            raise ConformanceError(rule, target.scheme, f"{type(exc).__name__}: {exc}") from exc
