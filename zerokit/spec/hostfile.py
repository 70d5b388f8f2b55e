"""Hostfiles, --include/--exclude filters and .deepspeed_env, by DeepSpeed's rules (pure Python).

These mirror `deepspeed.launcher.runner` (fetch_hostfile, _parse_hostfile, parse_resource_filter,
parse_inclusion_exclusion, and how main() reads .deepspeed_env) without importing deepspeed, so a
plan can be checked on a machine without the training stack. Where DeepSpeed accepts something
that cannot work, zerokit refuses it with a one-line error; where both accept a file or filter,
the result is the same (tests/test_hostfile.py checks this against DeepSpeed itself).

zerokit is stricter than DeepSpeed in these cases only:
  * a missing hostfile is an error (DeepSpeed warns and silently launches on local resources);
  * slots=0 is an error (DeepSpeed accepts it and the host gets no ranks);
  * text glued to the slot count (`slots=4abc`, DeepSpeed reads 4) or a stray word after it is an
    error; `key=value` options (OpenMPI's `max_slots=8`) and `# comments` after it are accepted;
  * host names containing `@`, `:` or `,` are an error (they break --include/--exclude and pdsh -w);
  * a filter naming a host both whole and with slots (`w0@w0:1`) is an error (DeepSpeed keeps
    only slot 1), and a filter that leaves no slot at all is an error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from zerokit.core.errors import ZerokitError
from zerokit.core.limits import MAX_GPUS_PER_NODE
from zerokit.core.fsutil import atomic_write_text

# DeepSpeed: r'^(\S+)\s+slots=(\d+)' searched on the stripped line.
_LINE = re.compile(r"^(\S+)\s+slots=(\d+)(.*)$")
_OPTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S+$")
_BAD_HOST_CHARS = "@:,"
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_EXAMPLE = "'worker-0 slots=8'"


def parse_hostfile(path: str | os.PathLike) -> dict[str, int]:
    """Read an MPI-style hostfile: one `HOST slots=N` per line, `#` comments and blank lines ignored.

    Returns host -> slots in file order. Raises ZerokitError (one line: file, line number, fix).
    """
    p = Path(path)
    if not p.exists():
        raise ZerokitError(
            f"hostfile {path} does not exist: give the path of a file with one {_EXAMPLE} line per node"
        )
    if not p.is_file():
        raise ZerokitError(f"hostfile {path} is not a regular file: give a file with one {_EXAMPLE} line per node")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ZerokitError(f"hostfile {path} is not UTF-8 text: write it as plain text, one {_EXAMPLE} per line") from None
    except OSError as e:
        raise ZerokitError(f"hostfile {path} cannot be read ({e.strerror}): fix its permissions or path") from None
    return parse_hostfile_text(text, name=str(path))


def parse_hostfile_text(text: str, name: str = "<hostfile>") -> dict[str, int]:
    """parse_hostfile on text already read; `name` is used in error messages."""
    hosts: dict[str, int] = {}
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"hostfile {name} line {lineno}"
        m = _LINE.match(line)
        if not m:
            first = line.split()[0]
            if len(line.split()) == 1:
                hint = f"add the slot count, e.g. '{first} slots=8'"
            elif re.search(r"slots\s*=\s*-?\d", line) or "slots" in line:
                hint = f"write exactly '{first} slots=N' with N a positive integer and no spaces around '='"
            else:
                hint = f"each line must be 'HOST slots=N', e.g. {_EXAMPLE}"
            raise ZerokitError(f"{where}: bad entry {line!r}: {hint}")
        host, slots_text, rest = m.group(1), m.group(2), m.group(3)
        if rest and not (rest[0].isspace() or rest[0] == "#"):
            raise ZerokitError(
                f"{where}: bad slot count in {line!r}: slots must be a whole number, e.g. '{host} slots=8'"
            )
        extra = rest.split("#", 1)[0].split()
        junk = [tok for tok in extra if not _OPTION.match(tok)]
        if junk:
            raise ZerokitError(
                f"{where}: unexpected {junk[0]!r} in {line!r}: after slots=N only key=value options "
                "(e.g. max_slots=8) or a # comment may follow"
            )
        bad = [c for c in _BAD_HOST_CHARS if c in host]
        if bad:
            raise ZerokitError(
                f"{where}: host name {host!r} contains {bad[0]!r}, which --include/--exclude and pdsh -w "
                "use as separators: use the host's plain name or IPv4 address"
            )
        slots = int(slots_text)
        if slots > MAX_GPUS_PER_NODE:
            raise ZerokitError(f"{where}: {host} has slots={slots_text}: at most {MAX_GPUS_PER_NODE} ranks run on one "
                               "host (core/limits.py); give the number of GPUs on that host")
        if slots < 1:
            raise ZerokitError(f"{where}: {host} has slots={slots_text}: slots must be a positive integer; remove the line or set slots=N >= 1")
        if host in hosts:
            raise ZerokitError(
                f"{where}: host {host} is listed again (first on line {first_line[host]}): keep one line per host"
            )
        hosts[host] = slots
        first_line[host] = lineno
    if not hosts:
        raise ZerokitError(f"hostfile {name} lists no hosts: add one {_EXAMPLE} line per node")
    return hosts


def _parse_filter(spec: str, flag: str, hosts: dict[str, int]) -> dict[str, list[int]]:
    """NODE_SPEC[@NODE_SPEC ...], NODE_SPEC = NAME[:SLOT[,SLOT ...]] -> host -> sorted slots ([] = whole host)."""
    whole: set[str] = set()
    out: dict[str, list[int]] = {}
    for part in spec.split("@"):
        if ":" in part:
            pieces = part.split(":")
            if len(pieces) != 2:
                raise ZerokitError(f"{flag} {spec!r}: {part!r} has more than one ':': write HOST or HOST:SLOT[,SLOT...]")
            name, slots_text = pieces
            try:
                slots = [int(s) for s in slots_text.split(",")]
            except ValueError:
                raise ZerokitError(
                    f"{flag} {spec!r}: slots in {part!r} must be comma-separated integers, e.g. '{name or 'worker-0'}:0,2'"
                ) from None
        else:
            name, slots = part, []
        if name not in hosts:
            known = ", ".join(hosts)
            shown = repr(name) if name.strip() != name or not name else name
            raise ZerokitError(
                f"{flag} {spec!r}: host {shown} is not in the hostfile (hosts: {known}): "
                "use a host name from the hostfile, '@' between hosts, no spaces"
            )
        for s in slots:
            if not 0 <= s < hosts[name]:
                raise ZerokitError(
                    f"{flag} {spec!r}: {name} has no slot {s} (it has slots=0..{hosts[name] - 1}): "
                    "use slot numbers below its slots=N"
                )
        if not slots:
            whole.add(name)
        out.setdefault(name, [])
        out[name] = sorted(set(out[name]) | set(slots))
        if name in whole and out[name]:
            raise ZerokitError(
                f"{flag} {spec!r}: {name} is named both whole and with slots: name it once, "
                f"either '{name}' or '{name}:SLOT,...'"
            )
    return out


def apply_filters(hosts: dict[str, int], include: str | None = None, exclude: str | None = None) -> dict[str, list[int]]:
    """The slots a job uses: host -> slot ids, after DeepSpeed's --include or --exclude.

    `include`/`exclude` use DeepSpeed's syntax NAME[:SLOT[,SLOT...]][@NAME...], e.g.
    "worker-0@worker-1:0,2" (all of worker-0, slots 0 and 2 of worker-1). They are mutually
    exclusive. Hosts keep hostfile order; hosts left with no slots are dropped.
    """
    include = include or ""
    exclude = exclude or ""
    if include and exclude:
        raise ZerokitError("--include and --exclude are mutually exclusive (DeepSpeed refuses both): give only one")
    pool = {h: list(range(n)) for h, n in hosts.items()}
    if not include and not exclude:
        return pool
    if include:
        wanted = _parse_filter(include, "--include", hosts)
        result = {h: (wanted[h] or pool[h]) for h in pool if h in wanted}
    else:
        dropped = _parse_filter(exclude, "--exclude", hosts)
        result = {}
        for h, slots in pool.items():
            if h in dropped:
                slots = [] if not dropped[h] else [s for s in slots if s not in dropped[h]]
            if slots:
                result[h] = slots
    result = {h: s for h, s in result.items() if s}
    if not result:
        raise ZerokitError(f"--exclude {exclude!r} leaves no slots to run on: exclude fewer hosts or slots")
    return result


def deepspeed_env_name() -> str:
    """The file name DeepSpeed's runner reads: $DS_ENV_FILE, else `.deepspeed_env`."""
    return os.getenv("DS_ENV_FILE", ".deepspeed_env")


