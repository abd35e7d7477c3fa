"""The error catalogue (client.errors)."""
import pytest

from tidemq import errors
from tidemq.protocol.codes import ResponseCode


@pytest.mark.parametrize("code,cls,retriable,refresh", [
    (1, errors.SystemError, True, False),
    (2, errors.SystemBusy, True, False),
    (3, errors.RequestCodeNotSupported, False, False),
    (13, errors.MessageIllegal, False, False),
    (14, errors.ServiceNotAvailable, True, True),
    (16, errors.NoPermission, False, True),
    (17, errors.TopicNotExist, False, True),
    (22, errors.QueryNotFound, False, False),
    (25, errors.SubscriptionNotLatest, True, False),
    (26, errors.SubscriptionGroupNotExist, False, False),
    (215, errors.FlowControl, True, False),
])
def test_codes_map_to_classes(code, cls, retriable, refresh):
    exc = errors.error_for_code(code, "the remark", addr="1.2.3.4:5")
    assert type(exc) is cls
    assert exc.code == code and exc.remark == "the remark" and exc.addr == "1.2.3.4:5"
    assert exc.retriable is retriable and exc.refresh_route is refresh
    assert ResponseCode(code).name in str(exc) and "the remark" in str(exc)
    assert isinstance(exc, errors.BrokerError) and isinstance(exc, errors.TideMQError)


def test_unknown_code_keeps_its_number():
    exc = errors.error_for_code(9999, None)
    assert type(exc) is errors.BrokerError and exc.code == 9999 and not exc.retriable


def test_success_is_not_an_error():
    with pytest.raises(AssertionError):
        errors.error_for_code(0)


def test_transport_errors_are_retriable_and_maybe_stored():
    assert errors.RequestTimeout().retriable and errors.RequestTimeout().maybe_stored
    cut = errors.ConnectionError("cut", written=True)
    assert cut.retriable and cut.refresh_route and cut.maybe_stored
    refused = errors.ConnectionError("refused", written=False)
    assert refused.retriable and not refused.maybe_stored
    assert not errors.SystemBusy().maybe_stored
