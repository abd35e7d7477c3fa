"""The `tidemq` data source's options, parsed and checked once, every problem reported together.
Pure: no Spark, no sockets.

Spark hands options over as a case-insensitive dict of strings (keys are looked up here in
lower case: `dict(options)` would lower-case them anyway).

| option | default | meaning |
|---|---|---|
| `namesrv` | | name servers "host:port;host:port" (cluster mode) |
| `broker` | | a standalone broker "host:port" (it answers route queries itself) |
| `topic` | (required) | the topic |
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
| `sinkBatchSize` | 256 | writer: messages per batch send (also bounded to ~1 MiB) |
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

EARLIEST, LATEST = -2, -1


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
    raw: dict = field(default_factory=dict, compare=False, repr=False)


def _get(options, name: str):
    """Case-insensitive lookup that works on a plain dict as on Spark's CaseInsensitiveDict."""
    if name in options:
        return options[name]
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return v
    return None


def parse_offsets_spec(text: str, problems: list[str], name: str, allowed: tuple[str, ...]):
    text = text.strip()
    if text.lower() in allowed:
        return text.lower()
    try:
        data = json.loads(text)
    except ValueError:
        problems.append(f"{name}: expected {', '.join(allowed)} or JSON "
                        f'{{"broker-a": {{"0": 12}}}}, got {text!r}')
        return None
    out = {}
    if not isinstance(data, dict):
        problems.append(f"{name}: JSON must be an object of broker groups")
        return None
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
            out[(str(broker), q)] = o
    return out


def parse_source_options(options, streaming: bool) -> SourceOptions:
    """SourceOptions, or OptionsError listing every problem (nothing is contacted)."""
    p: list[str] = []
    namesrv, broker = _get(options, "namesrv"), _get(options, "broker")
    if bool(namesrv) == bool(broker):
        p.append("set exactly one of 'namesrv' (name servers) and 'broker' (a standalone broker)")
    addrs = (namesrv or broker or "").strip()
    for a in filter(None, (x.strip() for x in addrs.split(";"))):
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            p.append(f"address {a!r}: expected host:port")
    topic = (_get(options, "topic") or "").strip()
    if not topic:
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

    start_text = _get(options, "startingOffsets")
    starting = (parse_offsets_spec(start_text, p, "startingOffsets", ("earliest", "latest", "group"))
                if start_text else ("latest" if streaming else "earliest"))
    end_text = _get(options, "endingOffsets")
    ending = parse_offsets_spec(end_text, p, "endingOffsets", ("latest",)) if end_text else "latest"
    if streaming and (end_text or _get(options, "endingTimestamp")):
        p.append("endingOffsets / endingTimestamp apply to batch reads only")
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
        sink_batch_size=int_opt("sinkBatchSize", 256),
        raw={k: v for k, v in options.items()})
    if not out.group:
        p.append("group must not be empty")
    if p:
        raise OptionsError(p)
    return out


def offsets_to_json(offsets: dict) -> dict:
    """{(broker, queue): offset} -> {"broker": {"queue": offset}} (Spark's offset JSON)."""
    out: dict = {}
    for (broker, qid), off in sorted(offsets.items()):
        out.setdefault(broker, {})[str(qid)] = int(off)
    return out


def offsets_from_json(data) -> dict:
    """The inverse of offsets_to_json; accepts the JSON text or the parsed dict."""
    if isinstance(data, str):
        data = json.loads(data)
    return {(str(b), int(q)): int(o) for b, queues in data.items() for q, o in queues.items()}
