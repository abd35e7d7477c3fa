"""`tidemq certs DIR`: a self-signed development CA plus server and client certificates.

For the quickstart and tests only: the CA key sits next to the certificates. Made by calling the
`openssl` command (Debian's openssl package; Python's ssl module can load certificates but not
make them, and the `cryptography` package would be a large dependency for a dev helper).

Files written into DIR (keys mode 0600):
    ca.pem, ca.key                   the CA (10 years)
    server.pem, server.key           CN=tidemq-node, SAN 127.0.0.1, ::1, localhost (+ --host ...)
    client.pem, client.key           CN=tidemq-client, for mutual TLS (HA links, name servers)
Keys are EC P-256 (fast handshakes). Existing files are refused unless --force.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile

FILES = ("ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key")
_DAYS = "3650"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def _run(args: list[str], cwd: str) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()[-500:]}")


def make_dev_certs(out_dir: str, hosts=(), force: bool = False) -> dict:
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command is needed (apt-get install openssl)")
    os.makedirs(out_dir, exist_ok=True)
    existing = [f for f in FILES if os.path.exists(os.path.join(out_dir, f))]
    if existing and not force:
        raise RuntimeError(f"{out_dir} already has {', '.join(existing)} (use --force)")
    san = ["IP:127.0.0.1", "IP:::1", "DNS:localhost"]
    for h in hosts:
        san.append(("IP:" if _is_ip(h) else "DNS:") + h)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _run(["req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", _DAYS,
              "-subj", "/CN=TideMQ development CA", "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign"], tmp)
        for name, cn, usage, extra in (
                ("server", "tidemq-node", "serverAuth,clientAuth", "subjectAltName=" + ",".join(san)),
                ("client", "tidemq-client", "clientAuth", "")):
            _run(["req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                  "-subj", f"/CN={cn}"], tmp)
            with open(os.path.join(tmp, f"{name}.ext"), "w") as f:
                f.write(f"basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"
                        f"keyUsage=critical,digitalSignature,keyEncipherment\n")
                if extra:
                    f.write(extra + "\n")
            _run(["x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                  "-CAcreateserial", "-out", f"{name}.pem", "-days", _DAYS, "-sha256",
                  "-extfile", f"{name}.ext"], tmp)
        for fname in FILES:
            os.chmod(os.path.join(tmp, fname), 0o600 if fname.endswith(".key") else 0o644)
            os.replace(os.path.join(tmp, fname), os.path.join(out_dir, fname))
    return {f.split(".")[0] + ("_key" if f.endswith(".key") else "_cert"): os.path.join(out_dir, f)
            for f in FILES}


def run_certs(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tidemq certs",
                                description="Make a self-signed development CA and certificates.")
    p.add_argument("dir", help="output directory")
    p.add_argument("--host", action="append", default=[],
                   help="extra server name or IP for the certificate (repeatable)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    args = p.parse_args(argv)
    try:
        files = make_dev_certs(args.dir, args.host, args.force)
    except (RuntimeError, OSError) as exc:
        print(f"tidemq certs: {exc}", file=sys.stderr)
        return 1
    import json
    print(json.dumps(files, sort_keys=True))
    return 0
