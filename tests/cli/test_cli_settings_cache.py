"""The one-shot commands' settings cache (xcecore.client.sectioncache over xcecore.usercache):
used only while the file is unchanged, only the user's own entries, never an error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xcecore import usercache
from xcecore.client import sectioncache
from xcecore.client.settings import read_raw, read_sections

pytestmark = pytest.mark.timeout(60)

BODY = '[cluster]\npeers = "127.0.0.1:7001"\n[client]\nliveness_timeout = 3.0\n'


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(where))
    return where / "xce"


def settled(path: Path, body: str) -> Path:
    """Write ``body`` and date its modification back, as a file edited a while ago."""
    path.write_text(body)
    old = time.time() - 60
    os.utime(path, (old, old))
    return path


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("settings-*")) if cache.is_dir() else []


def test_a_settled_file_is_read_from_the_cache_without_tomllib(tmp_path: Path, cache: Path) -> None:
    cfg = settled(tmp_path / "xce.toml", BODY)
    first = read_sections(str(cfg))
    [entry] = entries(cache)
    assert entry.stat().st_mode & 0o777 == 0o600 and cache.stat().st_mode & 0o777 == 0o700
    assert read_sections(str(cfg)) == first and first[1]["peers"] == "127.0.0.1:7001"
    probe = ("import sys\nfrom xcecore.client.settings import read_sections\n"
             f"print(read_sections({str(cfg)!r})[2]['liveness_timeout'], 'tomllib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ, "XDG_CACHE_HOME": str(cache.parent)}, timeout=30)
    assert out.stdout.split() == ["3.0", "False"], out.stderr


def test_a_changed_file_is_parsed_again(tmp_path: Path, cache: Path) -> None:
    cfg = settled(tmp_path / "xce.toml", BODY)
    read_sections(str(cfg))
    settled(cfg, BODY.replace("3.0", "4.5"))
    assert read_sections(str(cfg))[2]["liveness_timeout"] == 4.5
    cfg.write_text(BODY.replace("3.0", "7.0"))  # same size as the cached one, modified now
    assert read_sections(str(cfg))[2]["liveness_timeout"] == 7.0
    assert sectioncache.load(str(cfg)) is None, "a file modified just now is never cached"
    bad = settled(tmp_path / "bad.toml", BODY)
    read_sections(str(bad))
    settled(bad, BODY + "[client\n")
    with pytest.raises(ValueError, match="is not valid TOML"):
        read_sections(str(bad))


def test_only_the_users_own_untampered_entries_are_used(tmp_path: Path, cache: Path) -> None:
    cfg = settled(tmp_path / "xce.toml", BODY)
    read_sections(str(cfg))
    [entry] = entries(cache)
    # A planted entry with a valid stamp but other peers: used only if it is the user's own.
    import marshal

    stamp, sections = marshal.loads(entry.read_bytes())
    sections["cluster"]["peers"] = "127.0.0.9:9"
    entry.write_bytes(marshal.dumps((stamp, sections)))
    assert read_sections(str(cfg))[1]["peers"] == "127.0.0.9:9"  # the user's own: trusted
    entry.chmod(0o620)  # writable by the group: someone else may have written it
    assert sectioncache.load(str(cfg)) is None
    assert read_sections(str(cfg))[1]["peers"] == "127.0.0.1:7001"
    entry.chmod(0o600)
    cache.chmod(0o777)  # a directory anyone can write into
    assert sectioncache.load(str(cfg)) is None and usercache.read(entry.name) is None
    cache.chmod(0o700)
    entry.write_bytes(b"\x00damaged")
    assert read_sections(str(cfg))[1]["peers"] == "127.0.0.1:7001"
    link = cache / "settings-link"
    link.symlink_to(entry)
    assert usercache.read(link.name) is None, "an entry is never read through a symlink"


def test_what_cannot_be_cached_is_read_every_time(tmp_path: Path, cache: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    dated = settled(tmp_path / "dated.toml", BODY + "[plugins]\nsince = 1979-05-27\n")
    assert read_sections(str(dated))[2]["liveness_timeout"] == 3.0
    assert "since" in read_raw(str(dated))["plugins"] and entries(cache) == []
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")
    assert usercache.cache_dir() is None
    cfg = settled(tmp_path / "xce.toml", BODY)
    assert read_sections(str(cfg))[1]["peers"] == "127.0.0.1:7001"
    with pytest.raises(ValueError, match="does not exist"):
        read_sections(str(tmp_path / "missing.toml"))
