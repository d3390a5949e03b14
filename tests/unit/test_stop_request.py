"""A stop request noted once and honoured where the run can stop; one wrapped by Python handed on."""

import pytest

from raysim.stop_request import clear_stop_request, honour_stop_request, note_stop_request, raise_stop_request


def test_a_noted_stop_is_honoured_with_its_exit_code_until_cleared():
    honour_stop_request()  # nothing asked: nothing happens
    try:
        note_stop_request(143)
        note_stop_request(130)  # the first request's code stands
        with pytest.raises(SystemExit) as stop:
            honour_stop_request()
        assert stop.value.code == 143
    finally:
        clear_stop_request()
    honour_stop_request()


class _Stops:
    def __set_name__(self, owner, name):
        raise SystemExit(143)


def test_a_stop_wrapped_by_python_in_a_class_body_is_raised_as_itself():
    try:  # Python 3.11 hands it on as RuntimeError("Error calling __set_name__ ..."), 3.12 as is

        class Built:
            field = _Stops()

    except BaseException as landed:  # noqa: BLE001 (the point is what arrives)
        arrived = landed
    with pytest.raises(SystemExit):
        raise_stop_request(arrived)
    raise_stop_request(RuntimeError("an error of the client's own"))  # no stop: nothing raised
