"""A client's failure names the plugin's own line, which a Ray worker's traceback cannot carry."""

import json
import pickle

from raysim.errors import ClientError
from raysim.runtime.wire import client_failure


def plugin_step(text):
    return json.loads(text)  # the json module raises; this line is the plugin's


def test_a_failure_names_the_plugins_innermost_line_not_the_librarys():
    try:
        plugin_step("{")
    except ValueError as exc:
        failure = pickle.loads(pickle.dumps(client_failure(44, 0, exc)))  # as a Ray worker ships it
    line = plugin_step.__code__.co_firstlineno + 1
    assert failure.raised_at == f"tests/unit/runtime/test_wire.py:{line} in plugin_step"
    error = ClientError(44, 0, failure.stage, failure.error, failure.raised_at)
    assert str(error).endswith(f"(raised at tests/unit/runtime/test_wire.py:{line} in plugin_step)")
    assert pickle.loads(pickle.dumps(error)).raised_at == failure.raised_at
