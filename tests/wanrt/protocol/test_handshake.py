"""Handshake: mutual HMAC proofs, wrong secrets on either side, replays, version negotiation, info maps."""

from __future__ import annotations

import pytest

from tests.wanrt.protocol.pair import SECRET, counter_nonces, feed, make_pair
from wanrt.errors import AuthError, ConfigError, LocalProtocolError, RemoteProtocolError
from wanrt.protocol import (
    Auth,
    ConnectionClosed,
    Error,
    ErrorCode,
    Hello,
    ProtocolConfig,
    Reject,
    Role,
    State,
    Welcome,
)
from wanrt.protocol.auth import client_proof, server_proof
from wanrt.protocol.connection import Connection
from wanrt.protocol.frame import encode_frame
from wanrt.protocol.messages import MsgType


def test_handshake_succeeds_and_both_sides_learn_each_other() -> None:
    pair = make_pair()
    hello, welcome = pair.handshake(
        client_info={"model": "sha1:abc", "rank": 0}, server_info={"iteration": 41}
    )
    c, s = pair.client, pair.server
    assert c.state is State.AUTHENTICATED and s.state is State.AUTHENTICATED
    assert (s.peer_site, s.peer_role, s.peer_info) == (
        "site-a",
        Role.TRAINER,
        {"model": "sha1:abc", "rank": 0},
    )
    assert (c.peer_site, c.peer_role, c.peer_info) == ("gw-a", Role.GATEWAY, {"iteration": 41})
    assert c.version == s.version == 1
    assert hello.nonce != welcome.nonce
    assert welcome.proof == server_proof(SECRET, hello, welcome)


def test_wrong_secret_on_the_client_side_fails_at_the_welcome() -> None:
    pair = make_pair(client_secret=b"another-secret-0123456789")
    pair.c2s(pair.client.hello())
    with pytest.raises(AuthError):
        pair.s2c(pair.server.accept())
    assert pair.client.state is State.ERROR
    with pytest.raises(LocalProtocolError):
        pair.client.authenticate()
    with pytest.raises(LocalProtocolError):
        pair.client.next_event()
    # the client can still tell the server why, once; the server sees an Error and closes
    (err,) = pair.c2s(pair.client.abort(pair.client.error))[:1]
    assert isinstance(err, Error) and err.code == ErrorCode.AUTH
    assert pair.server.state is State.CLOSED
    assert pair.client.abort() == b""


def test_wrong_secret_on_the_server_side_is_caught_by_both_ends() -> None:
    """The client refuses the server's proof; and a client that ignores that and answers with a proof made
    from its (different) secret is refused by the server."""
    honest = make_pair(server_secret=b"server-has-other-secret-42")
    honest.c2s(honest.client.hello())
    with pytest.raises(AuthError):
        honest.s2c(honest.server.accept())

    pair = make_pair(server_secret=b"server-has-other-secret-42")
    (hello,) = pair.c2s(pair.client.hello())
    welcome_frame = pair.server.accept()
    pair.client.receive_data(welcome_frame)
    with pytest.raises(AuthError):
        pair.client.next_event()
    assert isinstance(hello, Hello)
    welcome = pair.server._welcome
    assert welcome is not None
    # a rogue client framing its proof by hand (Connection.send refuses to send a proof that is not ours)
    forged = Auth(client_proof(SECRET, hello, welcome))
    frame = b"".join(encode_frame(welcome.version, MsgType.AUTH, forged.to_wire()[0]))
    with pytest.raises(AuthError):
        feed(pair.server, frame)
    assert pair.server.state is State.ERROR
    assert not pair.server.authenticated


def test_recorded_client_handshake_cannot_be_replayed_against_a_fresh_server() -> None:
    original = make_pair(server_seed=7)
    original.handshake()
    recorded = b"".join(original.client_wire)  # Hello + Auth, as an eavesdropper saw them
    victim = make_pair(server_seed=8)  # a new connection draws a new server nonce
    victim.server.receive_data(recorded)
    assert isinstance(victim.server.next_event(), Hello)
    victim.server.accept()
    with pytest.raises(AuthError):
        victim.server.next_event()
    assert victim.server.state is State.ERROR
    # with the same server nonce the recording is accepted: the nonce is the only thing that stops it
    same = make_pair(server_seed=7)
    same.server.receive_data(recorded)
    same.server.next_event()
    same.server.accept()
    assert isinstance(same.server.next_event(), Auth) and same.server.authenticated


def test_recorded_welcome_cannot_be_replayed_against_a_fresh_client() -> None:
    original = make_pair(client_seed=3)
    original.handshake()
    recorded_welcome = original.server_wire[0]
    victim = make_pair(client_seed=4)
    victim.client.hello()
    victim.client.receive_data(recorded_welcome)
    with pytest.raises(AuthError):
        victim.client.next_event()


