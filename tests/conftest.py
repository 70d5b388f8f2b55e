import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"


@pytest.fixture(scope="session", autouse=True)
def _hermetic_env(tmp_path_factory):
    """Keep the spec cache out of the user's home; keep the venv's tools (deepspeed, ninja) first in PATH."""
    os.environ.setdefault("ZEROKIT_CACHE_DIR", str(tmp_path_factory.mktemp("zerokit-cache")))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    bindir = str(Path(sys.executable).parent)
    if not os.environ.get("PATH", "").startswith(bindir):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    yield
