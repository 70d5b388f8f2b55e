#!/usr/bin/env bash
# The tests' browser: Debian's Chromium, which tests/test_serve.py drives through Playwright (pip's playwright, with
# executable_path, downloads no browser). Installed for `make test` only: `make demo` stays without it.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "setup: installing chromium (the page's browser tests)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
else
  echo "setup: chromium missing (apt install chromium as root): tests/test_serve.py's browser tests will fail" >&2
fi
