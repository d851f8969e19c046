from wanrt.client.link.signature import LAYER_DIGEST_BYTES, LayerSignature, compare_info, first_difference


def sig(*layers: tuple[str, tuple[int, ...]]) -> LayerSignature:
    return LayerSignature.of([n for n, _ in layers], [s for _, s in layers], ["float32"] * len(layers))


def test_identical_models_have_identical_signatures() -> None:
    a = sig(("w", (3, 4)), ("b", (4,)))
    b = sig(("w", (3, 4)), ("b", (4,)))
    assert a.digest() == b.digest()
    assert len(a.layer_digests()) == 2 * LAYER_DIGEST_BYTES
    assert first_difference(a.layer_digests(), b.layer_digests()) is None


def test_first_difference_names_the_first_differing_layer() -> None:
    a = sig(("w", (3, 4)), ("b", (4,)), ("v", (2,)))
    b = sig(("w", (3, 4)), ("b", (5,)), ("v", (3,)))
    assert a.digest() != b.digest()
    assert first_difference(a.layer_digests(), b.layer_digests()) == 1
    assert "'b' shape (4,)" in a.describe(1)


def test_name_shape_and_dtype_all_count() -> None:
    base = sig(("w", (3, 4)))
    assert base.digest() != sig(("u", (3, 4))).digest()
    assert base.digest() != sig(("w", (4, 3))).digest()
    assert base.digest() != LayerSignature.of(["w"], [(3, 4)], ["float16"]).digest()


def test_a_missing_layer_differs_where_the_shorter_model_ends() -> None:
    a = sig(("w", (3,)), ("b", (4,)))
    b = sig(("w", (3,)))
    assert first_difference(a.layer_digests(), b.layer_digests()) == 1
    assert first_difference(b.layer_digests(), a.layer_digests()) == 1
    assert "absent" in b.describe(1)


def many(n: int, odd: int | None = None) -> LayerSignature:
    return sig(*[(f"l{i}", (i + 1,) if i != odd else (999,)) for i in range(n)])


def test_info_names_exact_layer_for_small_models() -> None:
    ours = many(10)
    assert compare_info(ours, many(10).info()) is None
    got = compare_info(ours, many(10, odd=4).info())
    assert got is not None and got[0] == 4 and "'l4'" in got[1]


def test_info_fits_the_handshake_and_narrows_big_models_to_a_group() -> None:
    ours = many(1000)
    info = ours.info()
    assert len(info["layers"]) <= 1024 and info["group"] == 8
    got = compare_info(ours, many(1000, odd=517).info())
    assert got is not None and got[0] == 512 and "512..519" in got[1]


def test_info_detects_layer_count_and_ignores_absent_signature() -> None:
    got = compare_info(many(5), many(6).info())
    assert got is not None and got[0] == 5
    assert compare_info(many(5), {}) is None
    bad = dict(many(5).info(), model=b"x" * 16, group="1")
    assert compare_info(many(5), bad) == (0, "the other side's model signature is malformed")
