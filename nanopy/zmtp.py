"""ZeroMQ interoperability (the public face of nanopy/transports/zmtp/): see that
package's docstring and docs/zmtp.md."""

from __future__ import annotations

from .transports.zmtp import Multipart as Multipart
from .transports.zmtp import curve_keypair as curve_keypair
from .transports.zmtp import public_key as public_key

__all__ = ["Multipart", "curve_keypair", "public_key"]
