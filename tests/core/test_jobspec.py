"""The submission parsers: memory and run limits, Slurm times, exclusivity, --env, output
path patterns, exit reasons, and job-script directives (#XCE, #BSUB, #SBATCH)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xcecore.jobenv import EnvOption, resolve_env, submittable
from xcecore.jobscript import parse_script
from xcecore.jobspec import (
    MEM_UNITS,
    JobSpecError,
    describe_exit,
    expand_path,
    format_mem,
    parse_env_option,
    parse_exclusive,
    parse_mem,
    parse_run_limit,
    parse_slurm_time,
)

MB = 1 << 20
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: n.lower() not in ("all", "none"))


@pytest.mark.parametrize(("text", "unit", "want"), [
    ("64MB", "MB", 64 * MB), ("64mb", "KB", 64 * MB), ("2G", "MB", 2 << 30),
    ("1.5GB", "MB", 3 << 29), ("512", "MB", 512 * MB), ("512", "KB", 512 << 10),
    (" 10 M ", "MB", 10 * MB), ("1TB", "MB", 1 << 40), ("100B", "MB", 100), (".5K", "MB", 512),
])
def test_parse_mem(text: str, unit: str, want: int) -> None:
    assert parse_mem(text, unit) == want


@pytest.mark.parametrize(("text", "error"), [
    ("", "not a memory amount"), ("-5M", "not a memory amount"), ("0", "at least one byte"),
    ("12XB", "unknown unit"), ("1e3", "not a memory amount"), ("5 M B", "not a memory amount"),
    ("9EB", "larger than any memory"), ("64MiB", "unknown unit"),
])
def test_parse_mem_errors_name_the_option(text: str, error: str) -> None:
    with pytest.raises(JobSpecError, match=f"-M: .*{error}"):
        parse_mem(text)


@given(st.integers(1, 1 << 40), st.sampled_from(sorted(MEM_UNITS)))
def test_mem_roundtrip(n: int, unit: str) -> None:
    nbytes = n * MEM_UNITS[unit] if n * MEM_UNITS[unit] <= 1 << 62 else n
    assert parse_mem(format_mem(nbytes)) == nbytes


@given(st.text(max_size=12))
def test_parse_mem_never_raises_anything_else(text: str) -> None:
    with contextlib.suppress(JobSpecError):
        assert parse_mem(text) >= 1


@pytest.mark.parametrize(("text", "want"), [("90", 5400), ("1:30", 5400), ("210", 12600),
                                            ("3:30", 12600), ("0:1", 60), (" 5 ", 300)])
def test_run_limit(text: str, want: int) -> None:
    assert parse_run_limit(text) == want


@pytest.mark.parametrize(("text", "error"), [
    ("0", "more than zero"), ("1:2:3", "not a run limit"), ("abc", "not a run limit"),
    ("1:30/hostA", "normalised to a host"), ("-5", "not a run limit"), ("", "not a run limit"),
    ("١٢", "not a run limit"),
])
def test_run_limit_errors(text: str, error: str) -> None:
    with pytest.raises(JobSpecError, match=error):
        parse_run_limit(text)


@given(st.integers(0, 10_000), st.integers(0, 59))
def test_run_limit_forms_agree(hours: int, minutes: int) -> None:
    if hours == minutes == 0:
        return
    assert parse_run_limit(f"{hours}:{minutes}") == parse_run_limit(str(hours * 60 + minutes))


@pytest.mark.parametrize(("text", "want"), [
    ("10", 600), ("10:30", 630), ("1:00:00", 3600), ("2-0", 172800), ("1-2", 93600),
    ("1-2:30", 95400), ("1-2:30:15", 95415), ("UNLIMITED", None), ("infinite", None),
    ("0", None),
])
def test_slurm_time(text: str, want: int | None) -> None:
    assert parse_slurm_time(text) == want


@pytest.mark.parametrize("text", ["", "1:2:3:4", "a-1", "1-", "-1", "1-2:3:4:5", "x"])
def test_slurm_time_errors(text: str) -> None:
    with pytest.raises(JobSpecError, match="not a Slurm time"):
        parse_slurm_time(text)


@given(st.integers(0, 99), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_slurm_time_forms(d: int, h: int, m: int, s: int) -> None:
    total = ((d * 24 + h) * 60 + m) * 60 + s
    if total == 0:
        return
    assert parse_slurm_time(f"{d}-{h}:{m}:{s}") == total
    assert parse_slurm_time(f"{d * 24 + h}:{m}:{s}") == total


def test_exclusive() -> None:
    assert parse_exclusive(None) and parse_exclusive("") and parse_exclusive(True)
    assert not parse_exclusive(False) and not parse_exclusive("no")
    with pytest.raises(JobSpecError, match="only whole-host"):
        parse_exclusive("user")


def test_env_option_forms() -> None:
    assert parse_env_option("none") == EnvOption("none")
    assert parse_env_option("ALL") == EnvOption("all")
    assert parse_env_option("all, ~SECRET, MODE=fast") == EnvOption(
        "all", (), ("SECRET",), {"MODE": "fast"})
    assert parse_env_option("HOME,PATH, X=1") == EnvOption("list", ("HOME", "PATH"), (),
                                                           {"X": "1"})
    for bad, error in [("", "empty entry"), ("A,,B", "empty entry"), ("none,A", "takes no"),
                       ("A,~B", "only after 'all'"), ("A,all", "must come first"),
                       ("1A", "not a variable name"), ("A B", "not a variable name")]:
        with pytest.raises(JobSpecError, match=error):
            parse_env_option(bad)


@given(st.dictionaries(NAMES, st.text(max_size=5), max_size=6), st.lists(NAMES, max_size=4))
def test_resolve_env(environ: dict[str, str], names: list[str]) -> None:
    assert resolve_env(EnvOption("none"), environ) == {}
    everything = resolve_env(EnvOption("all"), environ)
    assert everything == {k: v for k, v in environ.items()
                          if k not in ("_", "PWD", "OLDPWD", "SHLVL")}
    listed = resolve_env(EnvOption("list", tuple(names)), environ)
    assert set(listed) == set(names) & set(environ)
    excluded = resolve_env(EnvOption("all", exclude=tuple(names), assign={"XCE_T": "1"}),
                           environ)
    assert not set(excluded) & (set(names) - {"XCE_T"}) and excluded["XCE_T"] == "1"


ENV_TEXT = st.text(st.sampled_from("aZ_9 =%\t\n\r\x00\x1b\x7f\x85é"), max_size=6)


@given(st.dictionaries(ENV_TEXT, ENV_TEXT, max_size=8))
def test_submittable_keeps_exactly_what_the_edge_accepts(environ: dict[str, str]) -> None:
    from pydantic import TypeAdapter, ValidationError

    from xcecore.schema import types as t

    edge = TypeAdapter(t.Env)
    kept, dropped = submittable(environ)
    assert edge.validate_python(kept) == kept
    assert len(kept) + len(dropped) == len(environ)
    for name in set(environ) - set(kept):
        with pytest.raises(ValidationError):
            edge.validate_python({name: environ[name]})
        assert any(d.startswith(f"{name[:64]} (") for d in dropped)


def test_submittable_bounds_the_count_and_the_values() -> None:
    many = {f"V{i:05d}": "x" for i in range(1100)}
    kept, dropped = submittable({**many, "LONG": "y" * 40_000})
    assert len(kept) == 1024 and kept["V00000"] == "x" and "LONG" not in kept
    assert "LONG (a value longer than 32,768 characters)" in dropped
    assert sum("more than 1,024 variables" in d for d in dropped) == 1100 - 1024


def test_expand_path() -> None:
    assert expand_path("out.%J.%I.%A.%%", 12, 3) == "out.12.0.3.%"
    with pytest.raises(JobSpecError, match="unknown pattern %x"):
        expand_path("out.%x", 1)
    with pytest.raises(JobSpecError, match="lone %"):
        expand_path("out%", 1)


def test_describe_exit() -> None:
    assert describe_exit("exit_code", 3) == "exit code 3"
    assert describe_exit("signal", 137) == "killed by signal 9"
    assert describe_exit("mem_limit") == "memory limit exceeded"
    assert describe_exit("run_limit") == "run limit reached"
    assert describe_exit("no_start") == "could not start"


# ----------------------------------------------------------------------------- scripts

LSF = """#!/bin/bash
# a comment
#BSUB -q short -J "my job" -n 4
#BSUB -R "select[mem>4G] rusage[mem=1G]"
#BSUB -M 2G -W 1:30 -x
#BSUB -o out.%J -e err.%J -i in.txt
#BSUB -P proj -cwd /work -env "all, ~SECRET"
#BSUB -u me@example.org -N
echo hello
#BSUB -q ignored-after-the-first-command
"""


def test_bsub_directives() -> None:
    d = parse_script(LSF)
    assert d.given() == {
        "queue": "short", "name": "my job", "ntasks": 4,
        "resreq": "select[mem>4G] rusage[mem=1G]", "mem_limit": 2 << 30, "run_limit": 5400,
        "exclusive": True, "stdout": "out.%J", "stderr": "err.%J", "stdin": "in.txt",
        "project": "proj", "cwd": "/work", "env": EnvOption("all", exclude=("SECRET",)),
    }
    assert len(d.warnings) == 2 and "ignored" in d.warnings[0]


SLURM = """#!/bin/sh
#SBATCH --job-name=sim --partition=long
#SBATCH -n 2 --mem=500 --time=1-00:00:00
#SBATCH --output=sim-%j.out --error sim-%j-%a.err
#SBATCH --exclusive --account=physics --chdir=/scratch
#SBATCH --export=NONE,OMP_NUM_THREADS=4
#SBATCH --gres=gpu:v100:2   # two GPUs
#SBATCH --mail-type=END
srun ./sim
"""


def test_sbatch_directives() -> None:
    d = parse_script(SLURM)
    assert d.given() == {
        "name": "sim", "queue": "long", "ntasks": 2, "mem_limit": 500 * MB,
        "run_limit": 86400, "stdout": "sim-%J.out", "stderr": "sim-%J-%I.err",
        "exclusive": True, "project": "physics", "cwd": "/scratch",
        "env": EnvOption("list", assign={"OMP_NUM_THREADS": "4"}),
        "resreq": "rusage[ngpus=2]",
    }
    assert d.warnings == ["line 8: #SBATCH --mail-type (mail) is ignored"]


def test_xce_directives_and_later_lines_win() -> None:
    d = parse_script("#XCE --mem 64MB --time 10\n#XCE -M 128 --env none\n#SBATCH -G 1\n",
                     mem_unit="KB")
    assert d.mem_limit == 128 << 10 and d.run_limit == 600 and d.env == EnvOption("none")
    assert d.resreq == "rusage[ngpus=1]"
    assert parse_script("#XCE -q a\n\n#XCE -q b\nrun\n").queue == "b"


@pytest.mark.parametrize(("script", "error"), [
    ("#BSUB -Z 3\n", "line 1: #BSUB -Z: not a supported option"),
    ("#!/bin/sh\n#BSUB -n\n", "line 2: #BSUB -n needs a value"),
    ("#BSUB -n zero\n", "expected a whole number"),
    ("#BSUB -M lots\n", "line 1: #BSUB -M: 'lots' is not a memory amount"),
    ("#SBATCH --nodes=2\n", "--nodes: not a supported option"),
    ("#SBATCH --time=forever\n", "not a Slurm time"),
    ("#SBATCH -o out.%N\n", "pattern %N is not supported"),
    ("#SBATCH --exclusive=user\n", "only whole-host"),
    ("#SBATCH --gres=fpga:1\n", "only gpu"),
    ('#BSUB -J "unterminated\n', "line 1: #BSUB: No closing quotation"),
    ("#XCE queue\n", "expected an option"),
])
def test_bad_directives_name_the_line(script: str, error: str) -> None:
    with pytest.raises(JobSpecError, match=error.replace("[", r"\[")):
        parse_script(script)


@given(st.text(max_size=200))
def test_parse_script_never_raises_anything_else(text: str) -> None:
    with contextlib.suppress(JobSpecError):
        parse_script(text)


def test_not_directives() -> None:
    assert parse_script("#BSUBX -q a\n#XCEq\n# BSUB -q b\n").given() == {}
