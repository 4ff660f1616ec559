"""Config loading: every unknown key and wrong type is named by its path."""

from __future__ import annotations

from pathlib import Path

import pytest

from xcecore.config import CORE_SECTIONS, ConfigError, parse_override, read_file, validate
from xcecore.records import ConfigSection, Field

pytestmark = pytest.mark.timeout(30)


def test_defaults_filled() -> None:
    cfg = validate({}, CORE_SECTIONS)
    assert cfg.cluster["name"] == "xce"
    assert cfg.section("client")["liveness_timeout"] == 2.0
    assert cfg.section("plugins")["enable"] == []
    assert cfg.section("nope") == {}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"cluster": {"prot": 1}}, "unknown key cluster.prot"),
        ({"cluster": {"port": "7600"}}, "cluster.port: expected int, got str"),
        ({"cluster": {"port": True}}, "cluster.port: expected int, got bool"),
        ({"client": {"liveness_timeout": "1s"}}, "client.liveness_timeout: expected float or int"),
        ({"clustre": {}}, "unknown config section [clustre]; did you mean [cluster]?"),
        ({"cluster": 5}, "cluster: must be a table"),
        ({"plugins": {"enable": "worker"}}, "plugins.enable: expected list"),
    ],
)
def test_errors_name_the_key(raw: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(raw, CORE_SECTIONS)
    assert needle in str(err.value)


def test_int_accepted_for_float() -> None:
    cfg = validate({"client": {"liveness_timeout": 3}}, CORE_SECTIONS)
    assert cfg.section("client")["liveness_timeout"] == 3.0
    assert isinstance(cfg.section("client")["liveness_timeout"], float)


def test_plugin_section_and_check() -> None:
    def check(values: dict[str, object]) -> None:
        if values["n"] == 0:
            raise ValueError("n must be positive")

    sec = ConfigSection("thing", {"n": Field((int,), 1), "req": Field((str,), required=True, doc="needed")},
                        check=check)
    assert validate({"thing": {"req": "x"}}, [sec]).require("thing") == {"n": 1, "req": "x"}
    # A missing required key is an error when the section is used, not when the file loads.
    cfg = validate({}, [sec])
    assert cfg.missing == {"thing": ("req",)}
    with pytest.raises(ConfigError, match="thing.req is required: needed"):
        cfg.require("thing")
    with pytest.raises(ConfigError, match=r"\[thing\]: n must be positive"):
        validate({"thing": {"req": "x", "n": 0}}, [sec])


def test_check_runs_only_when_the_section_is_present() -> None:
    seen: list[dict[str, object]] = []
    sec = ConfigSection("thing", {"n": Field((int,), 0)}, check=lambda v: seen.append(dict(v)))
    validate({}, [sec])
    assert seen == []
    validate({"thing": {}}, [sec])
    assert seen == [{"n": 0}]


def test_sections_nobody_declares_are_kept_unchecked() -> None:
    """One file for every host: a worker-only host accepts [controller] and [apiserver]."""
    raw = {"cluster": {"name": "c"}, "controller": {"listen": 5}, "apiserver": {"anything": [1]}}
    cfg = validate(raw, CORE_SECTIONS)
    assert cfg.unchecked == {"controller": {"listen": 5}, "apiserver": {"anything": [1]}}
    assert cfg.section("controller") == {} and "controller" not in cfg.as_dict()
    with pytest.raises(ConfigError, match=r"unknown config section \[wroker\]; did you mean \[worker\]"):
        validate({"wroker": {}}, [*CORE_SECTIONS, ConfigSection("worker")])


def test_skipped_sections_of_disabled_plugins() -> None:
    cfg = validate({"worker": {"x": 1}}, CORE_SECTIONS, skip=["worker"])
    assert cfg.section("worker") == {} and cfg.unchecked == {"worker": {"x": 1}}
    # A disabled plugin's section is never taken for a typo of a loaded one's.
    cfg = validate({"workers": {}}, [*CORE_SECTIONS, ConfigSection("worker")], skip=["workers"])
    assert "workers" in cfg.unchecked


def test_mutable_defaults_not_shared() -> None:
    a = validate({}, CORE_SECTIONS)
    a.section("plugins")["enable"].append("x")
    assert validate({}, CORE_SECTIONS).section("plugins")["enable"] == []


def test_read_file(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[cluster]\npeers = "a:1"\n')
    path, raw = read_file(f)
    assert path == f and raw == {"cluster": {"peers": "a:1"}}
    f.write_text("[cluster\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_file(f)
    with pytest.raises(ConfigError, match="does not exist"):
        read_file(tmp_path / "missing.toml")


def test_env_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[log]\nlevel = "DEBUG"\n')
    monkeypatch.setenv("XCE_CONFIG", str(f))
    assert read_file(None)[1] == {"log": {"level": "DEBUG"}}


def test_overrides() -> None:
    assert parse_override("controller.listen=127.0.0.1:7600") == ("controller", "listen", "127.0.0.1:7600")
    assert parse_override("cluster.port=7600") == ("cluster", "port", 7600)
    assert parse_override('worker.resources=["gpu"]') == ("worker", "resources", ["gpu"])
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("oops")
