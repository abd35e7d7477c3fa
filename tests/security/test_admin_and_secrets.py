"""Admin HTTP access rules, and secrets that never show: a run with ACL secrets, an admin token
and a ZooKeeper password, whose logs, /config, /metrics and error messages are grepped."""
import asyncio
import logging
import os
import subprocess
import sys
import urllib.error
import urllib.request

from tests.security.conftest import ADMIN_TOKEN, SECRET_ADMIN, SECRET_ALICE, write_acl
from tests.support.broker_proc import REPO_ROOT
from tidemq import errors
from tidemq.acl_signing import Credentials
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.security import ClientSecurity

ZK_PASSWORD = "zk-password-Wq8sL1"


def http(method, url, token=None):
    req = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _token_file(tmp_path):
    path = tmp_path / "admin.token"
    path.write_text(ADMIN_TOKEN + "\n")
    return str(path)


def test_changing_requests_need_the_admin_token(broker_factory, tmp_path):
    b = broker_factory(f"security.admin_token_file={_token_file(tmp_path)}").start()
    url = b.admin_url + "/topics"
    assert http("GET", url)[0] == 200  # read-only endpoints open by default
    status, text = http("POST", url)
    assert status == 401 and "Bearer" in text
    status, text = http("DELETE", url, token="wrong")
    assert status == 403 and "wrong" not in text
    assert http("POST", url, token=ADMIN_TOKEN)[0] == 405  # past the check: no POST route here


def test_reads_can_be_closed_and_no_token_means_no_changes(broker_factory, tmp_path):
    b = broker_factory(f"security.admin_token_file={_token_file(tmp_path)}",
                       "security.admin_read_open=false").start()
    assert http("GET", b.admin_url + "/health")[0] == 401
    assert http("GET", b.admin_url + "/health", token=ADMIN_TOKEN)[0] == 200
    open_broker = broker_factory().start()  # no token configured at all
    status, text = http("PUT", open_broker.admin_url + "/topics", token="anything")
    assert status == 403 and "not configured" in text


def test_secrets_never_appear_in_logs_config_metrics_or_errors(broker_factory, tmp_path, caplog):
    acl = write_acl(tmp_path / "acl.toml")
    conf = tmp_path / "broker.toml"
    conf.write_text(f'[zookeeper]\nauth = "tidemq:{ZK_PASSWORD}"\n')
    env = dict(os.environ, TIDEMQ_ADMIN_TOKEN=ADMIN_TOKEN)
    b = broker_factory("security.acl_enable=true", f"security.acl_file={acl}",
                       config_path=str(conf), env=env).start()
    caplog.set_level(logging.DEBUG)

    async def traffic():
        for creds in (Credentials("alice", SECRET_ALICE), Credentials("alice", "wrong-" + SECRET_ADMIN),
                      Credentials("root", SECRET_ADMIN)):
            p = Producer("secret-p", b.addr, security=ClientSecurity(credentials=creds), retries=0)
            await p.start()
            try:
                await p.send(Message("AclOrders", b"x"))
            except errors.TideMQError as exc:
                messages.append(str(exc))
            finally:
                await p.shutdown()

    messages = []
    asyncio.run(traffic())
    assert messages and "[ACL]" in messages[0]
    config = http("GET", b.admin_url + "/config")[1]
    metrics = http("GET", b.admin_url + "/metrics")[1]
    assert '"auth": "***"' in config or '"auth":"***"' in config
    assert http("POST", b.admin_url + "/x", token=ADMIN_TOKEN)[0] == 404  # token from env works
    cli = subprocess.run([sys.executable, "-m", "tidemq.cli.main", "-v", "-b", b.addr, "topic", "list"],
                         capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                         env={"PYTHONPATH": REPO_ROOT, "PATH": "/usr/bin:/bin",
                              "TIDEMQ_ACCESS_KEY": "alice",
                              "TIDEMQ_SECRET_KEY": "bad-" + SECRET_ALICE})
    assert cli.returncode == 1 and "[ACL]" in cli.stderr
    b.stop()
    outputs = {"broker log": b.log_text(), "/config": config, "/metrics": metrics,
               "client log": caplog.text, "errors": " ".join(messages),
               "cli": cli.stdout + cli.stderr}
    for where, text in outputs.items():
        for secret in (SECRET_ALICE, SECRET_ADMIN, ADMIN_TOKEN, ZK_PASSWORD):
            assert secret not in text, f"a secret leaked into the {where}"
