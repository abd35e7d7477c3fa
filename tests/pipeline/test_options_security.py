"""The data source's options: Kafka's names, warnings for unknown options, several topics in
one query, and reading a broker that requires TLS and ACL signatures (real broker, real
certificates, real Spark)."""
from __future__ import annotations

import pytest

from tests.pipeline.conftest import run
from tests.pipeline.test_batch_read import produce, read
from tidemq import pipeline
from tidemq.acl_signing import Credentials
from tidemq.message import Message
from tidemq.node.tools.dev_certs import make_dev_certs
from tidemq.pipeline.options import OptionsError, offsets_from_json, offsets_to_json, parse_source_options
from tidemq.producer.producer import Producer
from tidemq.security import ClientSecurity

ROOT_SECRET = "root-secret-Pq7sV1"
ACL = f'''
[[accounts]]
access_key = "root"
secret_key = "{ROOT_SECRET}"
admin = true
'''


def test_kafka_names_unknown_options_and_refusals():
    with pytest.warns(UserWarning, match="did you mean 'startingOffsets'"):
        o = parse_source_options({"broker": "h:1", "subscribe": "A,B", "maxOffsetsPerTrigger": "7",
                                  "startingOffset": "earliest", "failOnDataLoss": "true"}, True)
    assert o.topics == ("A", "B") and o.max_records_per_trigger == 7 and o.nested
    assert "'maxOffsetsPerTrigger' read as 'maxRecordsPerTrigger'" in o.notes
    with pytest.raises(OptionsError, match="failOnDataLoss"):
        parse_source_options({"broker": "h:1", "topic": "T", "failOnDataLoss": "false"}, True)
    with pytest.raises(OptionsError, match="tlsCaFile: no such file"):
        parse_source_options({"broker": "h:1", "topic": "T", "tlsCaFile": "/nonexistent/ca"}, True)
    with pytest.raises(OptionsError, match="go together"):
        parse_source_options({"broker": "h:1", "topic": "T", "tlsCertFile": __file__}, True)
    one = parse_source_options({"broker": "h:1", "topic": "T",
                                "startingOffsets": '{"b": {"0": 3}}'}, False)
    assert one.starting == {("T", "b", 0): 3} and not one.nested
    several = parse_source_options({"broker": "h:1", "topic": "T,U",
                                    "startingOffsets": '{"U": {"b": {"1": 4}}}'}, False)
    assert several.starting == {("U", "b", 1): 4}
    offsets = {("T", "b", 0): 5, ("U", "b", 1): 6}
    assert offsets_from_json(offsets_to_json(offsets, True), ("T", "U")) == offsets
    assert offsets_to_json({("T", "b", 0): 5}) == {"b": {"0": 5}}   # one topic: the old form


def test_register_is_what_makes_the_format_known(spark):
    assert pipeline.register(spark) is spark   # idempotent on a session that has it


def test_one_query_reads_several_topics(spark, broker):
    first = run(produce(broker.addr, "PlMultiA", 30))
    second = run(produce(broker.addr, "PlMultiB", 20))
    rows = read(spark, broker.addr, "PlMultiA,PlMultiB").collect()
    assert len(rows) == 50
    assert {r.topic for r in rows} == {"PlMultiA", "PlMultiB"}
    got_a = {(r.queue_id, r.queue_offset) for r in rows if r.topic == "PlMultiA"}
    assert got_a == set(first) and len([r for r in rows if r.topic == "PlMultiB"]) == len(second)


def test_reads_a_broker_that_requires_tls_and_signatures(spark, broker_factory, tmp_path):
    certs = make_dev_certs(str(tmp_path / "certs"))
    acl = tmp_path / "acl.toml"
    acl.write_text(ACL)
    acl.chmod(0o600)
    b = broker_factory("security.tls_enable=true", f"security.tls_cert_file={certs['server_cert']}",
                       f"security.tls_key_file={certs['server_key']}",
                       f"security.tls_ca_file={certs['ca_cert']}", "security.acl_enable=true",
                       f"security.acl_file={acl}").start()
    sec = ClientSecurity(credentials=Credentials("root", ROOT_SECRET), tls_ca_file=certs["ca_cert"])

    async def send():
        async with Producer("pl-secure-p", b.addr, security=sec) as p:
            for i in range(12):
                assert (await p.send(Message("PlSecure", b"s-%d" % i))).ok
    run(send())
    creds = tmp_path / "creds.toml"
    creds.write_text(f'access_key = "root"\nsecret_key = "{ROOT_SECRET}"\n')
    df = read(spark, b.addr, "PlSecure", tlsCaFile=certs["ca_cert"], credentialsFile=str(creds))
    assert sorted(bytes(r.body) for r in df.collect()) == sorted(b"s-%d" % i for i in range(12))
    with pytest.raises(Exception):  # noqa: B017 (Spark wraps the refusal in its own error)
        read(spark, b.addr, "PlSecure").count()
