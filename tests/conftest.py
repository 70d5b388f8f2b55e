import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"


SHM_GLOB = "deepspeed_allreduce_buffer_*"


@pytest.fixture(scope="session", autouse=True)
def _remove_our_shm_buffers():
    """DeepSpeed's CPU launcher leaves a ~69 MB /dev/shm buffer per rank after exit; remove the ones
    this test session created (zerokit launch's runner cleans its own; direct launches in tests don't)."""
    shm = Path("/dev/shm")
    before = set(shm.glob(SHM_GLOB)) if shm.is_dir() else set()
    yield
    if shm.is_dir():
        # under pytest-xdist another worker's job may still be using its buffers: only those no process maps
        for f in set(shm.glob(SHM_GLOB)) - before - _mapped_shm_files():
            try:
                f.unlink()
            except OSError:
                pass


def _mapped_shm_files() -> set[Path]:
    """The /dev/shm files a live process has mapped (/proc/PID/maps)."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if "/dev/shm/" in line:
                mapped.add(Path(line[line.index("/dev/shm/"):].split(" (deleted)")[0].strip()))
    return mapped


def pytest_collection_modifyitems(config, items):
    """Files with the most real multi-rank jobs (-m slow) first, each file's tests in their order: `make test` runs files
    two at a time (pytest-xdist --dist loadfile hands them out in this order), and a long file handed out last would
    run alone at the end while the other worker idles."""
    from collections import Counter

    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])  # stable: files in their order within a count, tests within a file


@pytest.fixture(scope="session", autouse=True)
def _hermetic_env(tmp_path_factory):
    """Keep the spec cache out of the user's home, plans on the catalog's figures, and the venv's tools (deepspeed,
    ninja) first in PATH."""
    os.environ.setdefault("ZEROKIT_CACHE_DIR", str(tmp_path_factory.mktemp("zerokit-cache")))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    # plans price step time on the catalog, not on the profile setup measured on this machine (spec.profile
    # LOCAL_PROFILE_ENV): expectations must not depend on the machine; tests of the machine's profile set it
    os.environ["ZEROKIT_HARDWARE_PROFILE"] = "none"
    bindir = str(Path(sys.executable).parent)
    if not os.environ.get("PATH", "").startswith(bindir):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    yield
