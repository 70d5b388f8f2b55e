"""zerokit.spec.hostfile against DeepSpeed's own runner: same results where both accept, errors otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zerokit.core.errors import ZerokitError
from zerokit.spec.hostfile import (
    apply_filters,
    deepspeed_env_name,
    format_deepspeed_env,
    parse_hostfile,
    write_deepspeed_env,
)

REPO = Path(__file__).resolve().parents[1]
HOSTFILES = sorted(p for p in (REPO / "hostfiles").iterdir() if p.is_file() and p.name != "README.md")


@pytest.fixture(scope="module")
def ds_runner():
    pytest.importorskip("deepspeed")
    from deepspeed.launcher import runner

    return runner


def write(tmp_path: Path, text: str, name: str = "hostfile") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------------------------------------
# valid files

VALID = {
    "basic": ("worker-0 slots=8\nworker-1 slots=8\n", {"worker-0": 8, "worker-1": 8}),
    "comments-and-blanks": (
        "# cluster\n\n   \nworker-0 slots=4\n  # indented comment\nworker-1 slots=2\n\n",
        {"worker-0": 4, "worker-1": 2},
    ),
    "order-kept": ("zeta slots=1\nalpha slots=2\nmid slots=3\n", {"zeta": 1, "alpha": 2, "mid": 3}),
    "tabs-and-indent": ("\tworker-0\tslots=4\n  worker-1    slots=4  \n", {"worker-0": 4, "worker-1": 4}),
    "crlf": ("worker-0 slots=2\r\nworker-1 slots=2\r\n", {"worker-0": 2, "worker-1": 2}),
    "no-final-newline": ("localhost slots=2", {"localhost": 2}),
    "inline-comment": ("worker-0 slots=8 # big box\nworker-1 slots=8#glued\n", {"worker-0": 8, "worker-1": 8}),
    "openmpi-options": ("node-a slots=8 max_slots=8\n", {"node-a": 8}),
    "ip-addresses": ("10.0.0.1 slots=8\n10.0.0.2 slots=8\n", {"10.0.0.1": 8, "10.0.0.2": 8}),
    "fqdn": ("gpu01.cluster.example.org slots=4\n", {"gpu01.cluster.example.org": 4}),
    "leading-zero": ("worker-0 slots=08\n", {"worker-0": 8}),
    "large": ("".join(f"n{i} slots=8\n" for i in range(64)), {f"n{i}": 8 for i in range(64)}),
}


@pytest.mark.parametrize("case", sorted(VALID))
def test_valid_hostfile(tmp_path, case):
    text, expected = VALID[case]
    got = parse_hostfile(write(tmp_path, text))
    assert got == expected
    assert list(got) == list(expected)  # order matters: the first host is rank 0
    assert all(isinstance(v, int) for v in got.values())


@pytest.mark.parametrize("case", sorted(VALID))
def test_valid_hostfile_equals_deepspeed(tmp_path, ds_runner, case):
    p = write(tmp_path, VALID[case][0])
    ours = parse_hostfile(p)
    theirs = ds_runner.fetch_hostfile(str(p))
    assert list(ours.items()) == list(theirs.items())


# ------------------------------------------------------------------------------------------------
# malformed files: one test each; `fragment` must be in the one-line message


def check_error(path, *fragments):
    with pytest.raises(ZerokitError) as exc:
        parse_hostfile(path)
    msg = str(exc.value)
    assert "\n" not in msg
    assert str(path) in msg
    for f in fragments:
        assert f in msg, msg
    assert exc.value.exit_code == 2
    return msg


def test_missing_file(tmp_path):
    check_error(tmp_path / "nope", "does not exist", "slots=")


def test_directory_is_not_a_hostfile(tmp_path):
    check_error(tmp_path, "not a regular file")


def test_empty_file(tmp_path):
    check_error(write(tmp_path, ""), "lists no hosts")


def test_only_comments_and_blank_lines(tmp_path):
    check_error(write(tmp_path, "# nothing here\n\n   \n"), "lists no hosts")


def test_not_utf8(tmp_path):
    p = tmp_path / "hostfile"
    p.write_bytes(b"w\xff\xfe slots=1\n")
    check_error(p, "UTF-8")


def test_host_without_slots(tmp_path):
    check_error(write(tmp_path, "worker-0 slots=2\nworker-1\n"), "line 2", "'worker-1 slots=8'")


def test_spaces_around_equals(tmp_path):
    check_error(write(tmp_path, "worker-0 slots = 4\n"), "line 1", "no spaces around '='")


def test_slots_not_a_number(tmp_path):
    check_error(write(tmp_path, "worker-0 slots=four\n"), "line 1", "slots=N")


def test_negative_slots(tmp_path):
    check_error(write(tmp_path, "worker-0 slots=-1\n"), "line 1", "positive integer")


def test_zero_slots(tmp_path):
    check_error(write(tmp_path, "# c\nworker-0 slots=0\n"), "line 2", "positive integer")


def test_slots_with_trailing_garbage(tmp_path):
    check_error(write(tmp_path, "worker-0 slots=4abc\n"), "line 1", "whole number")


def test_decimal_slots(tmp_path):
    check_error(write(tmp_path, "worker-0 slots=2.5\n"), "line 1", "whole number")


def test_stray_word_after_slots(tmp_path):
    check_error(write(tmp_path, "worker-0 slots=4 gpus\n"), "line 1", "'gpus'")


def test_duplicate_host(tmp_path):
    check_error(write(tmp_path, "a slots=1\nb slots=1\na slots=2\n"), "line 3", "first on line 1", "one line per host")


def test_mpi_style_host_only_colon(tmp_path):
    check_error(write(tmp_path, "worker-0:4\n"), "line 1", "slots")


def test_host_with_colon(tmp_path):
    check_error(write(tmp_path, "fe80::1 slots=1\n"), "line 1", "':'")


def test_host_with_at(tmp_path):
    check_error(write(tmp_path, "user@worker-0 slots=1\n"), "line 1", "'@'")


def test_host_with_comma(tmp_path):
    check_error(write(tmp_path, "a,b slots=1\n"), "line 1", "','")


# What DeepSpeed does with each malformed file: "error" (it raises too), "local" (it ignores the
# hostfile and launches locally) or the pool it accepts (zerokit is stricter; see the module doc).
MALFORMED = {
    "empty": ("", "error"),
    "only-comments": ("# x\n\n", "error"),
    "no-slots": ("worker-0\n", "error"),
    "spaces-around-equals": ("worker-0 slots = 4\n", "error"),
    "slots-word": ("worker-0 slots=four\n", "error"),
    "negative": ("worker-0 slots=-1\n", "error"),
    "duplicate": ("a slots=1\na slots=2\n", "error"),
    "mpi-colon": ("worker-0:4\n", "error"),
    "zero": ("worker-0 slots=0\n", {"worker-0": 0}),
    "trailing-garbage": ("worker-0 slots=4abc\n", {"worker-0": 4}),
    "decimal": ("worker-0 slots=2.5\n", {"worker-0": 2}),
    "stray-word": ("worker-0 slots=4 gpus\n", {"worker-0": 4}),
    "ipv6": ("fe80::1 slots=1\n", {"fe80::1": 1}),
    "at-sign": ("user@w slots=1\n", {"user@w": 1}),
    "comma": ("a,b slots=1\n", {"a,b": 1}),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_vs_deepspeed(tmp_path, ds_runner, case):
    text, deepspeed_does = MALFORMED[case]
    p = write(tmp_path, text)
    with pytest.raises(ZerokitError):
        parse_hostfile(p)
    if deepspeed_does == "error":
        with pytest.raises(ValueError):
            ds_runner.fetch_hostfile(str(p))
    else:
        assert dict(ds_runner.fetch_hostfile(str(p))) == deepspeed_does


def test_missing_file_vs_deepspeed(tmp_path, ds_runner):
    # DeepSpeed falls back to local resources; zerokit refuses (a typo must not launch locally).
    assert ds_runner.fetch_hostfile(str(tmp_path / "nope")) is None
    with pytest.raises(ZerokitError):
        parse_hostfile(tmp_path / "nope")


# ------------------------------------------------------------------------------------------------
# the shipped examples


def test_examples_exist():
    names = {p.name for p in HOSTFILES}
    assert {"two-nodes-8gpu", "localhost-2", "loopback-2x1"} <= names
    assert (REPO / "hostfiles" / "README.md").is_file()


@pytest.mark.parametrize("path", HOSTFILES, ids=[p.name for p in HOSTFILES])
def test_shipped_hostfile(path, ds_runner):
    ours = parse_hostfile(path)
    assert ours and all(n >= 1 for n in ours.values())
    assert list(ours.items()) == list(ds_runner.fetch_hostfile(str(path)).items())
    # and every filter DeepSpeed would accept resolves the same
    first = next(iter(ours))
    for include, exclude in [("", ""), (first, ""), (f"{first}:0", ""), ("", f"{first}:0")]:
        if exclude and sum(ours.values()) == 1:
            continue
        assert apply_filters(ours, include, exclude) == dict(
            ds_runner.parse_inclusion_exclusion(ours, include, exclude)
        )


# ------------------------------------------------------------------------------------------------
# --include / --exclude

POOL = {"worker-0": 4, "worker-1": 4, "worker-2": 2}

FILTERS = [
    (None, None, {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [0, 1]}),
    ("worker-1", None, {"worker-1": [0, 1, 2, 3]}),
    ("worker-0@worker-1:0,2", None, {"worker-0": [0, 1, 2, 3], "worker-1": [0, 2]}),
    ("worker-2@worker-0", None, {"worker-0": [0, 1, 2, 3], "worker-2": [0, 1]}),  # hostfile order
    ("worker-1:2,0,2", None, {"worker-1": [0, 2]}),  # sorted, deduplicated
    ("worker-1:3@worker-1:1", None, {"worker-1": [1, 3]}),  # merged
    (None, "worker-1", {"worker-0": [0, 1, 2, 3], "worker-2": [0, 1]}),
    (None, "worker-1:0,2", {"worker-0": [0, 1, 2, 3], "worker-1": [1, 3], "worker-2": [0, 1]}),
    (None, "worker-2:0,1@worker-0:3", {"worker-0": [0, 1, 2], "worker-1": [0, 1, 2, 3]}),
    ("", "", {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [0, 1]}),
]


@pytest.mark.parametrize("include,exclude,expected", FILTERS)
def test_filters(include, exclude, expected):
    got = apply_filters(POOL, include, exclude)
    assert got == expected
    assert list(got) == list(expected)


@pytest.mark.parametrize("include,exclude,expected", FILTERS)
def test_filters_equal_deepspeed(ds_runner, include, exclude, expected):
    theirs = ds_runner.parse_inclusion_exclusion(POOL, include or "", exclude or "")
    assert list(apply_filters(POOL, include, exclude).items()) == list(theirs.items())


# (include, exclude, fragment of our message, what DeepSpeed does: "error" or its result)
BAD_FILTERS = [
    ("worker-0", "worker-1", "mutually exclusive", "error"),
    ("worker-9", None, "not in the hostfile", "error"),
    (None, "worker-9", "not in the hostfile", "error"),
    ("worker-0:4", None, "no slot 4", "error"),
    ("worker-2:-1", None, "no slot -1", "error"),
    ("worker-0:a", None, "comma-separated integers", "error"),
    ("worker-0:", None, "comma-separated integers", "error"),
    ("worker-0:0:1", None, "more than one ':'", "error"),
    ("worker-0@", None, "not in the hostfile", "error"),
    ("worker-0 @worker-1", None, "no spaces", "error"),
    # DeepSpeed lets these through; zerokit refuses them:
    ("worker-0@worker-0:1", None, "both whole and with slots", {"worker-0": [1]}),
    (None, "worker-0@worker-1@worker-2", "leaves no slots", {}),
]


@pytest.mark.parametrize("include,exclude,fragment,deepspeed_does", BAD_FILTERS)
def test_bad_filters(ds_runner, include, exclude, fragment, deepspeed_does):
    with pytest.raises(ZerokitError) as exc:
        apply_filters(POOL, include, exclude)
    assert fragment in str(exc.value)
    assert "\n" not in str(exc.value)
    if deepspeed_does == "error":
        with pytest.raises(ValueError):
            ds_runner.parse_inclusion_exclusion(POOL, include or "", exclude or "")
    else:
        assert dict(ds_runner.parse_inclusion_exclusion(POOL, include or "", exclude or "")) == deepspeed_does


# ------------------------------------------------------------------------------------------------
# .deepspeed_env


def read_like_deepspeed(runner_mod, path: Path) -> dict[str, str]:
    """runner.main()'s loop over the env file, feeding a real DeepSpeed runner's add_export."""
    args = runner_mod.parse_args(["--launcher", "pdsh", "x.py"])
    r = runner_mod.PDSHRunner(args, "e30=")
    with open(path) as fd:
        for var in fd.readlines():
            key, val = var.split("=", maxsplit=1)
            r.add_export(key, val)
    return r.exports


def test_write_deepspeed_env_round_trip(tmp_path, ds_runner, monkeypatch):
    monkeypatch.delenv("DS_ENV_FILE", raising=False)
    env = {
        "PATH": "/opt/venv/bin:/usr/bin",
        "PYTHONPATH": "/work/repo",
        "NCCL_DEBUG": "INFO",
        "EMPTY": "",
        "WITH_SPACE": "a b",
        "WITH_EQUALS": "k=v,x=y",
    }
    path = write_deepspeed_env(tmp_path, env)
    assert path == tmp_path / ".deepspeed_env" and path.name == ds_runner.DEEPSPEED_ENVIRONMENT_NAME
    assert path.read_text() == format_deepspeed_env(env)
    assert [p.name for p in tmp_path.iterdir()] == [".deepspeed_env"]  # no temp file left behind
    exports = read_like_deepspeed(ds_runner, path)
    assert exports == {
        "PATH": "/opt/venv/bin:/usr/bin",
        "PYTHONPATH": "/work/repo",
        "NCCL_DEBUG": "INFO",
        "EMPTY": "",
        "WITH_SPACE": '"a b"',  # DeepSpeed quotes it for the remote shell
        "WITH_EQUALS": "k=v,x=y",
    }


def test_write_deepspeed_env_replaces(tmp_path):
    write_deepspeed_env(tmp_path, {"A": "1"})
    write_deepspeed_env(tmp_path, {"B": "2"})
    assert (tmp_path / ".deepspeed_env").read_text() == "B=2\n"


def test_deepspeed_env_file_name_from_ds_env_file(tmp_path, monkeypatch):
    monkeypatch.setenv("DS_ENV_FILE", "my_env")
    assert deepspeed_env_name() == "my_env"
    assert write_deepspeed_env(tmp_path, {"A": "1"}) == tmp_path / "my_env"


def test_deepspeed_env_lookup_paths(ds_runner):
    # DeepSpeed reads the file from $HOME, then from its working directory (later entries win).
    assert ds_runner.DEEPSPEED_ENVIRONMENT_PATHS == [os.path.expanduser("~"), "."]


@pytest.mark.parametrize(
    "env,fragment",
    [
        ({"A": "x\ny"}, "newline"),
        ({"A": 'say "hi"'}, "'\"'"),
        ({"1A": "x"}, "not valid"),
        ({"A-B": "x"}, "not valid"),
        ({"A": " x"}, "whitespace"),
    ],
)
def test_deepspeed_env_rejects(tmp_path, env, fragment):
    with pytest.raises(ZerokitError) as exc:
        write_deepspeed_env(tmp_path, env)
    assert fragment in str(exc.value)
    assert not (tmp_path / ".deepspeed_env").exists()


def test_deepspeed_env_needs_directory(tmp_path):
    with pytest.raises(ZerokitError, match="not a directory"):
        write_deepspeed_env(tmp_path / "missing", {"A": "1"})
