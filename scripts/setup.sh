#!/usr/bin/env bash
# Idempotent set-up, safe to run again. Two modes:
#   bash scripts/setup.sh          everything the tests need: system packages (apt, as root:
#                                  Java, ZooKeeper, openssl, Prometheus, docker-compose), a
#                                  virtualenv in .venv with TideMQ (editable) and its test and
#                                  pipeline extras (pyspark, pyarrow). Used by scripts/test.sh.
#   bash scripts/setup.sh --lean   only what a standalone broker and the CLI need: .venv with
#                                  TideMQ (editable) and its three runtime packages (aiohttp,
#                                  prometheus-client, orjson). No root, no apt, no Java.
#                                  Used by scripts/quickstart.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=full
case "${1:-}" in
  --lean) mode=lean ;;
  "") ;;
  *) echo "usage: bash scripts/setup.sh [--lean]" >&2; exit 2 ;;
esac

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "setup: TideMQ needs Python 3.11 or newer ($PY is $("$PY" -V 2>&1)); set PYTHON=python3.11" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi

if [ "$mode" = lean ]; then
  # a broker and the CLI: the base package only (a full set-up already covers it)
  if ! .venv/bin/python -c 'import aiohttp, prometheus_client, orjson, tidemq.cli.main' 2>/dev/null \
      || [ ! -x .venv/bin/tidemq ]; then
    .venv/bin/python -m pip install -q -e .
  fi
  exit 0
fi

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

.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# pipeline: pyspark + pyarrow for pipeline/ and its tests (Java comes with the apt step above);
# grpc: grpcio + protobuf for the broker's gRPC service
.venv/bin/python -m pip install -q -e '.[test,pipeline,grpc]'

# --- RocketMQ 5 SDK for the gRPC tests (tests/grpc/) -------------------------------------------
# The official rocketmq-python-client installs a top-level `rocketmq` package, as does the
# RocketMQ 4 client (rocketmq==0.4.4) in .venv: they cannot share a virtualenv. The 5.x SDK gets
# its own, used only by the client side of tests/grpc (the broker never imports it); the
# broker side needs the `grpc` extra (grpcio, protobuf) in .venv, installed above.
if [ ! -x .venv-rmq5/bin/python ]; then
  "$PY" -m venv .venv-rmq5
fi
.venv-rmq5/bin/python -m pip install -q 'rocketmq-python-client==5.1.2'
