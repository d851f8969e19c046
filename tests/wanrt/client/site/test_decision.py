import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wanrt.client.site import decision as sm
from wanrt.errors import LimitExceeded, MalformedPayload
from wanrt.payload import SparsePayload


def payload(layer: int, dense_len: int, blocks: list[int], bs: int, seed: int) -> SparsePayload:
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal(dense_len).astype(np.float32)
    return SparsePayload.from_dense_blocks(layer, dense, np.array(sorted(set(blocks)), dtype=np.int64), bs)


def roundtrip(d: sm.SiteDecision) -> sm.SiteDecision:
    header, body, values = sm.encode(d)
    n_body, n_val = sm.decode_header(header, max_elements=1 << 20)
    assert (n_body, n_val) == (body.shape[0], values.shape[0])
    return sm.decode_body(header, body, values)


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 40), st.integers(1, 4), st.integers(1, 8)),
        max_size=4,
    ),
    st.lists(
        st.tuples(
            st.integers(0, 10**6),
            st.none() | st.floats(1e-4, 1.0),
            st.none() | st.integers(1, 4096),
            st.none() | st.integers(0, 4),
        ),
        max_size=3,
    ),
    st.none() | st.tuples(st.text(max_size=20).filter(lambda s: "\0" not in s), st.text(max_size=50)),
)
def test_roundtrip_is_exact(
    ups: list[tuple[int, int, int, int]],
    cfgs: list[tuple[int, float | None, int | None, int | None]],
    error: tuple[str, str] | None,
) -> None:
    updates = []
    for i, (layer, dense_len, bs, n_sites) in enumerate(ups):
        nb = -(-dense_len // bs)
        p = payload(layer, dense_len, list(range(0, nb, 2)), bs, i)
        updates.append(sm.SiteUpdate(i, layer, n_sites, p))
    changes = [sm.ConfigChange(*c) for c in cfgs]
    out = roundtrip(sm.SiteDecision(updates, changes, error))
    assert out.config_changes == changes
    assert out.error == error
    assert len(out.updates) == len(updates)
    for a, b in zip(updates, out.updates, strict=True):
        assert (a.iteration, a.layer, a.n_sites) == (b.iteration, b.layer, b.n_sites)
        np.testing.assert_array_equal(a.payload.to_dense(), b.payload.to_dense())


def test_header_bounds_sizes_before_allocation() -> None:
    header, _, _ = sm.encode(sm.SiteDecision())
    bad = header.copy()
    bad[3] = 10**12  # values
    with pytest.raises(LimitExceeded):
        sm.decode_header(bad, max_elements=1 << 20)
    bad = header.copy()
    bad[0] = 0
    with pytest.raises(MalformedPayload):
        sm.decode_header(bad, max_elements=1 << 20)
    bad = header.copy()
    bad[6] = 5  # body length disagrees
    with pytest.raises(MalformedPayload):
        sm.decode_header(bad, max_elements=1 << 20)


def test_torn_body_is_rejected_not_scattered() -> None:
    p = payload(0, 32, [0, 1], 16, 0)
    header, body, values = sm.encode(sm.SiteDecision([sm.SiteUpdate(0, 0, 1, p)]))
    body = body.copy()
    body[sm.UPDATE_FIELDS + 1] = 99  # a block index beyond the layer
    with pytest.raises(MalformedPayload):
        sm.decode_body(header, body, values)


def test_own_in_flight_payloads_travel_apart_from_the_job_updates() -> None:
    # the rows with n_sites 0 are the site's own payloads for weight prediction; they must come back as
    # predict, never as a job update (which would divide by zero sites and be applied)
    job = sm.SiteUpdate(3, 0, 2, payload(0, 40, [0, 2], 16, 1))
    own = [sm.SiteUpdate(4, 0, sm.OWN_IN_FLIGHT, payload(0, 40, [1], 16, 2))]
    own.append(sm.SiteUpdate(4, 1, sm.OWN_IN_FLIGHT, payload(1, 7, [0], 4, 3)))
    out = roundtrip(sm.SiteDecision([job], predict=own))
    assert [(u.iteration, u.layer, u.n_sites) for u in out.updates] == [(3, 0, 2)]
    assert [(u.iteration, u.layer) for u in out.predict] == [(4, 0), (4, 1)]
    for a, b in zip(own, out.predict, strict=True):
        np.testing.assert_array_equal(a.payload.to_dense(), b.payload.to_dense())
