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
        for f in set(shm.glob(SHM_GLOB)) - before:
            try:
                f.unlink()
            except OSError:
                pass


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
