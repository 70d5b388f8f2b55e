#!/usr/bin/env bash
# Set up everything zerokit needs on a fresh Debian/Ubuntu machine: system packages, a venv with the
# pinned CPU stack, and DeepSpeed's JIT-compiled CPU ops (built once, cached in .cache/).
# Idempotent: a second run only checks. GPU users: ZEROKIT_TORCH=own keeps the torch you have.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}

# System packages: libaio-dev (NVMe offload), pdsh + openssh-server (multi-node launcher, tested on
# loopback), numactl (--bind_cores_to_rank).
need=()
for pkg in libaio-dev pdsh openssh-server numactl; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "setup: missing system packages ${need[*]} (install them with apt as root); continuing" >&2
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.zerokit-installed"
pip_install() {
  # pip warns once per package about index locations some machines configure but lack: not ours to fix.
  # Bytecode compiled here, at install (not pip --no-compile): with PYTHONDONTWRITEBYTECODE set, as on these machines,
  # every process would otherwise compile torch and transformers again (the suite took 2,151 s instead of 1,130 s)
  "$VENV/bin/pip" install -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints-cpu.txt -nt "$stamp" ]; then
  if [ "${ZEROKIT_TORCH:-cpu}" = cpu ]; then
    # torch==2.13.0 first, through the constraints file: any other version pulls GBs of CUDA wheels.
    pip_install -c constraints-cpu.txt torch==2.13.0
    pip_install -c constraints-cpu.txt -e ".[dev]"
  else
    pip_install -e ".[dev]"
  fi
  touch "$stamp"
fi

# DeepSpeed builds its CPU ops with ninja on first use (53 s + 79 s here); build them now, once.
PATH="$PWD/$VENV/bin:$PATH" "$VENV/bin/python" scripts/warm_ops.py
