"""Pub-sub envelopes: a key in front of the body (the Guide's psenvpub/psenvsub).

nanopy messages are single frames, so a "multipart" message is one message
with your own framing. Here each part is a 4-byte big-endian length followed
by its bytes. Because the key is the first part, subscribing to the encoded
key alone is a prefix match on exactly that key ("B" does not match "BB").

    python examples/guide/envelopes.py
"""

from __future__ import annotations

import struct
import threading

import nanopy


def pack(*parts: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in parts)


def unpack(message: bytes) -> list[bytes]:
    parts, pos = [], 0
    while pos < len(message):
        (size,) = struct.unpack_from(">I", message, pos)
        parts.append(message[pos + 4 : pos + 4 + size])
        pos += 4 + size
    if pos != len(message):
        raise ValueError("truncated envelope")
    return parts


def publish(pub: nanopy.Socket, stop: threading.Event) -> None:
    while not stop.wait(0.001):
        pub.send(pack(b"A", b"We don't want to see this"))
        pub.send(pack(b"BB", b"Nor this: the key is BB, not B"))
        pub.send(pack(b"B", b"We would like to see this"))


def main() -> None:
    with nanopy.Socket("pub", bind="tcp://127.0.0.1:0") as pub, nanopy.Socket(
        "sub", connect=pub.endpoints[0].url, recv_timeout=10.0
    ) as sub:
        sub.subscribe(pack(b"B"))
        stop = threading.Event()
        publisher = threading.Thread(target=publish, args=(pub, stop))
        publisher.start()
        try:
            for _ in range(5):
                key, body = unpack(sub.recv())
                print(f"[{key.decode()}] {body.decode()}")
        finally:
            stop.set()
            publisher.join()


if __name__ == "__main__":
    main()
