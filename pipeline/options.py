"""The `tidemq` data source's options, parsed and checked once, every problem reported together.
Pure: no Spark, no sockets.

Spark hands options over as a case-insensitive dict of strings (keys are looked up here in
lower case: `dict(options)` would lower-case them anyway).

| option | default | meaning |
|---|---|---|
| `namesrv` | | name servers "host:port;host:port" (cluster mode) |
| `broker` | | a standalone broker "host:port" (it answers route queries itself) |
| `topic` | (required) | the topic, or several "a,b,c" (a read only; offsets JSON is then keyed by topic first) |
| `group` | `tidemq-spark` | consumer group: pulls carry it; a stream publishes its committed progress as this group's offsets |
| `startingOffsets` | earliest (batch), latest (stream) | `earliest`, `latest`, `group` (the group's committed offsets), or JSON `{"broker-a": {"0": 12}}` (-2 = earliest, -1 = latest) |
| `startingTimestamp` | | ms since the epoch: start at the first message stored at or after it (overrides startingOffsets) |
| `endingOffsets` | latest | batch only: `latest` or JSON as above |
| `endingTimestamp` | | batch only: end before the first message stored at or after it |
| `tags` | `*` | tag filter "a \\|\\| b" |
| `maxRecordsPerTrigger` | | stream admission control: most records per micro-batch |
| `maxRecordsPerPartition` | 500000 | a queue range larger than this is split into several Spark partitions |
| `pullBatchSize` | 1024 | most messages asked per pull (the broker also caps a reply's bytes) |
| `pullDepth` | 4 | pulls kept in flight per partition |
| `arrowBatchRows` | 10000 | rows per Arrow batch handed to Spark |
| `requestTimeoutMs` | 10000 | one broker request's timeout |
| `sinkBatchSize` | 256 | writer: messages per batch send (at most the broker's 512 and ~1 MiB: a larger value sends more batches) |
| `sinkId` | (random) | writer: stable id of a sink, for exactly-once keys across restarts |
| `tls` | false | connect with TLS (`true` with the system CAs, or give `tlsCaFile`) |
| `tlsCaFile`, `tlsCertFile`, `tlsKeyFile` | | CA to trust; client certificate and key (mutual TLS) |
| `credentialsFile` | | ACL credentials: a TOML file with access_key, secret_key (the file must exist where executors run) |

Without the TLS and credential options, TIDEMQ_TLS / TIDEMQ_TLS_CA / TIDEMQ_CREDENTIALS_FILE /
TIDEMQ_ACCESS_KEY + TIDEMQ_SECRET_KEY in the environment apply (as for the CLI).

Kafka's names are accepted where they mean the same (`subscribe` = `topic`,
`maxOffsetsPerTrigger` = `maxRecordsPerTrigger`, `failOnDataLoss=true` is what TideMQ always
does; `false` is refused). Any other unknown option raises a UserWarning naming the closest
known one: it would otherwise be silently ignored.
"""
from __future__ import annotations

import difflib
import json
import os
import warnings
from dataclasses import dataclass, field

EARLIEST, LATEST = -2, -1

KNOWN = ("namesrv", "broker", "topic", "group", "startingOffsets", "startingTimestamp",
         "endingOffsets", "endingTimestamp", "tags", "maxRecordsPerTrigger",
         "maxRecordsPerPartition", "pullBatchSize", "pullDepth", "arrowBatchRows",
         "requestTimeoutMs", "sinkBatchSize", "sinkId", "tls", "tlsCaFile", "tlsCertFile",
         "tlsKeyFile", "credentialsFile", "failOnDataLoss")
KAFKA_ALIASES = {"subscribe": "topic", "topics": "topic",
                 "maxOffsetsPerTrigger": "maxRecordsPerTrigger"}
SPARK_OWN = ("path",)   # options Spark itself may add


