"""Shared helpers: a listener per transport kind whose handler echoes or records what it receives."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from transports import Listener, Transport, listen

_names = itertools.count()

KINDS = ("tcp", "unix", "mem")

ListenFactory = Callable[[Callable[[Transport], Awaitable[None]]], Awaitable[Listener]]


def url_for(kind: str, tmp_path: Path) -> str:
    if kind == "tcp":
        return "tcp://127.0.0.1:0"
    if kind == "unix":
        return f"unix://{tmp_path}/s{next(_names)}.sock"
    return f"mem://test-{next(_names)}"


async def echo(t: Transport) -> None:
    while data := await t.recv():
        await t.send([data])


async def read_all(t: Transport) -> bytes:
    out = bytearray()
    while data := await t.recv():
        out += data
    return bytes(out)


async def read_exactly(t: Transport, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = await t.recv(n - len(out))
        if not data:
            raise EOFError(f"EOF after {len(out)} of {n} bytes")
        out += data
    return bytes(out)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def serve(kind: str, tmp_path: Path) -> AsyncIterator[ListenFactory]:
    """``await serve(handler)`` -> a started listener of the parametrized kind, closed at teardown."""
    listeners: list[Listener] = []

    async def start(handler: Callable[[Transport], Awaitable[None]]) -> Listener:
        lst = await listen(url_for(kind, tmp_path), handler)
        listeners.append(lst)
        return lst

    yield start
    for lst in listeners:
        await lst.aclose()
    await asyncio.sleep(0)


def _make_pki_with_cryptography(d: Path) -> dict[str, str]:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        (d / f"{stem}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        (d / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(name(cn))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return key, cert

    def leaf(
        cn: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, server: bool
    ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return key, builder.sign(ca_key, hashes.SHA256())

    ca_key, ca_cert = ca("wanrt test CA")
    write("ca", ca_key, ca_cert)
    write("server", *leaf("localhost", ca_key, ca_cert, server=True))
    write("client", *leaf("site-b", ca_key, ca_cert, server=False))
    rogue_key, rogue_cert = ca("rogue CA")
    write("rogue", *leaf("mallory", rogue_key, rogue_cert, server=False))
    write("rogue-ca", rogue_key, rogue_cert)
    return _pki_paths(d)


def _make_pki_with_openssl(d: Path) -> dict[str, str]:
    """The same PKI via the ``openssl`` CLI, for machines without the cryptography package."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    def key(stem: str) -> None:
        run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{stem}.key")

    def ca(stem: str, cn: str) -> None:
        key(stem)
        (d / f"{stem}.ext").write_text(
            "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
            "subjectKeyIdentifier=hash\n"
        )
        run("req", "-new", "-key", f"{stem}.key", "-subj", f"/CN={cn}", "-out", f"{stem}.csr")
        run(
            "x509", "-req", "-in", f"{stem}.csr", "-signkey", f"{stem}.key", "-days", "2",
            "-extfile", f"{stem}.ext", "-out", f"{stem}.pem",
        )  # fmt: skip

    def leaf(stem: str, cn: str, issuer: str, server: bool) -> None:
        key(stem)
        ext = "basicConstraints=critical,CA:FALSE\nauthorityKeyIdentifier=keyid\n"
        ext += (
            "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
            if server
            else ("extendedKeyUsage=clientAuth\n")
        )
        (d / f"{stem}.ext").write_text(ext)
        run("req", "-new", "-key", f"{stem}.key", "-subj", f"/CN={cn}", "-out", f"{stem}.csr")
        run(
            "x509", "-req", "-in", f"{stem}.csr", "-CA", f"{issuer}.pem", "-CAkey", f"{issuer}.key",
            "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "1",
            "-extfile", f"{stem}.ext", "-out", f"{stem}.pem",
        )  # fmt: skip

    ca("ca", "wanrt test CA")
    leaf("server", "localhost", "ca", server=True)
    leaf("client", "site-b", "ca", server=False)
    ca("rogue-ca", "rogue CA")
    leaf("rogue", "mallory", "rogue-ca", server=False)
    return _pki_paths(d)


def _pki_paths(d: Path) -> dict[str, str]:
    return {
        "ca": str(d / "ca.pem"),
        "server_cert": str(d / "server.pem"),
        "server_key": str(d / "server.key"),
        "client_cert": str(d / "client.pem"),
        "client_key": str(d / "client.key"),
        "rogue_cert": str(d / "rogue.pem"),
        "rogue_key": str(d / "rogue.key"),
        "rogue_ca": str(d / "rogue-ca.pem"),
    }


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A test PKI: a CA, a server cert for localhost/127.0.0.1, a client cert, and a rogue CA + client.

    Made with the cryptography package when importable, else the openssl CLI (``WANRT_TEST_PKI=openssl``
    forces the CLI path, to test it), else the TLS tests skip.
    """
    d = tmp_path_factory.mktemp("pki")
    has_cli = shutil.which("openssl") is not None
    if os.environ.get("WANRT_TEST_PKI") != "openssl":
        try:
            import cryptography  # noqa: F401
        except ImportError:
            pass
        else:
            return _make_pki_with_cryptography(d)
    if not has_cli:
        pytest.skip("neither the cryptography package nor the openssl CLI is available")
    return _make_pki_with_openssl(d)
