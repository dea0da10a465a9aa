"""What a check or a fleet scan watches, and how each target is reached: secrets only from the environment variables
the config names (a clear error when one is not set), URLs named host:port, and names that cannot repeat."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdiag.api.targets import check_targets, connection_for, fleet_targets
from llmdiag.client.endpoint import API_KEY_ENV, Connection
from llmdiag.config import Settings, Target
from llmdiag.errors import ConfigError, UsageError


@pytest.fixture(autouse=True)
def no_ambient_key(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)


def test_secret_headers_and_the_bearer_token_come_from_the_named_variables(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GATEWAY_TOKEN", "Bearer s3cret")
    monkeypatch.setenv("POOL_KEY", "k-123")
    target = Target(
        name="gpu-a",
        url="http://10.0.0.1:8000/",
        headers={"X-Tenant": "team-a"},
        headers_env={"Authorization": "GATEWAY_TOKEN"},
        api_key_env="POOL_KEY",
        timeout_seconds=2.5,
        insecure=True,
    )
    connection = connection_for(target, max_metrics_bytes=1024)
    assert connection.headers == {"X-Tenant": "team-a", "Authorization": "Bearer s3cret"}
    assert connection.api_key == "k-123"
    assert (connection.timeout_seconds, connection.insecure, connection.max_metrics_bytes) == (2.5, True, 1024)
    assert connection.base_url == "http://10.0.0.1:8000"


@pytest.mark.parametrize(
    "settings, variable",
    [({"headers_env": {"Authorization": "GATEWAY_TOKEN"}}, "GATEWAY_TOKEN"), ({"api_key_env": "POOL_KEY"}, "POOL_KEY")],
)
def test_an_unset_variable_is_a_config_error_naming_the_target_and_variable(settings: dict, variable: str):
    with pytest.raises(ConfigError) as info:
        connection_for(Target(name="gpu-a", url="http://h:1", **settings))
    assert "gpu-a" in info.value.message and variable in info.value.message
    assert f"export {variable}=" in info.value.hint


def test_without_api_key_env_the_usual_variable_is_read(monkeypatch: pytest.MonkeyPatch):
    assert connection_for(Target(name="a", url="http://h:1")).api_key is None
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert connection_for(Target(name="a", url="http://h:1")).api_key == "from-env"


def test_urls_become_targets_named_host_port_each_with_the_given_settings():
    made: list[str] = []

    def connect(url: str) -> Connection:
        made.append(url)
        return Connection(url)

    targets, connections = check_targets(
        Settings(), urls=["http://10.0.0.1:8000", "http://10.0.0.1:8000"], connect=connect, nvml=False, probe=False
    )
    assert [t.name for t in targets] == ["10.0.0.1:8000", "10.0.0.1:8000#2"]
    assert made == ["http://10.0.0.1:8000", "http://10.0.0.1:8000"] and set(connections) == {t.name for t in targets}
    assert all(t.nvml is False and t.probe is False and t.metrics_url is None for t in targets)


def test_one_url_may_carry_its_metrics_and_dcgm_pages_several_may_not():
    targets, _ = check_targets(
        Settings(), urls=["http://h:8000"], metrics_url="http://h:9000/metrics", dcgm_url="http://h:9400"
    )
    assert (targets[0].metrics_url, targets[0].dcgm_url) == ("http://h:9000/metrics", "http://h:9400")
    with pytest.raises(UsageError, match="belong to one server"):
        check_targets(Settings(), urls=["http://a:1", "http://b:1"], metrics_url="http://a:9000/metrics")


def test_config_targets_are_all_or_the_named_ones_and_urls_exclude_names():
    settings = Settings(targets=[Target(name="a", url="http://a:1"), Target(name="b", url="http://b:1")])
    assert [t.name for t in check_targets(settings)[0]] == ["a", "b"]
    assert [t.name for t in check_targets(settings, target_names=["b"])[0]] == ["b"]
    assert check_targets(settings)[1] == {}  # config targets make their own connections, when checked
    with pytest.raises(UsageError) as info:
        check_targets(settings, target_names=["c"])
    assert "'c'" in info.value.message and "a, b" in info.value.hint
    with pytest.raises(UsageError, match="config target"):
        check_targets(settings, urls=["http://x:1"], target_names=["a"])
    with pytest.raises(UsageError, match="no target"):
        check_targets(Settings())


def test_fleet_targets_file_first_then_urls_and_names_may_not_repeat(tmp_path: Path):
    listed = tmp_path / "pool.txt"
    listed.write_text("a=http://10.0.0.1:8000\nhttp://10.0.0.2:8000\n")
    targets = fleet_targets(["http://10.0.0.2:8000"], listed)
    assert [(name, c.base_url) for name, c in targets] == [
        ("a", "http://10.0.0.1:8000"),
        ("10.0.0.2:8000", "http://10.0.0.2:8000"),
        ("10.0.0.2:8000#2", "http://10.0.0.2:8000"),  # a URL that repeats the file's gets its own name
    ]
    listed.write_text("a=http://10.0.0.1:8000\na=http://10.0.0.2:8000\n")
    with pytest.raises(UsageError, match="repeat: a"):
        fleet_targets([], listed)


def test_a_toml_targets_file_carries_each_targets_own_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TOKEN_A", "t-a")
    pool = tmp_path / "fleet.toml"
    pool.write_text(
        '[[targets]]\nname = "a"\nurl = "http://a:1"\nheaders_env = { Authorization = "TOKEN_A" }\n'
        '[[targets]]\nname = "b"\nurl = "http://b:1"\ntimeout_seconds = 9\n'
    )
    (a, ca), (b, cb), (url, cu) = fleet_targets(["http://c:1"], pool, max_metrics_bytes=4096)
    assert (a, ca.headers, ca.max_metrics_bytes) == ("a", {"Authorization": "t-a"}, 4096)
    assert (b, cb.timeout_seconds) == ("b", 9.0)
    assert (url, cu.headers, cu.timeout_seconds) == ("c:1", {}, 5.0)  # a plain URL: the default connection