def format_deepspeed_env(env: dict[str, str]) -> str:
    """The text of a .deepspeed_env file: KEY=VALUE per line, checked so DeepSpeed exports it intact.

    DeepSpeed's runner splits each line at the first '=', strips the value and, for pdsh, puts
    `export KEY="VALUE";` in a remote shell command, so a value may not hold a newline or '"'
    (and `$VAR` in a value is expanded by the remote shell).
    """
    lines = []
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_KEY.match(key):
            raise ZerokitError(f"environment name {key!r} is not valid: use letters, digits and '_', not starting with a digit")
        value = str(value)
        if any(c in value for c in "\n\r\0\""):
            raise ZerokitError(
                f"environment value of {key} contains a newline, NUL or '\"', which .deepspeed_env cannot carry: "
                "remove it or set the variable in the ranks' shell profile"
            )
        if value != value.strip():
            raise ZerokitError(f"environment value of {key} has leading/trailing whitespace, which DeepSpeed strips: remove it")
        lines.append(f"{key}={value}\n")
    return "".join(lines)


def write_deepspeed_env(dir: str | os.PathLike, env: dict[str, str]) -> Path:
    """Write `env` to DIR/.deepspeed_env (or DIR/$DS_ENV_FILE) atomically; return its path.

    DeepSpeed's runner (multi-node launchers only: pdsh, openmpi, mpich, slurm, ...) reads this
    file from the home directory and then from its current directory, entries from the latter
    winning, and exports each KEY=VALUE to every rank. Write it into the directory `deepspeed` is
    started from.
    """
    text = format_deepspeed_env(env)
    d = Path(dir)
    if not d.is_dir():
        raise ZerokitError(f"cannot write {deepspeed_env_name()}: {dir} is not a directory; create it first")
    target = d / deepspeed_env_name()
    atomic_write_text(target, text, mode=0o644)
    return target
