"""The conformance kit's rules: stable ids, what each checks, where the contract says so.

Every failure the kit reports is a :class:`ConformanceError` naming one rule of
:data:`RULES` (``"T10 stalled reader"``) and the section of ``docs/transports.md``
that states the requirement. The ids never change meaning: a plug-in's CI may
select or skip rules by id (``check_transport(rules=...)``). docs/transports.md,
"Conformance rules", lists the same table (tests/test_conformance_kit.py keeps
the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: where the rules are listed (each failure message points here)
DOC = "docs/transports.md"
TABLE = "Conformance rules"


@dataclass(frozen=True)
class Rule:
    """One conformance rule.

    Attributes:
        id: the stable id (``"T10"``; ``T`` rules hold for every transport, ``C``
            rules for a connection that declares a capability).
        name: a few words (``"stalled reader"``).
        checks: what is checked, in one sentence.
        section: the section of docs/transports.md that states the requirement.
    """

    id: str
    name: str
    checks: str
    section: str

    @property
    def title(self) -> str:
        """``"T10 stalled reader"``: how failures name the rule."""
        return f"{self.id} {self.name}"


_IFACE = "The plug-in interface"
_ERRORS = "The plug-in interface: Errors"
_CANCEL = "The plug-in interface: Cancellation"
_CHANNELS = "The plug-in interface: Channels"
_CAPS = "Capabilities"

RULES: tuple[Rule, ...] = (
    Rule("T1", "addresses", "listen() reports the bound address in Listener.url (its scheme kept, a port 0 "
         "replaced by the real port), check_url() accepts that URL, and check_dial_url() refuses "
         "'scheme://' (no address) with AddressError", _IFACE),
    Rule("T2", "bind", "a second listen() on a bound address raises AddressInUse; Listener.aclose() is "
         "prompt, may be called twice, and frees the address for the next listen()", _IFACE),
    Rule("T3", "refused dial", "dial() to an address nobody listens on raises OSError promptly", _IFACE),
    Rule("T4", "round trip", "after both handshakes, batches arrive whole and in order both ways, empty "
         "payloads included, each payload exactly bytes; remote_address is a str", "The plug-in interface: "
         "Payload type"),
    Rule("T5", "wrong peer", "a handshake with a peer of another protocol fails: RemoteProtocolError on at "
         "least one end, and neither end completes its handshake", _ERRORS),
    Rule("T6", "messages", "through sockets: 200 messages each way in order; empty, 1 B, 2**k B up to 1 MiB "
         "and 4 MiB messages each way, intact", "The plug-in interface: Payload type"),
    Rule("T7", "accept cancellation", "a cancelled accept() raises Cancelled promptly, and the listener "
         "then accepts the next connection", _CANCEL),
    Rule("T8", "dial cancellation", "a cancelled dial() or handshake() ends promptly; the listener's end of "
         "a connection it left ends promptly too (its handshake or first receive fails) instead of staying "
         "open", _CANCEL),
    Rule("T9", "receive cancellation", "receive() cancelled while it waits, or again and again in the middle "
         "of a large message, loses nothing: later receives return every payload, in order", _CANCEL),
    Rule("T10", "stalled reader", "send() waits (before buffer_limit bytes) for a peer that reads nothing; "
         "through sockets the sender is held by send_timeout with bounded memory, and once the reader "
         "reads, every message arrives in order and the sender goes on", "The plug-in interface: One writer"),
    Rule("T11", "send cancellation", "a send() that waits for a peer that reads nothing is cancelled "
         "promptly, and the connection then closes promptly", _CANCEL),
    Rule("T12", "partial writes", "a ChannelConnection: frame() gives a chunk with len() and slicing "
         "(frame_overhead exact when set, equal framing -> equal chunks); write_nowait() from another thread "
         "never blocks and returns 0..len(chunk); a chunk cut by write_nowait and finished by write_all(rest) "
         "arrives intact and in order", _CHANNELS),
    Rule("T13", "aclose", "Connection.aclose() never raises, may be called twice, and returns promptly: on a "
         "connection never handshaken, an idle one, and one whose peer reads nothing; the peer's receive "
         "then ends", _CANCEL),
    Rule("T14", "peer EOF", "payloads sent before the peer's close arrive, then receive() raises EOFError or "
         "OSError (not RemoteProtocolError): a graceful close, and a FIN or a RST between messages", _ERRORS),
    Rule("T15", "cut mid-message", "a FIN or a RST in the middle of a message: receive() raises "
         "RemoteProtocolError and delivers no part of that message (wire transports)", _ERRORS),
    Rule("T16", "recv_max_size", "a payload of exactly PipeContext.recv_max_size passes, one byte more raises "
         "MessageTooLarge (or RemoteProtocolError) on the accepting and on the dialing end; through sockets "
         "that pipe closes, counted in protocol_errors, and the socket goes on (wire transports)", _ERRORS),
    Rule("T17", "many pipes", "one listener serves 16 dialers at once: every request's reply reaches its own "
         "requester, and closing half of them leaves the others working", _IFACE),
    Rule("T18", "reconnect", "closing a listener ends its pipes, a dialer finds the address bound again, and "
         "a peer's close ends the pipe", _IFACE),
    Rule("C1", "DirectReadable", "read_nowait() from any thread never blocks (None when nothing is there), "
         "returns complete payloads as bytes after wait_readable(), keeps order with receive(), raises at the "
         "end with failed set; fileno() is -1 once closed", _CAPS),
    Rule("C2", "SinkAttachable", "payloads reach the attached sink in order and exactly once; none while "
         "paused() is true (the sender is held, bounded), the rest by drain_to_sink() once unpaused", _CAPS),
    Rule("C3", "subscriptions", "PUB/SUB through the transport: a subscription made before the pipe, one made "
         "after it, and an unsubscribe take effect (a SubscriptionForwarding connection tells its peer)",
         _CAPS),
    Rule("C4", "JudgesSilence", "silence_blamed() is None (or a str) and None after an ordinary close by the "
         "peer", _CAPS),
    Rule("C5", "OtherWireProtocol", "check_protocol() accepts or refuses each protocol with AddressError (or "
         "ProtocolError), and a refused socket cannot bind the scheme", _CAPS),
    Rule("C6", "KernelSocketBacked", "kernel_socket() is the stream socket the connection uses (the two ends' "
         "addresses match), and aclose() closes it", _CAPS),
    Rule("C7", "ReportsWriteWait", "waiting_for_room is false while idle, true while a write waits for a peer "
         "that reads nothing, false again once the write is done", _CAPS),
    Rule("C8", "CountsUnwritten", "after a write_all() cut by the peer's reset, unwritten_bytes() is None or "
         "the part of the chunk the kernel never took (0 < n <= len)", _CAPS),
    Rule("C9", "DiscardsMessages", "count_drops_with() takes the counter, and a clean exchange counts no "
         "drop", _CAPS),
    Rule("C10", "PeerWatching", "with dead_peer_timeout set, keepalive is a task that keeps a live peer for "
         "twice the timeout, spares a busy pipe whose peer is silent, and ends a silent peer's pipe with "
         "TimeoutError(ETIMEDOUT) within about the timeout", _CAPS),
    Rule("C11", "WriteWindow", "over a req/rep pair: window() is a positive int with nothing outstanding, "
         "the hook given to watch_window() is called whenever a write or the peer's replies move the window, "
         "and a window's worth of requests is answered in order", _CAPS),
)

RULES_BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}


class ConformanceError(AssertionError):
    """A transport broke a conformance rule.

    An ``AssertionError``, so a plain test fails with it. The message names the
    rule (``[T10 stalled reader]``), the scheme, what happened, and the section of
    docs/transports.md that states the requirement.

    Attributes:
        rule: the :class:`Rule` broken (the first one, with ``keep_going``).
        scheme: the scheme checked.
        detail: what happened.
        failures: with ``check_transport(keep_going=True)``, every rule's failure.
    """

    def __init__(self, rule: Rule, scheme: str, detail: str, failures: list[ConformanceError] | None = None) -> None:
        self.rule = rule
        self.scheme = scheme
        self.detail = detail
        self.failures = failures if failures is not None else [self]
        if len(self.failures) > 1:
            text = f"{scheme}: {len(self.failures)} rules broken:\n" + "\n".join(str(f) for f in self.failures)
        else:
            text = (f"[{rule.title}] {scheme}: {detail} -- rule: {rule.checks} "
                    f"(see {DOC}, \"{TABLE}\" {rule.id}, and \"{rule.section}\")")
        super().__init__(text)


class NotApplicable(Exception):
    """A rule does not apply to this transport (the reason is reported as the skip)."""


@dataclass
class Report:
    """What :func:`~nanopy.testing.check_transport` did.

    Attributes:
        scheme: the scheme checked.
        passed: ids of the rules that passed, in the order run.
        skipped: rule id -> why it does not apply (a capability not declared, no wire).
        seconds: rule id -> how long it took.
    """

    scheme: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def select(ids: object) -> list[Rule]:
    """The rules named by ``ids`` (an iterable of ids; None: all), in table order.

    Raises:
        ValueError: an id that names no rule.
    """
    if ids is None:
        return list(RULES)
    if isinstance(ids, str):
        ids = [ids]
    wanted = {str(i).upper() for i in ids}  # type: ignore[attr-defined]
    unknown = sorted(wanted - set(RULES_BY_ID))
    if unknown:
        raise ValueError(f"no conformance rule {', '.join(unknown)}; the rules are {', '.join(RULES_BY_ID)}")
    return [rule for rule in RULES if rule.id in wanted]
