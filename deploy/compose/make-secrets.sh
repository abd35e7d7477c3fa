#!/usr/bin/env bash
# Makes the files docker-compose.yml takes its secrets from, in deploy/compose/secrets/ (or $1);
# `docker compose up` fails until they exist, so no example secret is ever deployed:
#   ha-secret              random shared secret of the brokers' HA links
#   ca.pem                 development CA (`tidemq certs`); ZooKeeper and TideMQ trust it
#   zk-server-bundle.pem   ZooKeeper's certificate (names zk-1, zk-2, zk-3) + PKCS#8 key
#   client.pem, client.key TideMQ nodes' client certificate (ZooKeeper requires one)
#   zk-auth                random ZooKeeper digest credential "tidemq:<password>"; brokers
#                          put digest ACLs for it on every znode they create
# Development only: the CA key stays in the directory. Compose (without swarm) bind-mounts
# secret files as they are on the host, so the containers' users (ZooKeeper uid 1000, TideMQ
# uid 10001) must be able to read them: the files are made 0644 and the directory 0755. Keep
# them off shared machines; in production use Kubernetes Secrets (deploy/k8s) or swarm secrets.
# Needs `tidemq` on PATH (or TIDEMQ=/path/to/tidemq) and openssl.
# deploy/k8s/make-secrets.sh runs this script with ZK_HOSTS (ZooKeeper's certificate names) and
# SECRET_MODE (file mode: Kubernetes reads them with kubectl, so 0600) of its own.
set -euo pipefail
out="${1:-$(cd "$(dirname "$0")" && pwd)/secrets}"
tidemq="${TIDEMQ:-tidemq}"
zk_hosts="${ZK_HOSTS:-zk-1 zk-2 zk-3}"
mode="${SECRET_MODE:-0644}"
if [ -e "$out/zk-auth" ]; then
    echo "make-secrets: $out already has secrets; remove it first" >&2
    exit 1
fi
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
host_args=()
for h in $zk_hosts; do host_args+=(--host "$h"); done
"$tidemq" certs "$work" "${host_args[@]}" >/dev/null
cp "$work/ca.pem" "$work/client.pem" "$work/client.key" "$out/"
cat "$work/server.pem" "$work/server.key" > "$out/zk-server-bundle.pem"
printf 'tidemq:%s\n' "$(openssl rand -hex 24)" > "$out/zk-auth"
openssl rand -hex 32 > "$out/ha-secret"
if [ "$mode" = 0644 ]; then chmod 0755 "$out"; else chmod 0700 "$out"; fi
chmod "$mode" "$out"/*
echo "make-secrets: wrote $out"
