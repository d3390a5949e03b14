"""Byzantine robustness: aggregation rules that tolerate malicious updates, and the attacks that
test them (docs/robustness.md).

The round keeps every update of a ``WeightedMean`` plugin's clients (``raysim.gathered_updates``,
the contract's law); the driver stacks them and applies the job's ``robust`` rule (``rules``,
``release``). The ``attack``'s malicious clients are a pure function of the seed (``attacks``):
their updates are changed on their worker (sign flip, scaling, Gaussian), their batches' labels
flipped (``raysim.data.augment``), or their rows replaced on the driver, where every benign update
of the round is seen (ALIE).
"""
