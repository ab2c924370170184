"""Small helpers shared by the socket modules."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self, TypeVar

import sniffio
import trio


class _UseOption:
    """The default of a per-call ``timeout``: use the socket's timeout option."""

    def __repr__(self) -> str:  # shown in help() and the API reference
        return "<the socket's timeout option>"


DEFAULT: Any = _UseOption()
ASYNC_YIELD_EVERY = 64  # fast-path async calls between forced checkpoints


def as_bytes(data: Any) -> bytes:
    """Accept bytes-like data; refuse text with advice."""
    if isinstance(data, bytes):
        if data.__class__ is not bytes and hasattr(data, "parts"):
            from ..core.errors import ProtocolError

            raise ProtocolError(
                "a multipart message cannot be sent here (a survey or a subscription is one "
                "frame); join its frames yourself, or send it on a socket whose endpoints are "
                "zmtp+ URLs"
            )
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        raise TypeError("nanopy sends bytes, not str: encode it first, e.g. data.encode()")
    try:
        return bytes(memoryview(data))
    except TypeError:
        raise TypeError(f"nanopy sends bytes-like data, not {type(data).__name__}") from None


def check_timeout(timeout: Any, default: float | None) -> float | None:
    """A call's ``timeout`` argument: ``default`` for :data:`DEFAULT`, else ``None`` or
    seconds >= 0 as a float; TypeError for what is not a number, ValueError below 0."""
    if timeout is DEFAULT:
        return default
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0, got {timeout}")
    return float(timeout) if timeout is not None else None


async def yield_to_loop() -> None:
    """One checkpoint in whichever loop runs this task (trio or asyncio)."""
    if sniffio.current_async_library() == "trio":
        await trio.lowlevel.checkpoint()
    else:
        import asyncio

        await asyncio.sleep(0)


async def run_in_worker_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run blocking ``fn(*args)`` in a worker thread of the current loop (trio or asyncio)."""
    if sniffio.current_async_library() == "trio":
        return await trio.to_thread.run_sync(fn, *args)
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


_SECTION_STARTS = ("Args:", "Returns:", "Raises:")
_F = TypeVar("_F", bound=Callable[..., Any])


def async_twin_of(sync: Callable[..., Any]) -> Callable[[_F], _F]:
    """Give an async method the Args/Returns/Raises sections of its blocking twin.

    The async method's own docstring says how it differs (a checkpoint, what a
    cancel does); the sections are written once, on the blocking method.
    (Docstrings are compared dedented: Python 3.13 strips their indentation.)
    """
    lines = inspect.cleandoc(sync.__doc__ or "").splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(_SECTION_STARTS)), len(lines))
    sections = "\n".join(lines[first:])

    def attach(method: _F) -> _F:
        own = inspect.cleandoc(method.__doc__ or "")
        method.__doc__ = f"{own}\n\n{sections}" if sections else own
        return method

    return attach


class ClosingContext:
    """``with`` and ``async with`` for a class with ``close()`` and ``aclose()``:
    the block gives the object itself and closes it on the way out."""

    if TYPE_CHECKING:

        def close(self) -> None: ...
        async def aclose(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
