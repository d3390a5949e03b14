"""FedProx on one example and two local steps, against the numpy reference.

Step 1 starts at the global model, where the proximal gradient mu (w - w0) is zero:
    w1 = w0 - lr * g(w0)
    w2 = w1 - lr * (g(w1) + mu * (w1 - w0))
"""

import numpy as np
from reference import B0, W0, context, grad, payload

from raysim import registry

X, Y, LR, MU = np.array([[1.0, -2.0]]), np.array([1]), 0.2, 0.5


def test_two_local_steps_include_the_proximal_gradient():
    entry = registry.get("algorithm", "fedprox")
    algo = entry.factory(
        entry.config.model_validate({"mu": MU, "local": {"lr": LR, "batch_size": 1, "epochs": 2}})
    )
    result = algo.client_update(context(X, Y, payload()))
    gw, gb = grad(W0, B0, X, Y)
    w1, b1 = W0 - LR * gw, B0 - LR * gb
    gw, gb = grad(w1, b1, X, Y)
    w2, b2 = w1 - LR * (gw + MU * (w1 - W0)), b1 - LR * (gb + MU * (b1 - B0))
    assert np.allclose(result.update["weight"].numpy(), W0 - w2, atol=1e-6)
    assert np.allclose(result.update["bias"].numpy(), B0 - b2, atol=1e-6)


def test_mu_zero_is_fedavg():
    def update(name, **options):
        entry = registry.get("algorithm", name)
        local = {"lr": LR, "batch_size": 1, "epochs": 2}
        algo = entry.factory(entry.config.model_validate({"local": local, **options}))
        return algo.client_update(context(X, Y, payload())).update["weight"]

    assert np.array_equal(update("fedprox", mu=0.0).numpy(), update("fedavg").numpy())
