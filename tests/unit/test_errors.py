"""Errors cross process boundaries (Ray pickles them) intact."""

import pickle

from raysim.errors import ClientError, ConfigError


def test_config_and_client_errors_survive_pickling():
    config = pickle.loads(pickle.dumps(ConfigError(["a.b: bad", "c: worse"], "job.yaml")))
    assert config.problems == ["a.b: bad", "c: worse"] and "job.yaml" in str(config)
    client = pickle.loads(pickle.dumps(ClientError(3, 7, "client_update", ValueError("boom"))))
    assert (client.client_id, client.round_num, client.stage) == (3, 7, "client_update")
    assert isinstance(client.cause, ValueError) and "boom" in str(client)


def test_an_unpicklable_client_exception_still_reaches_the_driver():
    from raysim.runtime.wire import shippable

    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(f"{a}/{b}")
            self.lock = __import__("threading").Lock()  # not picklable

    shipped = shippable(Odd(1, 2))
    again = pickle.loads(pickle.dumps(shipped))
    assert "Odd: 1/2" in str(again) and "Traceback" not in str(type(again))
