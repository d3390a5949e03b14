"""Update compression (docs/communication.md): encoders that turn a client's parameter delta into
fewer bytes, and the worker's side that applies them (``upload``).

``codec`` states the protocol (``Encoder.encode(tensor, memory, generator) -> Encoded``), the
error-feedback wrapper and the tree-wide ``encode_tree``; ``sparse`` holds top-k and random-k,
``quantize`` QSGD and the scaled sign, ``lowrank`` PowerSGD.
"""
