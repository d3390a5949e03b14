"""Whether a model can train vectorized (``raysim.train.vectorized``), and if not, why.

``vectorization_blocker`` names the first thing in the way: a module drawing random masks per
client (other than ``nn.Dropout``, whose masks ``raysim.train.hashed_dropout`` draws), a forward
or backward that does not run under ``vmap`` (a branch on the data, BatchNorm's cumulative
average), or trainable parameters the forward never uses (``torch.func.grad`` gives them zeros
that weight decay and Adam would act on, where ``torch.optim`` skips a parameter without a
gradient).

Usage:
    if (blocker := vectorization_blocker(model, x[:2])) is not None:
        raise ConfigError([f"... {blocker}"])
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from raysim.train.hashed_dropout import HashedDropout

Stacked = dict[str, torch.Tensor]  # per name, one tensor of shape [clients, ...]

_RANDOM_MODULES = (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def vectorization_blocker(model: nn.Module, example: torch.Tensor | None = None) -> str | None:
    """Why ``model`` cannot train vectorized (None: it can): names the first module in the way.

    With ``example`` (a few input rows) it also runs the model's forward and backward in train
    mode for two clients under ``vmap``, which refuses every random draw but ``nn.Dropout``'s
    hashed ones (HuggingFace attention's ``dropout_p``, which no module type shows) and every
    operation ``vmap`` cannot batch, and one plain backward that finds the unused parameters.
    """
    for name, module in model.named_modules():
        if isinstance(module, _RANDOM_MODULES) and module.p > 0:
            return f"module {name!r} ({type(module).__name__}) draws random masks per client"
        if isinstance(rate := getattr(module, "dropout", None), float) and rate > 0:  # F.dropout inside
            return f"module {name!r} ({type(module).__name__}) applies dropout"
    if example is None:
        return None
    was_training = model.training
    try:
        return _vmap_blocker(model, example) or _unused_blocker(model, example)
    finally:
        model.train(was_training)


def _vmap_blocker(model: nn.Module, example: torch.Tensor) -> str | None:
    """Why two clients' forward and backward on ``example`` do not run under ``vmap(grad)``."""
    dropout = HashedDropout(model)
    params, buffers = _copies(model, 2, trainable=True), _copies(model, 2, trainable=False)

    def summed_output(params: Stacked, buffers: Stacked, x: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        dropout.begin_forward(key)
        return functional_call(model, (params, buffers), (x,), strict=False).float().sum()

    model.train()
    try:
        for _ in dropout.over(iter([(0,)])):
            keys = torch.arange(2, device=example.device)
            examples = example.expand(2, *example.shape)
            vmap(grad(summed_output), randomness="error")(params, buffers, examples, keys)
    except Exception as exc:  # whatever vmap cannot batch; the message says what
        if "randomness" in str(exc):
            return "its forward draws random numbers other than nn.Dropout's (dropout inside a forward)"
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"its forward or backward does not run under vmap: {first_line}"
    return None


def _unused_blocker(model: nn.Module, example: torch.Tensor) -> str | None:
    """Names the trainable parameters the forward on ``example`` never uses (eval mode: no
    random draw, no statistics written)."""
    params = {k: p.detach().clone().requires_grad_() for k, p in model.named_parameters() if p.requires_grad}
    if not params:
        return None
    buffers = {k: b.clone() for k, b in model.named_buffers()}
    model.eval()
    outputs = functional_call(model, (params, buffers), (example,), strict=False)
    grads = torch.autograd.grad(outputs.float().sum(), list(params.values()), allow_unused=True)
    unused = [name for name, g in zip(params, grads, strict=True) if g is None]
    if not unused:
        return None
    return (
        f"its forward never uses the trainable parameters {', '.join(unused)} (freeze them with "
        "requires_grad_(False) or remove them)"
    )


def _copies(model: nn.Module, clients: int, *, trainable: bool) -> Stacked:
    """``clients`` stacked copies of the model's trainable parameters (or of its buffers)."""
    tensors: dict[str, torch.Tensor] = dict(model.named_buffers())
    if trainable:
        tensors = {k: p for k, p in model.named_parameters() if p.requires_grad}
    return {k: torch.stack([t.detach()] * clients) for k, t in tensors.items()}
