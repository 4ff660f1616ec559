"""The fault test bed itself: hosts reach each other, each fault does what it says, and
nothing is left behind. Real namespaces, veths, nftables, tmpfs mounts and processes (root)."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xcecore.testing import faultbed, faultbed_system, netns
from xcecore.testing.cluster import wait_for
from xcecore.testing.faultbed import BedError, FaultBed, Host

pytestmark = pytest.mark.timeout(120)

ECHO = ("import socket, sys\n"
        "s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
        "print('up', flush=True)\n"
        "while True:\n"
        "    c, _ = s.accept()\n"
        "    try:\n"
        "        c.sendall(c.recv(100))\n"
        "    except OSError:\n"
        "        pass\n"
        "    c.close()\n")
UDP_SINK = ("import socket, sys\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], int(sys.argv[2])))\n"
            "s.settimeout(float(sys.argv[3])); n = 0\n"
            "print('up', flush=True)\n"
            "try:\n"
            "    while True:\n"
            "        s.recv(100); n += 1\n"
            "except OSError:\n"
            "    print(n, flush=True)\n")


def start(bed: FaultBed, host: Host, code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(bed.command(host, [sys.executable, "-c", code, *args]),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc


def echo(bed: FaultBed, src: Host, dst: Host, port: int = 9000, timeout: float = 1.0) -> str:
    """Connect from ``src`` to ``dst``'s echo server: 'ok', or the error's name."""
    with netns.entered(src.netns):
        s = socket.socket()
    s.settimeout(timeout)
    try:
        s.connect((dst.addr, port))
        s.sendall(b"ping")
        return "ok" if s.recv(100) == b"ping" else "bad"
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()


def udp_count(bed: FaultBed, src: Host, dst: Host, n: int, port: int = 9100) -> int:
    sink = start(bed, dst, UDP_SINK, dst.addr, str(port), "0.5")
    with netns.entered(src.netns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with s:
        for _ in range(n):
            s.sendto(b"x", (dst.addr, port))
    out, _ = sink.communicate(timeout=30)
    return int(out.strip())


@pytest.fixture
def two(xce_faultbed: FaultBed) -> tuple[FaultBed, Host, Host]:
    return xce_faultbed, xce_faultbed.add_host("a"), xce_faultbed.add_host("b")


def test_hosts_reach_each_other_and_nothing_else(two: tuple[FaultBed, Host, Host]) -> None:
    bed, a, b = two
    assert a.addr.startswith("127.100.") and a.addr != b.addr
    start(bed, a, ECHO, a.addr, "9000")
    start(bed, b, ECHO, b.addr, "9000")
    assert echo(bed, a, b) == "ok" and echo(bed, b, a) == "ok"
    # The machine's own loopback is not the hosts' loopback: a server here is out of reach.
    with socket.create_server(("127.0.0.1", 0)) as here:
        port = here.getsockname()[1]
        r = bed.run(a, [sys.executable, "-c",
                        f"import socket; socket.create_connection(('127.0.0.1', {port}), 1)"])
        assert "ConnectionRefusedError" in r.stderr
    # Each host's processes are its own.
    assert set(bed.pids(a)).isdisjoint(bed.pids(b)) and len(bed.pids(a)) == 1


def test_freeze_and_thaw(two: tuple[FaultBed, Host, Host]) -> None:
    bed, a, b = two
    server = start(bed, b, ECHO, b.addr, "9000")
    frozen = bed.freeze(b)
    assert frozen == [server.pid]
    assert faultbed_system.proc_state(server.pid) == "T"
    assert echo(bed, a, b, timeout=0.5) == "TimeoutError"  # the kernel accepts; nobody answers
    bed.thaw(b)
    assert echo(bed, a, b) == "ok"


def test_power_off_and_on(two: tuple[FaultBed, Host, Host]) -> None:
    bed, a, b = two
    server = start(bed, b, ECHO, b.addr, "9000")
    bed.power_off(b)
    assert server.wait(10) == -signal.SIGKILL and bed.pids(b) == []
    assert echo(bed, a, b, timeout=0.5) != "ok"
    bed.power_on(b)
    # Up again, but nothing runs there (a reboot): refused, once the neighbours have resolved.
    wait_for(lambda: echo(bed, a, b, timeout=0.5) == "ConnectionRefusedError", 20,
             what="host b reachable after power-on")
    start(bed, b, ECHO, b.addr, "9000")
    assert echo(bed, a, b) == "ok"


def test_partitions_two_way_one_way_and_per_port(two: tuple[FaultBed, Host, Host]) -> None:
    bed, a, b = two
    start(bed, a, ECHO, a.addr, "9000")
    start(bed, b, ECHO, b.addr, "9000")
    start(bed, b, ECHO, b.addr, "9001")
    bed.partition(a, b)
    assert echo(bed, a, b, timeout=0.5) == "TimeoutError" and echo(bed, b, a, timeout=0.5) == "TimeoutError"
    bed.heal(a, b)
    assert echo(bed, a, b) == "ok" and echo(bed, b, a) == "ok"
    bed.partition(a, b, one_way=True)
    assert udp_count(bed, a, b, 50) == 0
    assert udp_count(bed, b, a, 50) == 50
    bed.heal()
    bed.partition(a, b, port=9000)
    assert echo(bed, a, b, 9000, timeout=0.5) == "TimeoutError"
    assert echo(bed, a, b, 9001) == "ok" and echo(bed, b, a, 9000) == "ok"
    assert "tcp dport 9000 drop" in bed.rules(b)
    bed.heal(a, b)
    assert "drop" not in bed.rules(b) and echo(bed, a, b, 9000) == "ok"


def test_random_loss(two: tuple[FaultBed, Host, Host]) -> None:
    bed, a, b = two
    bed.loss(a, b, 50, one_way=True)
    got = udp_count(bed, a, b, 400)
    assert 120 < got < 280, got  # 200 expected; these bounds are 8 standard deviations wide
    bed.loss(a, b, 0, one_way=True)
    assert udp_count(bed, a, b, 100) == 100


def test_slow_link_delays_both_ways_and_heals(two: tuple[FaultBed, Host, Host]) -> None:
    bed, a, b = two
    start(bed, b, ECHO, b.addr, "9000")
    with netns.entered(a.netns):
        before = socket.create_connection((b.addr, 9000), 2)  # open before: reset by slow()
    bed.slow(a, b, 0.1, 0.02)
    before.settimeout(2)
    try:
        before.sendall(b"x")
        got: bytes | None = before.recv(10)
    except ConnectionError:
        got = b""
    except TimeoutError:
        got = None
    assert got == b"", "the connection opened before the slow link was not reset"
    t0 = time.monotonic()
    assert echo(bed, a, b, timeout=5) == "ok"
    # A real delay, not a speed: the relay holds each chunk at least delay - jitter per way.
    assert time.monotonic() - t0 >= 2 * (0.1 - 0.02)
    assert "redirect to" in bed.rules(b)
    bed.unslow()
    assert "redirect" not in bed.rules(b) and echo(bed, a, b) == "ok"


def test_full_disk_on_a_state_directory(xce_faultbed: FaultBed) -> None:
    bed = xce_faultbed
    h = bed.add_host("d", disk="4m")
    (h.state_dir / "before").write_bytes(b"x" * 100)
    assert bed.fill_disk(h) > 3 * 1024 * 1024
    with pytest.raises(OSError, match="No space left") as info:
        (h.state_dir / "more").write_bytes(b"x" * 8192)
    assert info.value.errno == errno.ENOSPC
    bed.free_disk(h)
    (h.state_dir / "more").write_bytes(b"x" * 8192)
    with pytest.raises(BedError, match="disk="):
        bed.fill_disk(bed.add_host("nodisk"))


def test_shared_directories_only_where_asked(xce_faultbed: FaultBed) -> None:
    bed = xce_faultbed
    shared = bed.shared("ctlstate")
    a = bed.add_host("a", shared={"state": shared})
    b = bed.add_host("b", shared={"state": shared})
    c = bed.add_host("c")
    (a.state_dir / "f").write_text("hello")
    assert (b.state_dir / "f").read_text() == "hello" and not (c.state_dir / "f").exists()


def test_close_removes_everything_also_processes_it_did_not_start(tmp_path: Path) -> None:
    bed = FaultBed(tmp_path / "bed")
    a = bed.add_host("a", disk="2m")
    b = bed.add_host("b")
    server = start(bed, a, ECHO, a.addr, "9000")
    orphan = subprocess.Popen(bed.command(b, ["sleep", "60"]), start_new_session=True)
    bed.partition(a, b)
    bed.slow(a, b, 0.01)
    bed.freeze(b)
    names = [a.netns, b.netns, bed.bed_ns]
    bed.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names), listed
    assert bed.tag not in Path("/proc/self/mounts").read_text()
    assert server.wait(10) == -signal.SIGKILL and orphan.wait(10) == -signal.SIGKILL
    assert bed.leftovers() == []


def test_clean_ups_at_close_run_after_the_processes_die_and_before_the_disks_go(tmp_path: Path) -> None:
    bed = FaultBed(tmp_path / "bed")
    a = bed.add_host("a", disk="2m")
    (a.state_dir / "record").write_text("listed")
    proc = subprocess.Popen(bed.command(a, ["sleep", "60"]), start_new_session=True)
    seen: list[tuple[int | None, str]] = []

    def clean_up() -> None:
        seen.append((proc.poll(), (a.state_dir / "record").read_text()))

    bed.at_close(clean_up)
    bed.at_close(lambda: 1 / 0)  # one that fails is named, after the others have run
    with pytest.raises(BedError, match="a clean-up at close .*division by zero"):
        bed.close()
    assert seen == [(-signal.SIGKILL, "listed")]
    assert bed.tag not in Path("/proc/self/mounts").read_text()


def test_a_crashed_runs_leftovers_are_reported_and_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"{faultbed_system.PREFIX}{dead.pid}x1-host"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", f"{faultbed_system.PREFIX}{dead.pid}x1-host", str(mnt)],
                   check=True)
    stray = subprocess.Popen(["nsenter", f"--net={netns.path_of(name)}", "--", "sleep", "60"])
    try:
        wait_for(lambda: stray.pid in faultbed_system.pids_in(netns.inode_of(name)), 10, what="the stray process")
        bed = FaultBed(tmp_path / "bed")
        bed.close()
        assert f"network namespace {name}" in bed.stale_removed
        assert any(str(mnt) in r for r in bed.stale_removed)
        assert not os.path.exists(netns.path_of(name))
        assert stray.wait(10) == -signal.SIGKILL
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        if stray.poll() is None:
            stray.kill()
            stray.wait(10)


def test_without_root_the_bed_says_what_it_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Not being root cannot be produced in a root CI run: the uid is the one thing mocked.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(BedError, match="needs root"):
        FaultBed(tmp_path / "bed")


def test_a_missing_tool_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = faultbed_system.shutil.which
    monkeypatch.setattr(faultbed_system.shutil, "which", lambda t: None if t == "nft" else real(t))
    with pytest.raises(BedError, match="'nft' command .*nftables"):
        FaultBed(tmp_path / "bed")


def test_bad_host_names_and_unknown_hosts(xce_faultbed: FaultBed) -> None:
    with pytest.raises(BedError, match="host name"):
        xce_faultbed.add_host("Bad-Name")
    with pytest.raises(BedError, match="no host 'zz'"):
        xce_faultbed.host("zz")


def test_nft_rules_of_a_host() -> None:
    """What each fault turns into, checked without root (the rules are a pure function)."""
    addr = {"a": "127.100.0.1", "b": "127.100.0.2", "c": "127.100.0.3"}
    drops = {("a", "b", None): 100, ("c", "b", 7600): 100, ("b", "c", -7600): 100, ("c", "b", None): 30,
             ("b", "a", None): 100}
    text = faultbed.nft_rules("b", addr, drops, {("a", "b"): 64001})
    assert "ip saddr 127.100.0.1 drop" in text
    assert "ip saddr 127.100.0.3 tcp dport 7600 drop" in text
    assert "ip saddr 127.100.0.3 numgen random mod 100 < 30 drop" in text
    assert "tcp sport" not in text and "127.100.0.2 drop" not in text  # not b's to drop
    assert "ip saddr 127.100.0.1 ip daddr 127.100.0.2 tcp dport != 64001 redirect to :64001" in text
    assert text.index("delete table inet xfb") < text.index("chain input")  # replaced whole
    assert "redirect" not in faultbed.nft_rules("a", addr, drops, {("a", "b"): 64001})
