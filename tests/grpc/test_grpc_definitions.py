"""TideMQ's own protobuf definitions (node/grpc/proto.py) agree with the official SDK's
generated descriptors on every field they declare: name, number, type, label and presence."""
from __future__ import annotations

import json
import subprocess

from tests.grpc.conftest import _require_sdk, rmq5_python
from tests.support.broker_proc import REPO_ROOT

COMPARE = r"""
import importlib.util, json, os, sys
# our definitions, loaded by path: this interpreter has the official SDK, not TideMQ
spec = importlib.util.spec_from_file_location(
    "ours", os.path.join(sys.argv[1], "node", "grpc", "proto.py"))
ours = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ours)
from rocketmq.grpc_protocol import definition_pb2, service_pb2
problems, fields = [], 0
for name, cls in ours._TYPES.items():
    theirs = getattr(definition_pb2, name, None) or getattr(service_pb2, name, None)
    if theirs is None:
        problems.append(f"{name}: not in the SDK"); continue
    if hasattr(cls, "DESCRIPTOR"):
        td = theirs.DESCRIPTOR
        for f in cls.DESCRIPTOR.fields:
            fields += 1
            g = td.fields_by_name.get(f.name)
            # Status.code and UA.language are declared int32 here: an enum's wire form
            same_type = g is not None and (g.type == f.type or {g.type, f.type} == {5, 14})
            if not (same_type and g.number == f.number and g.is_repeated == f.is_repeated
                    and g.has_presence == f.has_presence):
                problems.append(f"{name}.{f.name}")
    else:
        for v in cls.values:
            tv = theirs.DESCRIPTOR.values_by_name.get(v.name)
            if tv is None or tv.number != v.number:
                problems.append(f"{name}.{v.name}")
print(json.dumps({"problems": problems, "fields": fields}))
"""


def test_definitions_match_the_official_sdk():
    _require_sdk()
    out = subprocess.run([rmq5_python(), "-c", COMPARE, REPO_ROOT], capture_output=True,
                         timeout=120, check=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["problems"] == [] and result["fields"] >= 140, result
