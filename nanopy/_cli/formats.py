"""nanocat's output formats, byte for byte, and their form for multipart messages.

Each formatter turns one message body into the exact bytes ``nanocat`` writes for it.
"Printable" means C ``isprint`` in the C locale: 0x20 (space) through 0x7e (``~``).

A ZeroMQ multipart message (``zmtp+`` URLs; nanocat has none) is still one record,
so message and frame boundaries both stay visible (:data:`MULTIPART_FORMATTERS`):
``ascii`` separates the frames with a tab (a tab inside a frame prints as ``.``),
``quoted`` and ``hex`` with a space between the quoted frames, ``msgpack`` writes
an array of ``bin`` objects, and ``raw`` the frames back to back (it shows no
boundaries at all, as for single messages). A single-frame message prints exactly
as nanocat prints it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

Formatter = Callable[[bytes], bytes]

FORMAT_NAMES = ("no", "raw", "ascii", "quoted", "msgpack", "hex")


def _printable(byte: int) -> bool:
    return 0x20 <= byte <= 0x7E


# 256-entry tables: one lookup per byte, then a single join.
_ASCII_TABLE = bytes(b if _printable(b) else 0x2E for b in range(256))  # 0x2e == "."
_QUOTED_ESCAPES = {0x0A: b"\\n", 0x0D: b"\\r", 0x5C: b"\\\\", 0x22: b'\\"'}
_QUOTED_TABLE = [
    _QUOTED_ESCAPES.get(b) or (bytes([b]) if _printable(b) else b"\\x%02x" % b) for b in range(256)
]
_HEX_TABLE = [b"\\x%02x" % b for b in range(256)]


def fmt_no(body: bytes) -> bytes:
    """The default: print nothing."""
    return b""


def fmt_raw(body: bytes) -> bytes:
    """The body as is, no delimiter."""
    return body


def fmt_ascii(body: bytes) -> bytes:
    """Printable bytes as is, others as ``.``; then a newline."""
    return body.translate(_ASCII_TABLE) + b"\n"


def _quoted(body: bytes) -> bytes:
    table = _QUOTED_TABLE
    return b'"' + b"".join([table[b] for b in body]) + b'"'


def fmt_quoted(body: bytes) -> bytes:
    """Double-quoted with C-like escapes (``\\n \\r \\\\ \\"``, ``\\xHH`` for the rest)."""
    return _quoted(body) + b"\n"


def fmt_msgpack(body: bytes) -> bytes:
    """A msgpack ``bin`` object: bin8, bin16 or bin32 header by length."""
    n = len(body)
    if n < 0x100:
        head = struct.pack(">BB", 0xC4, n)
    elif n < 0x10000:
        head = struct.pack(">BH", 0xC5, n)
    else:
        head = struct.pack(">BI", 0xC6, n & 0xFFFFFFFF)
    return head + body


def _hex(body: bytes) -> bytes:
    table = _HEX_TABLE
    return b'"' + b"".join([table[b] for b in body]) + b'"'


def fmt_hex(body: bytes) -> bytes:
    """Double-quoted, every byte as ``\\xHH`` (lower-case)."""
    return _hex(body) + b"\n"


FORMATTERS: dict[str, Formatter] = {
    "no": fmt_no,
    "raw": fmt_raw,
    "ascii": fmt_ascii,
    "quoted": fmt_quoted,
    "msgpack": fmt_msgpack,
    "hex": fmt_hex,
}


# -- multipart messages: one record of several frames (see the module docstring) --------
MultipartFormatter = Callable[[list[bytes]], bytes]


def multi_ascii(frames: list[bytes]) -> bytes:
    """The frames as ``ascii`` prints them, separated by tabs, then a newline."""
    return b"\t".join([f.translate(_ASCII_TABLE) for f in frames]) + b"\n"


def multi_quoted(frames: list[bytes]) -> bytes:
    """Each frame quoted as ``quoted`` does, separated by spaces, then a newline."""
    return b" ".join(map(_quoted, frames)) + b"\n"


def multi_hex(frames: list[bytes]) -> bytes:
    """Each frame as ``hex`` quotes it, separated by spaces, then a newline."""
    return b" ".join(map(_hex, frames)) + b"\n"


def multi_msgpack(frames: list[bytes]) -> bytes:
    """A msgpack array (fixarray, array16 or array32) of one ``bin`` object per frame."""
    n = len(frames)
    if n < 0x10:
        head = bytes([0x90 | n])
    elif n < 0x10000:
        head = struct.pack(">BH", 0xDC, n)
    else:
        head = struct.pack(">BI", 0xDD, n)
    return head + b"".join(map(fmt_msgpack, frames))


MULTIPART_FORMATTERS: dict[str, MultipartFormatter] = {
    "no": lambda frames: b"",
    "raw": b"".join,
    "ascii": multi_ascii,
    "quoted": multi_quoted,
    "msgpack": multi_msgpack,
    "hex": multi_hex,
}
