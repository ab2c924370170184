"""nanopy: pure-Python scalability protocols (nanomsg/NNG wire-compatible) on trio.

::

    import nanopy
    with nanopy.Socket("pull", bind="tcp://127.0.0.1:5555") as pull:
        print(pull.recv())
"""

from __future__ import annotations

from . import zmtp as zmtp
from .auth import ZapAuthenticator as ZapAuthenticator
from .core.errors import AddressError as AddressError
from .core.errors import AddressInUse as AddressInUse
from .core.errors import AuthenticationFailed as AuthenticationFailed
from .core.errors import Closed as Closed
from .core.errors import MessageTooLarge as MessageTooLarge
from .core.errors import NanopyError as NanopyError
from .core.errors import ProtocolError as ProtocolError
from .core.errors import RemoteProtocolError as RemoteProtocolError
from .core.errors import Timeout as Timeout
from .core.message import Message as Message
from .core.message import Pipe as Pipe
from .core.peer import Peer as Peer
from .core.stats import PipeStats as PipeStats
from .core.stats import SocketStats as SocketStats
from .socket.device import adevice as adevice
from .socket.device import device as device
from .socket.endpoint import Endpoint as Endpoint
from .socket.poller import POLLIN as _POLLIN
from .socket.poller import POLLOUT as _POLLOUT
from .socket.poller import Poller as Poller
from .socket.poller import poll as poll
from .socket.socket import Socket as Socket

__version__ = "0.1.0"

# Protocol names, for nanopy.Socket(nanopy.REQ) and friends (plain strings work too).
PAIR = "pair"  #: One peer, both directions (pair0).
PAIR1 = "pair1"  #: One peer, both directions, with a hop count (NNG's pair1).
PUB = "pub"  #: Sends every message to every subscriber.
SUB = "sub"  #: Receives the messages that match its subscriptions.
REQ = "req"  #: Sends requests and receives their replies (resends when unanswered).
REP = "rep"  #: Receives requests and answers each one.
PUSH = "push"  #: Hands each message to one puller (load-balanced).
PULL = "pull"  #: Receives from every pusher (fair-queued).
SURVEYOR = "surveyor"  #: Asks every respondent and collects answers until a deadline.
RESPONDENT = "respondent"  #: Answers surveys.
BUS = "bus"  #: Every message goes to every directly connected peer.

# Poller flags (named as pyzmq's), combined with |.
POLLIN = _POLLIN  #: Poller flag: a ``recv(timeout=0)`` on the socket would succeed now.
POLLOUT = _POLLOUT  #: Poller flag: a ``send(timeout=0)`` on the socket would succeed now.

__all__ = [
    "AddressError", "AddressInUse", "AuthenticationFailed", "BUS", "Closed", "Endpoint", "Message", "MessageTooLarge",
    "NanopyError", "PAIR", "PAIR1", "POLLIN", "POLLOUT", "PUB", "PULL", "PUSH", "Peer", "Pipe", "PipeStats", "Poller",
    "ProtocolError", "REP", "REQ", "RESPONDENT", "RemoteProtocolError", "SUB", "SURVEYOR", "Socket",
    "SocketStats", "Timeout", "ZapAuthenticator", "adevice", "device", "poll",
]


def _fix_module_names() -> None:
    # Show public classes as nanopy.X in reprs, docs and tracebacks.
    for name in __all__:
        obj = globals()[name]
        if isinstance(obj, type):
            obj.__module__ = "nanopy"


_fix_module_names()
