#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: system packages the tests need, a virtualenv in .venv,
# and TideMQ installed into it (editable) with its test extras. Sourced by quickstart.sh and
# test.sh; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)  # `tidemq certs` (TLS tests)
# deployment checks (tests/ops): promtool + a real Prometheus, docker-compose 1.29 (`config -q`)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
# a C compiler and the Python headers build the optional accelerators (setup.py); without
# them the install still works, in pure Python
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
"${PYTHON:-python3}" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  2>/dev/null || need_apt+=(python3-dev)
if [ ${#need_apt[@]} -gt 0 ] && [ "${TIDEMQ_SKIP_APT:-0}" != 1 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need_apt[*]}" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "setup: please install: ${need_apt[*]} (Debian package names)" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# pipeline: pyspark + pyarrow for pipeline/ and its tests (Java comes with the apt step above)
.venv/bin/python -m pip install -q -e '.[test,pipeline]'
