"""Optional TLS (and mutual TLS) for WAN links, configured by a frozen dataclass.

WAN links cross networks the job does not own, so gateways can wrap their TCP links in TLS; mutual TLS
(``require_client_cert``) lets a gateway refuse sites that do not hold a certificate from the job's CA,
before any application byte is read. Contexts come from :func:`ssl.create_default_context`, i.e. the
platform's secure defaults (TLS ≥ 1.2, hostname checking on the client).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from wanrt.config import check
from wanrt.errors import ConfigError

if TYPE_CHECKING:
    import ssl

__all__ = ["TLSConfig"]


@dataclass(frozen=True)
class TLSConfig:
    """TLS settings for one side of a link.

    A server needs ``certfile`` (+ ``keyfile`` unless the key is inside ``certfile``); with
    ``require_client_cert`` it also needs ``cafile`` to verify clients. A client verifies the server with
    ``cafile`` (or the system store when omitted) against ``server_hostname`` (default: the URL's host) and
    presents ``certfile`` for mutual TLS.
    """

    certfile: str | None = None
    keyfile: str | None = None
    cafile: str | None = None
    require_client_cert: bool = False
    server_hostname: str | None = None

    def __post_init__(self) -> None:
        check(
            self.keyfile is None or self.certfile is not None,
            "keyfile",
            self.keyfile,
            "a key without a certfile is useless",
        )
        check(
            not self.require_client_cert or self.cafile is not None,
            "require_client_cert",
            self.require_client_cert,
            "needs cafile to verify client certificates",
        )

    def server_context(self) -> ssl.SSLContext:
        """Context for the accepting side; a missing or unreadable file is a ConfigError naming the key."""
        import ssl  # on use only: the sans-IO gateway node imports this config

        if self.certfile is None:
            raise ConfigError("a TLS server needs certfile", key="certfile")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._load_chain(ctx)
        if self.require_client_cert:
            self._load_ca(ctx)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_context(self) -> ssl.SSLContext:
        import ssl  # on use only: the sans-IO gateway node imports this config

        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if self.cafile is not None:
            self._load_ca(ctx)
        if self.certfile is not None:
            self._load_chain(ctx)
        return ctx

    def _load_chain(self, ctx: ssl.SSLContext) -> None:
        import ssl  # on use only: the sans-IO gateway node imports this config

        assert self.certfile is not None
        try:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load TLS certificate {self.certfile!r}: {exc}", key="certfile", value=self.certfile
            ) from None

    def _load_ca(self, ctx: ssl.SSLContext) -> None:
        import ssl  # on use only: the sans-IO gateway node imports this config

        try:
            ctx.load_verify_locations(cafile=self.cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load TLS CA file {self.cafile!r}: {exc}", key="cafile", value=self.cafile
            ) from None