def test_client_for_another_job_is_refused_and_told_why() -> None:
    pair = make_pair(client_job="job-2")
    pair.server.receive_data(pair.client.hello())
    with pytest.raises(AuthError):
        pair.server.next_event()
    (reject,) = feed(pair.client, pair.server.abort(pair.server.error))[:1]
    assert isinstance(reject, Reject) and reject.code == ErrorCode.AUTH
    assert pair.client.state is State.CLOSED
    assert pair.client.next_event() == ConnectionClosed(clean=True, reason=reject.reason)


@pytest.mark.parametrize(
    ("client_versions", "server_versions", "chosen"),
    [((1,), (1,), 1), ((1, 2, 3), (2, 3, 4), 3), ((5, 1), (1, 5, 9), 5), ((1, 2), (2,), 2)],
)
def test_version_negotiation_picks_the_highest_common(client_versions, server_versions, chosen) -> None:  # type: ignore[no-untyped-def]
    pair = make_pair(
        client_config=ProtocolConfig(versions=client_versions),
        server_config=ProtocolConfig(versions=server_versions),
    )
    pair.handshake()
    assert pair.client.version == pair.server.version == chosen


def test_no_common_version_is_rejected_with_the_servers_versions() -> None:
    pair = make_pair(
        client_config=ProtocolConfig(versions=(1, 2)), server_config=ProtocolConfig(versions=(3,))
    )
    pair.server.receive_data(pair.client.hello())
    with pytest.raises(RemoteProtocolError):
        pair.server.next_event()
    (reject,) = feed(pair.client, pair.server.abort(pair.server.error))[:1]
    assert isinstance(reject, Reject) and reject.code == ErrorCode.VERSION and reject.versions == (3,)


def test_server_that_picks_a_lower_version_is_caught() -> None:
    """A downgrade: the server (or a man in the middle re-signing with the secret) picks 1 of {1, 2}."""
    pair = make_pair(
        client_config=ProtocolConfig(versions=(1, 2)), server_config=ProtocolConfig(versions=(1, 2))
    )
    (hello,) = pair.c2s(pair.client.hello())
    assert isinstance(hello, Hello)
    bad = Welcome("job-1", "gw-a", "gateway", (1, 2), 1, bytes(32), bytes(32))
    bad = Welcome("job-1", "gw-a", "gateway", (1, 2), 1, bytes(32), server_proof(SECRET, hello, bad))
    pair.server._chosen = 1  # make the server's own send-side check agree, to get the frame out
    frame = pair.server.send(bad)
    with pytest.raises(RemoteProtocolError):
        feed(pair.client, frame)


def test_server_may_reject_explicitly() -> None:
    pair = make_pair()
    pair.c2s(pair.client.hello())
    (reject,) = pair.s2c(pair.server.reject(ErrorCode.SHUTDOWN, "draining"))[:1]
    assert isinstance(reject, Reject) and reject.reason == "draining"
    assert pair.server.state is State.CLOSED and pair.client.state is State.CLOSED


def test_info_maps_are_bounded_and_bound_into_the_proof() -> None:
    pair = make_pair()
    with pytest.raises(LocalProtocolError):
        pair.client.hello(info={f"k{i}": i for i in range(100)})
    assert pair.client.state is State.START  # nothing was sent
    (hello,) = pair.c2s(pair.client.hello(info={"iteration": 5}))
    (welcome,) = pair.s2c(pair.server.accept())
    assert isinstance(hello, Hello) and isinstance(welcome, Welcome)
    tampered = Hello(
        hello.job, hello.site, hello.role, hello.versions, hello.nonce, hello.max_frame, {"iteration": 6}
    )
    assert server_proof(SECRET, tampered, welcome) != welcome.proof


def test_bad_constructor_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="secret"):
        Connection("gateway", "a", "j", b"short", side="client")
    with pytest.raises(ConfigError):
        Connection("wizard", "a", "j", SECRET, side="client")
    with pytest.raises(ConfigError):
        Connection("gateway", "a", "j", SECRET, side="middle")
    with pytest.raises(ConfigError):
        Connection("gateway", "", "j", SECRET, side="client")
    with pytest.raises(ConfigError):
        ProtocolConfig(max_frame_bytes=100)
    with pytest.raises(ConfigError):
        ProtocolConfig(versions=(0,))


def test_nonces_are_fresh_per_connection_by_default() -> None:
    a = Connection("trainer", "a", "j", SECRET, side="client")
    b = Connection("trainer", "a", "j", SECRET, side="client")
    assert a.hello() != b.hello()
    bad = Connection("trainer", "a", "j", SECRET, side="client", nonce_source=lambda n: b"x")
    with pytest.raises(LocalProtocolError):
        bad.hello()
    assert counter_nonces(1)(32) == counter_nonces(1)(32) != counter_nonces(2)(32)
