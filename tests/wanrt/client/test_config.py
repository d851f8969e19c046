import pytest

from wanrt.client.config import MAX_STALENESS, ClientConfig
from wanrt.config import from_mapping
from wanrt.errors import ConfigError


def test_defaults_are_the_sparse_partially_stale_path() -> None:
    cfg = ClientConfig()
    assert cfg.compressing and cfg.error_feedback and cfg.staleness == 1 and cfg.block_size == 16


def test_dense_baseline_is_a_config_not_a_code_path() -> None:
    cfg = ClientConfig.dense_baseline()
    assert (cfg.density, cfg.wire_dtype, cfg.error_feedback, cfg.staleness) == (1.0, "fp32", False, 0)
    assert not cfg.compressing
    assert ClientConfig.dense_baseline(update_deadline_s=5.0).update_deadline_s == 5.0


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"density": 0.0}, "density"),
        ({"density": 1.5}, "density"),
        ({"block_size": 0}, "block_size"),
        ({"staleness": -1}, "staleness"),
        ({"staleness": MAX_STALENESS + 1}, "staleness"),
        ({"update_deadline_s": 0.0}, "update_deadline_s"),
        ({"block_size": 1}, "block_size"),  # threshold_v_block needs blocks
    ],
)
def test_bad_values_name_their_key(changes: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        ClientConfig(**changes)  # type: ignore[arg-type]
    assert info.value.fields["key"] == key


def test_loads_from_toml_table_with_dotted_key_in_errors() -> None:
    cfg = from_mapping(ClientConfig, {"density": 0.05, "wire_dtype": "fp16"}, section="client")
    assert cfg.density == 0.05 and cfg.wire_dtype == "fp16"
    with pytest.raises(ConfigError) as info:
        from_mapping(ClientConfig, {"staleness": 9}, section="client")
    assert info.value.fields["key"] == "client.staleness"


def test_with_changes_revalidates() -> None:
    assert ClientConfig().with_changes(density=0.1).density == 0.1
    with pytest.raises(ConfigError):
        ClientConfig().with_changes(density=2.0)
