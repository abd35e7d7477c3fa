#!/usr/bin/env bash
# Makes the files kustomization.yaml's secretGenerator reads, in deploy/k8s/secrets/ (or $1):
#   ha-secret              random shared secret of the brokers' HA links
#   zk-auth                random ZooKeeper digest credential "tidemq:<password>"; brokers put
#                          digest ACLs for it on every znode they create (world READ stays)
#   ca.pem, zk-server-bundle.pem   ZooKeeper's CA and certificate + key (names zk, zk-N.zk-hs)
#   client.pem, client.key TideMQ nodes' ZooKeeper client certificate (ZooKeeper requires one)
# There are no example secrets to deploy by mistake: `kubectl apply -k deploy/k8s` fails until
# these files exist. The certificates come from a development CA (`tidemq certs`; its key is
# not kept): bring your own CA's files under the same names in production.
# Needs `tidemq` on PATH (or TIDEMQ=/path/to/tidemq) and openssl.
set -euo pipefail
out="${1:-$(cd "$(dirname "$0")" && pwd)/secrets}"
tidemq="${TIDEMQ:-tidemq}"
if [ -e "$out/ha-secret" ]; then
    echo "make-secrets: $out already has secrets; remove it first" >&2
    exit 1
fi
mkdir -p "$out"
chmod 0700 "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$tidemq" certs "$work" --host zk --host zk-0.zk-hs --host zk-1.zk-hs --host zk-2.zk-hs >/dev/null
cp "$work/ca.pem" "$work/client.pem" "$work/client.key" "$out/"
cat "$work/server.pem" "$work/server.key" > "$out/zk-server-bundle.pem"
openssl rand -hex 32 > "$out/ha-secret"
printf 'tidemq:%s' "$(openssl rand -hex 24)" > "$out/zk-auth"
chmod 0600 "$out"/*
echo "make-secrets: wrote $out"