class OptionsError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("tidemq data source options:\n  - " + "\n  - ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class SourceOptions:
    addrs: str
    topic: str
    group: str = "tidemq-spark"
    starting: object = None  # "earliest" | "latest" | "group" | {(broker, queue): offset}
    starting_ts: int | None = None
    ending: object = "latest"
    ending_ts: int | None = None
    tags: str = "*"
    max_records_per_trigger: int | None = None
    max_records_per_partition: int = 500_000
    pull_batch_size: int = 1024
    pull_depth: int = 4
    arrow_batch_rows: int = 10_000
    request_timeout_s: float = 10.0
    sink_batch_size: int = 256
    topics: tuple = ()
    tls: bool = False
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    credentials_file: str = ""
    notes: tuple = ()         # unknown options (also warned), Kafka names read as ours
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def nested(self) -> bool:
        """Several topics: offsets JSON is {"topic": {"broker": {"queue": offset}}}."""
        return len(self.topics) > 1

    def security(self):
        """tidemq.security.ClientSecurity from the options, else from the environment."""
        from tidemq.security import ClientSecurity, from_environment, load_credentials
        if not (self.tls or self.credentials_file):
            return from_environment()
        creds = load_credentials(self.credentials_file) if self.credentials_file else None
        return ClientSecurity(credentials=creds, tls=self.tls, tls_ca_file=self.tls_ca_file,
                              tls_cert_file=self.tls_cert_file, tls_key_file=self.tls_key_file)


def _get(options, name: str):
    """Case-insensitive lookup that works on a plain dict as on Spark's CaseInsensitiveDict."""
    if name in options:
        return options[name]
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return v
    return None


def parse_offsets_spec(text: str, problems: list[str], name: str, allowed: tuple[str, ...],
                       topics: tuple = ("",)):
    """"earliest"/... or {(topic, broker, queue): offset} from the JSON form: one topic
    {"broker-a": {"0": 12}}, several {"T1": {"broker-a": {"0": 12}}, ...}."""
    text = text.strip()
    if text.lower() in allowed:
        return text.lower()
    example = '{"broker-a": {"0": 12}}' if len(topics) < 2 else '{"T1": {"broker-a": {"0": 12}}}'
    try:
        data = json.loads(text)
    except ValueError:
        problems.append(f"{name}: expected {', '.join(allowed)} or JSON {example}, got {text!r}")
        return None
    if not isinstance(data, dict):
        problems.append(f"{name}: JSON must be an object like {example}")
        return None
    if len(topics) < 2:
        return _offsets_of(topics[0], data, problems, name)
    out = {}
    for topic, groups in data.items():
        if topic not in topics or not isinstance(groups, dict):
            problems.append(f"{name}: {topic!r} is not one of the topics {list(topics)}, or not "
                            f"an object of broker groups")
            continue
        out.update(_offsets_of(topic, groups, problems, name))
    return out


def _offsets_of(topic, data: dict, problems: list[str], name: str) -> dict:
    out = {}
    for broker, queues in data.items():
        if not isinstance(queues, dict):
            problems.append(f"{name}: {broker!r} must map queue ids to offsets")
            continue
        for qid, off in queues.items():
            try:
                q, o = int(qid), int(off)
            except (TypeError, ValueError):
                problems.append(f"{name}: {broker}/{qid}: queue id and offset must be integers")
                continue
            if q < 0 or o < EARLIEST or isinstance(off, bool):
                problems.append(f"{name}: {broker}/{qid}: bad queue id or offset {off!r}")
                continue
            out[(topic, str(broker), q)] = o
    return out


def parse_source_options(options, streaming: bool) -> SourceOptions:
    """SourceOptions, or OptionsError listing every problem (nothing is contacted)."""
    p: list[str] = []
    notes = _check_names(options, p)
    options = _with_aliases(options, notes)
    namesrv, broker = _get(options, "namesrv"), _get(options, "broker")
    if bool(namesrv) == bool(broker):
        p.append("set exactly one of 'namesrv' (name servers) and 'broker' (a standalone broker)")
    addrs = (namesrv or broker or "").strip()
    for a in filter(None, (x.strip() for x in addrs.split(";"))):
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            p.append(f"address {a!r}: expected host:port")
    topic = (_get(options, "topic") or "").strip()
    topics = tuple(dict.fromkeys(t.strip() for t in topic.split(",") if t.strip()))
    if not topics:
        p.append("'topic' is required")

    def int_opt(name, default, minimum=1):
        v = _get(options, name)
        if v is None or v == "":
            return default
        try:
            n = int(v)
        except (TypeError, ValueError):
            p.append(f"{name}: expected an integer, got {v!r}")
            return default
        if n < minimum:
            p.append(f"{name}: must be >= {minimum}")
        return n

    starting, ending = _offset_range(options, p, streaming, topics or ("",))
    tags = (_get(options, "tags") or "*").strip() or "*"
    if tags != "*" and not [t for t in tags.split("||") if t.strip()]:
        p.append(f"tags: bad tag expression {tags!r}")
    out = SourceOptions(
        addrs=addrs, topic=topic, group=(_get(options, "group") or "tidemq-spark").strip(),
        starting=starting, starting_ts=int_opt("startingTimestamp", None, 0),
        ending=ending, ending_ts=int_opt("endingTimestamp", None, 0), tags=tags,
        max_records_per_trigger=int_opt("maxRecordsPerTrigger", None),
        max_records_per_partition=int_opt("maxRecordsPerPartition", 500_000),
        pull_batch_size=int_opt("pullBatchSize", 1024),
        pull_depth=int_opt("pullDepth", 4),
        arrow_batch_rows=int_opt("arrowBatchRows", 10_000),
        request_timeout_s=int_opt("requestTimeoutMs", 10_000) / 1000.0,
        sink_batch_size=int_opt("sinkBatchSize", 256), topics=topics,
        notes=tuple(notes), raw={k: v for k, v in options.items()},
        **_security_options(options, p))
    if not out.group:
        p.append("group must not be empty")
    if p:
        raise OptionsError(p)
    return out


def _offset_range(options, p: list[str], streaming: bool, topics: tuple):
    """(startingOffsets, endingOffsets) parsed; a stream has no end."""
    start_text = _get(options, "startingOffsets")
    starting = (parse_offsets_spec(start_text, p, "startingOffsets",
                                   ("earliest", "latest", "group"), topics)
                if start_text else ("latest" if streaming else "earliest"))
    end_text = _get(options, "endingOffsets")
    ending = (parse_offsets_spec(end_text, p, "endingOffsets", ("latest",), topics)
              if end_text else "latest")
    if streaming and (end_text or _get(options, "endingTimestamp")):
        p.append("endingOffsets / endingTimestamp apply to batch reads only")
    return starting, ending


def _check_names(options, problems: list[str]) -> list[str]:
    """Warnings for unknown options (with the closest known name), and Kafka's
    failOnDataLoss=false refused: a read never skips data retention deleted."""
    notes = []
    known = {k.lower(): k for k in KNOWN + tuple(KAFKA_ALIASES)}
    for key in options:
        low = key.lower()
        if low in SPARK_OWN:
            continue
        if low not in known:
            close = difflib.get_close_matches(low, list(known), n=1, cutoff=0.6)
            hint = f" (did you mean {known[close[0]]!r}?)" if close else ""
            notes.append(f"unknown option {key!r} is ignored{hint}")
    fail = _get(options, "failOnDataLoss")
    if fail is not None and str(fail).strip().lower() != "true":
        problems.append("failOnDataLoss: only true is supported (a read whose range retention "
                        "deleted fails; it is never skipped)")
    for note in notes:
        warnings.warn(f"tidemq data source: {note}", UserWarning, stacklevel=4)
    return notes


def _with_aliases(options, notes: list[str]) -> dict:
    """Kafka's option names mapped onto TideMQ's (TideMQ's own name wins when both are set)."""
    out = {k: v for k, v in options.items()}
    for alias, name in KAFKA_ALIASES.items():
        value = _get(out, alias)
        if value is not None and _get(out, name) is None:
            out[name] = value
            notes.append(f"{alias!r} read as {name!r}")
    return out


def _security_options(options, problems: list[str]) -> dict:
    tls_text = str(_get(options, "tls") or "false").strip().lower()
    if tls_text not in ("true", "false"):
        problems.append(f"tls: expected true or false, got {tls_text!r}")
    out = {"tls": tls_text == "true"}
    for opt, key in (("tlsCaFile", "tls_ca_file"), ("tlsCertFile", "tls_cert_file"),
                     ("tlsKeyFile", "tls_key_file"), ("credentialsFile", "credentials_file")):
        path = (_get(options, opt) or "").strip()
        if path and not os.path.isfile(path):
            problems.append(f"{opt}: no such file {path!r} (it must exist where the driver and "
                            f"the executors run)")
        out[key] = path
    if out["tls_ca_file"] or out["tls_cert_file"]:
        out["tls"] = True
    if bool(out["tls_cert_file"]) != bool(out["tls_key_file"]):
        problems.append("tlsCertFile and tlsKeyFile go together (mutual TLS)")
    return out


def offsets_to_json(offsets: dict, nested: bool = False) -> dict:
    """{(topic, broker, queue): offset} -> Spark's offset JSON: {"broker": {"queue": offset}}
    for one topic, {"topic": {"broker": {"queue": offset}}} for several (`nested`)."""
    out: dict = {}
    for (topic, broker, qid), off in sorted(offsets.items()):
        at = out.setdefault(topic, {}) if nested else out
        at.setdefault(broker, {})[str(qid)] = int(off)
    return out


def offsets_from_json(data, topics: tuple = ("",)) -> dict:
    """The inverse of offsets_to_json; accepts the JSON text or the parsed dict."""
    if isinstance(data, str):
        data = json.loads(data)
    if len(topics) < 2:
        return {(topics[0], str(b), int(q)): int(o)
                for b, queues in data.items() for q, o in queues.items()}
    return {(t, str(b), int(q)): int(o) for t, groups in data.items()
            for b, queues in groups.items() for q, o in queues.items()}
