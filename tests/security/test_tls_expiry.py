"""The certificate a broker serves is checked at start: an expired one, or one expiring within
30 days, gets a WARNING line (the ssl module loads it silently), and its notAfter is the
metric tidemq_tls_cert_not_after_timestamp_seconds (alert rules: deploy/prometheus)."""
import calendar
import os
import re
import subprocess
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.security.conftest import tls_settings

METRIC = "tidemq_tls_cert_not_after_timestamp_seconds"
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(args, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _self_signed(directory, start: str, end: str) -> dict:
    """A self-signed server certificate valid from `start` to `end` (YYYYMMDDHHMMSSZ):
    `openssl ca` is what takes explicit dates, past ones included."""
    d = str(directory)
    os.makedirs(os.path.join(d, "db"), exist_ok=True)
    open(os.path.join(d, "db", "index.txt"), "w").close()
    with open(os.path.join(d, "db", "serial"), "w") as f:
        f.write("01\n")
    with open(os.path.join(d, "ca.cnf"), "w") as f:
        f.write("[ca]\ndefault_ca = d\n[d]\ndatabase = db/index.txt\nnew_certs_dir = db\n"
                "serial = db/serial\ndefault_md = sha256\npolicy = p\nunique_subject = no\n"
                "[p]\ncommonName = supplied\n")
    _openssl(["req", *_KEY, "-keyout", "server.key", "-out", "server.csr",
              "-subj", "/CN=tidemq-node"], d)
    _openssl(["ca", "-batch", "-selfsign", "-config", "ca.cnf", "-keyfile", "server.key",
              "-in", "server.csr", "-out", "server.pem", "-startdate", start, "-enddate", end], d)
    pem = os.path.join(d, "server.pem")
    return {"server_cert": pem, "server_key": os.path.join(d, "server.key"), "ca_cert": pem}


def _metric(admin_url: str) -> float | None:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        if fam.name == METRIC:
            return fam.samples[0].value
    return None


def _cert_lines(log_text: str, level: str) -> list[str]:
    return [ln for ln in log_text.splitlines() if f" {level} " in ln and "TLS certificate" in ln]


def test_expired_certificate_warns_at_start_and_shows_in_the_metric(broker_factory, tmp_path):
    certs = _self_signed(tmp_path / "expired", "20200101000000Z", "20200201000000Z")
    b = broker_factory(*tls_settings(certs)).start()
    warnings = _cert_lines(b.log_text(), "WARNING")
    assert len(warnings) == 1 and "EXPIRED on 2020-02-01 00:00:00 UTC" in warnings[0], warnings
    assert _metric(b.admin_url) == calendar.timegm((2020, 2, 1, 0, 0, 0))


def test_certificate_expiring_within_30_days_warns(broker_factory, tmp_path):
    end = time.time() + 10 * 86400
    certs = _self_signed(tmp_path / "soon", "20240101000000Z",
                         time.strftime("%Y%m%d%H%M%SZ", time.gmtime(end)))
    b = broker_factory(*tls_settings(certs)).start()
    warnings = _cert_lines(b.log_text(), "WARNING")
    assert len(warnings) == 1 and re.search(r"expires on .* in (9\.9|10\.0) days",
                                             warnings[0]), warnings
    assert abs(_metric(b.admin_url) - int(end)) <= 1


def test_valid_certificate_is_quiet_and_plaintext_exports_no_expiry(broker_factory, certs):
    b = broker_factory(*tls_settings(certs)).start()   # `tidemq certs`: ten years
    assert not _cert_lines(b.log_text(), "WARNING")
    assert len(_cert_lines(b.log_text(), "INFO")) == 1
    assert _metric(b.admin_url) > time.time() + 3000 * 86400
    plain = broker_factory().start()
    assert _metric(plain.admin_url) is None
