from wanrt.client.signature import LAYER_DIGEST_BYTES, LayerSignature, first_difference


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
