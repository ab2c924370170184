"""A one-line live progress display for the coordinator (stderr, plain or ANSI)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _rate(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"


class ProgressBar:
    """Renders ``done/total``, rate, ETA and in-flight items per worker.

    On a terminal the line is redrawn in place (``\\r`` + erase-line); otherwise a
    plain line is printed every ``plain_interval`` seconds, plus a final one.
    """

    def __init__(self, total: int | None, stream: TextIO | None = None, width: int = 24,
                 interval: float = 0.2, plain_interval: float = 2.0, label: str = "nanopy") -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if self.tty else plain_interval
        self.label = label
        self.started = time.monotonic()
        self._next = 0.0
        self._last_done = 0
        self._last_time = self.started
        self._rate = 0.0

    def line(self, done: int, in_flight: dict[str, int], note: str = "") -> str:
        now = time.monotonic()
        elapsed = max(now - self.started, 1e-9)
        span = now - self._last_time
        if span >= 0.5:
            self._rate = (done - self._last_done) / span
            self._last_done, self._last_time = done, now
        rate = self._rate or done / elapsed
        parts = [self.label]
        if self.total:
            frac = min(done / self.total, 1.0)
            filled = int(frac * self.width)
            parts.append("[" + "#" * filled + "-" * (self.width - filled) + "]")
            parts.append(f"{done}/{self.total} {frac * 100:3.0f}%")
            if 0 < rate and done < self.total:
                parts.append(f"eta {(self.total - done) / rate:.0f}s")
        else:
            parts.append(f"{done} done")
        parts.append(f"{_rate(rate)} items/s")
        flights = " ".join(f"{w}={n}" for w, n in sorted(in_flight.items()))
        parts.append(f"in flight: {flights or '-'}")
        if note:
            parts.append(note)
        return " ".join(parts)

    def update(self, done: int, in_flight: dict[str, int], note: str = "", force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.interval
        text = self.line(done, in_flight, note)
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self, done: int, in_flight: dict[str, int], note: str = "") -> None:
        elapsed = time.monotonic() - self.started
        self._rate = done / max(elapsed, 1e-9)
        self._last_time = time.monotonic() + 1e9  # freeze the average rate
        text = self.line(done, in_flight, note) + f" ({elapsed:.2f}s)"
        self.stream.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        self.stream.flush()
