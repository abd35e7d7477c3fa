"""The request layer: every request code the broker serves, declared once (table.py), turned
from a frame into a typed request once (parse.py), before the ACL and the processor run.

    from tidemq.node.requests import RequestError, SPECS, parse_request
    req = parse_request(cmd)       # RequestError(code, remark): refused, nothing ran
    req.topic, req.queue_id        # typed values; the ACL reads the same object

Both the ACL (node/security/acl/resources.py) and the processors read only the typed request, never
`cmd.ext` (the signature check excepted: it covers the raw fields).
"""
from tidemq.node.requests.fields import RequestError
from tidemq.node.requests.parse import PARSERS, parse_request
from tidemq.node.requests.table import GROUP, SPECS, TOPIC, Spec

__all__ = ["GROUP", "PARSERS", "RequestError", "SPECS", "Spec", "TOPIC", "parse_request"]
