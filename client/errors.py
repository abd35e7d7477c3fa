"""The SDK's one catalogue of errors: broker response codes -> exception classes.

Callers branch on three class (or instance) attributes, in the style of aiokafka's errors:

    retriable       trying the same request again (maybe elsewhere) may succeed
    refresh_route   the route is stale: fetch it again before the next attempt
    maybe_stored    the request may have taken effect although no success was seen
                    (timeouts, connections cut after the write): never count it acknowledged

Rules:
1. Every non-success response code maps to exactly one class through `error_for_code`; a code
   without its own class gets `BrokerError` with that code, so nothing is lost.
2. Send statuses FLUSH_DISK_TIMEOUT (10), SLAVE_NOT_AVAILABLE (11) and FLUSH_SLAVE_TIMEOUT (12)
   are not errors: the broker stored the message but could not confirm it, so a send returns a
   `SendResult` whose status says "maybe stored" (see the producer's SendStatus).
3. Pull statuses 19/20/21 and "no offset" (22 on QUERY_CONSUMER_OFFSET) are outcomes, handled
   where they occur; 22 anywhere else is `QueryNotFound`.
4. Which codes are retriable follows the Java producer (`retryResponseCodes` in
   DefaultMQProducer.java: 1, 14, 17, 204, 205, and transport failures) plus SYSTEM_BUSY and
   FLOW_CONTROL, overload answers by definition. NO_PERMISSION is not retried, but refreshes
   the route: after a fail-over an old master answers it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tidemq.protocol.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.protocol.remoting import RemotingCommand


class TideMQError(Exception):
    """Base of every error the SDK raises."""

    code: int | None = None
    retriable: bool = False
    refresh_route: bool = False
    maybe_stored: bool = False

    def __init__(self, message: str = "", *, code: int | None = None, remark: str | None = None,
                 addr: str | None = None) -> None:
        super().__init__(message or remark or self.__class__.__name__)
        if code is not None:
            self.code = code
        self.remark = remark
        self.addr = addr


# ----------------------------------------------------------------------- client-side errors

class ClientStateError(TideMQError):
    """The client is not started, or already shut down (a usage error)."""


class IllegalArgument(TideMQError):
    """Bad input caught before anything was sent: empty topic, oversized body, bad queue."""


class FilterNotSupported(TideMQError):
    """A subscription's filter type (SQL92) that a broker of its topic will not evaluate:
    property filtering is off there, or the broker predates it. Not retriable."""


class ConnectionError(TideMQError):  # noqa: A001 - the catalogue's name for transport failures
    """The connection failed or was cut. If the request had been written, it may be stored."""

    retriable = True
    refresh_route = True

    def __init__(self, message: str = "", *, addr: str | None = None,
                 written: bool = True) -> None:
        super().__init__(message, addr=addr)
        self.maybe_stored = written


class RequestTimeout(TideMQError):
    """No reply within the request timeout. The request may still take effect."""

    retriable = True
    maybe_stored = True


class ProtocolViolation(TideMQError):
    """The peer sent bytes or fields we cannot understand; the connection is closed."""

    retriable = True
    refresh_route = True
    maybe_stored = True


class NoRouteError(TideMQError):
    """No writable (or readable) queue is known for the topic."""

    retriable = True
    refresh_route = True


# ----------------------------------------------------------------------- broker responses

class BrokerError(TideMQError):
    """A non-success response. `code` is the response code, `remark` the broker's text."""


class SystemError(BrokerError):  # noqa: A001 - RocketMQ's SYSTEM_ERROR
    code = ResponseCode.SYSTEM_ERROR
    retriable = True


class SystemBusy(BrokerError):
    code = ResponseCode.SYSTEM_BUSY
    retriable = True


class RequestCodeNotSupported(BrokerError):
    code = ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class TransactionFailed(BrokerError):
    code = ResponseCode.TRANSACTION_FAILED


class MessageIllegal(BrokerError):
    code = ResponseCode.MESSAGE_ILLEGAL


class ServiceNotAvailable(BrokerError):
    code = ResponseCode.SERVICE_NOT_AVAILABLE
    retriable = True
    refresh_route = True  # a broker that stopped taking writes (slave, shutting down)


class VersionNotSupported(BrokerError):
    code = ResponseCode.VERSION_NOT_SUPPORTED


class NoPermission(BrokerError):
    code = ResponseCode.NO_PERMISSION
    refresh_route = True


class TopicNotExist(BrokerError):
    code = ResponseCode.TOPIC_NOT_EXIST
    refresh_route = True


class TopicExistAlready(BrokerError):
    code = ResponseCode.TOPIC_EXIST_ALREADY


class QueryNotFound(BrokerError):
    code = ResponseCode.QUERY_NOT_FOUND


class SubscriptionParseFailed(BrokerError):
    code = ResponseCode.SUBSCRIPTION_PARSE_FAILED


class SubscriptionNotExist(BrokerError):
    code = ResponseCode.SUBSCRIPTION_NOT_EXIST
    retriable = True  # the next heartbeat registers it


class SubscriptionNotLatest(BrokerError):
    code = ResponseCode.SUBSCRIPTION_NOT_LATEST
    retriable = True


class SubscriptionGroupNotExist(BrokerError):
    code = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


class NoBuyerId(BrokerError):
    code = ResponseCode.NO_BUYER_ID
    retriable = True


class NotInCurrentUnit(BrokerError):
    code = ResponseCode.NOT_IN_CURRENT_UNIT
    retriable = True


class ConsumerNotOnline(BrokerError):
    code = ResponseCode.CONSUMER_NOT_ONLINE


class ConsumeMessageTimeout(BrokerError):
    code = ResponseCode.CONSUME_MSG_TIMEOUT


class NoMessage(BrokerError):
    code = ResponseCode.NO_MESSAGE


class FlowControl(BrokerError):
    code = ResponseCode.FLOW_CONTROL
    retriable = True


_BY_CODE: dict[int | None, type[BrokerError]] = {cls.code: cls for cls in (
    SystemError, SystemBusy, RequestCodeNotSupported, TransactionFailed, MessageIllegal,
    ServiceNotAvailable, VersionNotSupported, NoPermission, TopicNotExist, TopicExistAlready,
    QueryNotFound, SubscriptionParseFailed, SubscriptionNotExist, SubscriptionNotLatest,
    SubscriptionGroupNotExist, NoBuyerId, NotInCurrentUnit, ConsumerNotOnline,
    ConsumeMessageTimeout, NoMessage, FlowControl)}


def error_class_for_code(code: int) -> type[BrokerError]:
    return _BY_CODE.get(code, BrokerError)


def error_for_code(code: int, remark: str | None = None, *, addr: str | None = None,
                   what: str | None = None) -> BrokerError:
    """The exception for a non-success response `code`, with the broker's remark."""
    assert code != ResponseCode.SUCCESS, "SUCCESS is not an error"
    cls = _BY_CODE.get(code, BrokerError)
    try:
        name = ResponseCode(code).name
    except ValueError:
        name = "UNKNOWN"
    where = f" from {addr}" if addr else ""
    text = f"{what + ': ' if what else ''}{name} ({code}){where}: {remark or 'no remark'}"
    return cls(text, code=code, remark=remark, addr=addr)


def error_for_response(response: RemotingCommand, *, addr: str | None = None,
                       what: str | None = None) -> BrokerError:
    return error_for_code(response.code, response.remark, addr=addr, what=what)
