import pytest

from wanrt import errors


def test_everything_derives_from_root() -> None:
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.WanrtError)


def test_transport_and_timeout_are_builtin_kinds() -> None:
    assert issubclass(errors.TransportError, ConnectionError)
    assert issubclass(errors.PeerLost, ConnectionError)
    assert issubclass(errors.WanrtTimeout, TimeoutError)
    assert issubclass(errors.ConfigError, ValueError)


def test_protocol_errors_say_which_side() -> None:
    assert issubclass(errors.RemoteProtocolError, errors.ProtocolError)
    assert issubclass(errors.LocalProtocolError, errors.ProtocolError)
    assert not issubclass(errors.RemoteProtocolError, errors.LocalProtocolError)
    assert issubclass(errors.LimitExceeded, errors.RemoteProtocolError)
    assert issubclass(errors.MalformedPayload, errors.RemoteProtocolError)


def test_leaf_errors_carry_fields() -> None:
    exc = errors.LimitExceeded("frame too large", name="MAX_FRAME", limit=10, value=11, peer="site-b")
    assert (exc.name, exc.limit, exc.value, exc.peer) == ("MAX_FRAME", 10, 11, "site-b")
    assert "limit=10" in str(exc) and "frame too large" in str(exc)
    with pytest.raises(ConnectionError):
        raise errors.PeerLost("gone", peer="x")
