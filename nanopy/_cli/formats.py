"""nanocat's output formats, byte for byte.

Each formatter turns one message body into the exact bytes ``nanocat`` writes for it.
"Printable" means C ``isprint`` in the C locale: 0x20 (space) through 0x7e (``~``).
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


def fmt_quoted(body: bytes) -> bytes:
    """Double-quoted with C-like escapes (``\\n \\r \\\\ \\"``, ``\\xHH`` for the rest)."""
    table = _QUOTED_TABLE
    return b'"' + b"".join([table[b] for b in body]) + b'"\n'


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


def fmt_hex(body: bytes) -> bytes:
    """Double-quoted, every byte as ``\\xHH`` (lower-case)."""
    table = _HEX_TABLE
    return b'"' + b"".join([table[b] for b in body]) + b'"\n'


FORMATTERS: dict[str, Formatter] = {
    "no": fmt_no,
    "raw": fmt_raw,
    "ascii": fmt_ascii,
    "quoted": fmt_quoted,
    "msgpack": fmt_msgpack,
    "hex": fmt_hex,
}
