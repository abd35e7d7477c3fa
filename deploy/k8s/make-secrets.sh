#!/usr/bin/env bash
# Makes the files kustomization.yaml's secretGenerator reads, in deploy/k8s/secrets/ (or $1):
#   ha-secret              random shared secret of the brokers' HA links
#   zk-auth                random ZooKeeper digest credential "tidemq:<password>"; brokers put
#                          digest ACLs for it on every znode they create (world READ stays)
#   ca.pem, zk-server-bundle.pem   ZooKeeper's CA and certificate + key (names zk, zk-N.zk-hs)
#   client.pem, client.key TideMQ nodes' ZooKeeper client certificate (ZooKeeper requires one)
# There are no example secrets to deploy by mistake: `kubectl apply -k deploy/k8s` fails until
# these files exist. The certificates come from a development CA (`tidemq certs`): bring your
# own CA's files under the same names in production. The work is done by the compose
# script, with the Kubernetes names and owner-only files.
# Needs `tidemq` on PATH (or TIDEMQ=/path/to/tidemq) and openssl.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ZK_HOSTS="zk zk-0.zk-hs zk-1.zk-hs zk-2.zk-hs" SECRET_MODE=0600 \
    exec bash "$here/../compose/make-secrets.sh" "${1:-$here/secrets}"
