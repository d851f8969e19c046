"""TLS and mutual TLS over TCP (and unix), with a throwaway PKI generated per test session."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.transports.conftest import echo, read_exactly
from transports import TLSConfig, Transport, connect, listen
from transports.stream import StreamTransport
from wanrt.errors import AuthError, ConfigError, TransportError


def server_tls(f: dict[str, str], mutual: bool = False) -> TLSConfig:
    return TLSConfig(
        certfile=f["server_cert"], keyfile=f["server_key"], cafile=f["ca"], require_client_cert=mutual
    )


async def test_tls_round_trip(tls_files: dict[str, str]) -> None:
    async with await listen("tcp://127.0.0.1:0", echo, tls=server_tls(tls_files)) as lst:
        t = await connect(lst.url, tls=TLSConfig(cafile=tls_files["ca"]))
        assert isinstance(t, StreamTransport) and t.tls
        payload = bytes(range(256)) * 4000
        await t.send([payload[:1000], memoryview(payload)[1000:]])
        assert await read_exactly(t, len(payload)) == payload
        await t.close()


async def test_tls_over_unix_socket(tls_files: dict[str, str], tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/tls.sock"
    async with await listen(url, echo, tls=server_tls(tls_files)):
        t = await connect(url, tls=TLSConfig(cafile=tls_files["ca"], server_hostname="localhost"))
        await t.send([b"over unix"])
        assert await read_exactly(t, 9) == b"over unix"
        await t.close()


async def test_mutual_tls_presents_client_identity(tls_files: dict[str, str]) -> None:
    seen: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    async def who(t: Transport) -> None:
        assert isinstance(t, StreamTransport)
        seen.set_result(t.get_extra_info("peercert"))
        await echo(t)

    async with await listen("tcp://127.0.0.1:0", who, tls=server_tls(tls_files, mutual=True)) as lst:
        client = TLSConfig(
            certfile=tls_files["client_cert"], keyfile=tls_files["client_key"], cafile=tls_files["ca"]
        )
        t = await connect(lst.url, tls=client)
        await t.send([b"ping"])
        assert await read_exactly(t, 4) == b"ping"
        cert = await seen
        assert isinstance(cert, dict)
        assert (("commonName", "site-b"),) in cert["subject"]
        await t.close()


@pytest.mark.parametrize("who", ["no-cert", "rogue-cert"])
async def test_mutual_tls_rejects_unauthenticated_clients(tls_files: dict[str, str], who: str) -> None:
    handled = False

    async def handler(t: Transport) -> None:
        nonlocal handled
        handled = True
        await echo(t)

    async with await listen("tcp://127.0.0.1:0", handler, tls=server_tls(tls_files, mutual=True)) as lst:
        if who == "no-cert":
            client = TLSConfig(cafile=tls_files["ca"])
        else:
            client = TLSConfig(
                certfile=tls_files["rogue_cert"], keyfile=tls_files["rogue_key"], cafile=tls_files["ca"]
            )
        # With TLS 1.3 the client finishes its half of the handshake before the server checks the client
        # certificate, so the refusal may surface at connect or on the first recv.
        with pytest.raises(TransportError):
            t = await connect(lst.url, tls=client)
            await t.send([b"let me in"])
            if await t.recv() == b"":
                raise TransportError("closed without a reply")
    assert not handled


async def test_client_rejects_server_signed_by_unknown_ca(tls_files: dict[str, str]) -> None:
    async with await listen("tcp://127.0.0.1:0", echo, tls=server_tls(tls_files)) as lst:
        with pytest.raises(AuthError):
            await connect(lst.url, tls=TLSConfig(cafile=tls_files["rogue_ca"]))
        with pytest.raises(AuthError):  # right CA, wrong name
            await connect(lst.url, tls=TLSConfig(cafile=tls_files["ca"], server_hostname="evil.example"))


def test_tls_config_validation(tls_files: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="keyfile"):
        TLSConfig(keyfile="k.pem")
    with pytest.raises(ConfigError, match="require_client_cert"):
        TLSConfig(certfile="c.pem", require_client_cert=True)
    with pytest.raises(ConfigError) as info:
        TLSConfig().server_context()
    assert info.value.fields["key"] == "certfile"
    with pytest.raises(ConfigError) as info:
        TLSConfig(certfile=str(tmp_path / "missing.pem")).server_context()
    assert info.value.fields["key"] == "certfile"
    with pytest.raises(ConfigError) as info:
        TLSConfig(cafile=str(tmp_path / "missing.pem")).client_context()
    assert info.value.fields["key"] == "cafile"


async def test_tls_on_mem_is_a_config_error(tls_files: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        await connect("mem://x", tls=TLSConfig(cafile=tls_files["ca"]))
