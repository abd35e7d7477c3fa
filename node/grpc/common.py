"""Small helpers every gRPC service module uses: Status values, the caller's client id, and the
answer to request bytes that do not parse."""
from __future__ import annotations

import grpc

from tidemq.node.grpc import proto as pb

CLIENT_ID_KEY = "x-mq-client-id"


def status(code: int, message: str = "OK"):
    return pb.Status(code=code, message=message)


def client_id_of(context) -> str:
    """The x-mq-client-id metadata the SDKs send ("" when absent)."""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_KEY:
            return value
    return ""


async def reject_malformed(context) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed request")
