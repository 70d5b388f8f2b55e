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

stamp="$VENV/.zerokit-installed"
install=0
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints-cpu.txt -nt "$stamp" ]; then
  install=1
  # The venv takes 2.1 GiB and pip unpacks its wheels in the temp dir first: a full disk otherwise ends in pip's
  # "OSError: [Errno 28] No space left on device" halfway through, a venv half-installed.
  need_gib=4
  [ -x "$VENV/bin/python" ] && need_gib=1  # an update reinstalls into the venv there
  for dir in . "${TMPDIR:-/tmp}"; do
    free_kib=$(df -Pk "$dir" | awk 'NR == 2 {print $4}')
    if [ -n "$free_kib" ] && [ "$free_kib" -lt $((need_gib * 1024 * 1024)) ]; then
      echo "setup: $((free_kib / 1024)) MiB free on $(cd "$dir" && pwd); the install needs about $need_gib GiB:" \
           "free space there (or point TMPDIR elsewhere) and rerun" >&2
      exit 2
    fi
  done
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
pip_install() {
  # pip warns once per package about index locations some machines configure but lack: not ours to fix.
  # Bytecode compiled here, at install (not pip --no-compile): with PYTHONDONTWRITEBYTECODE set, as on these machines,
  # every process would otherwise compile torch and transformers again (the suite took 2,151 s instead of 1,130 s)
  "$VENV/bin/pip" install -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
if [ "$install" = 1 ]; then
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
