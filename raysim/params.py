"""State-dict arithmetic on (nested) dicts of tensors.

Updates may nest one dict inside another (SCAFFOLD sends ``{"delta": ..., "dc": ...}``); every
function here maps over the leaves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from raysim.types import NumpyParams, Params

Tree = Any  # a tensor, or a dict of trees


def tree_map(fn: Callable[..., torch.Tensor], tree: Tree, *rest: Tree) -> Tree:
    """Applies ``fn`` leaf-wise over trees of the same structure."""
    if isinstance(tree, dict):
        return {k: tree_map(fn, v, *(r[k] for r in rest)) for k, v in tree.items()}
    return fn(tree, *rest)


def model_params(model: nn.Module) -> Params:
    """The tensors that travel: trainable parameters and float buffers (BatchNorm statistics).

    Frozen parameters (a pretrained backbone under LoRA) stay on the workers and never travel.
    Tied weights (an LM's shared embedding and output layer) travel once, under their first name.
    """
    params = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    saved = model.state_dict(keep_vars=True)  # non-persistent buffers (rotary tables) stay home
    buffers = {name: b for name, b in model.named_buffers() if b.is_floating_point() and name in saved}
    return params | buffers


def clone(params: Params, dtype: torch.dtype | None = None) -> Params:
    """Detached CPU copies, optionally cast."""
    return {k: v.detach().to("cpu", dtype=dtype or v.dtype, copy=True) for k, v in params.items()}


def to_numpy(params: Params | NumpyParams) -> NumpyParams:
    """CPU numpy arrays for the object store (numpy is zero-copy in Ray; tensors are not)."""
    return {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v for k, v in params.items()}


def from_numpy(params: NumpyParams) -> Params:
    """Tensors sharing memory with (possibly read-only) numpy arrays; copy before writing."""
    return {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}


@torch.no_grad()
def load_into(model: nn.Module, params: NumpyParams | Params) -> None:
    """Copies ``params`` into the model's tensors in place: no allocation, no rebuild.

    ``params`` must cover every tensor that travels (``model_params``), so nothing a previous
    client trained survives into the next one.
    """
    own = model.state_dict()
    unknown = set(params) - set(own)
    if unknown:
        raise KeyError(f"params not in the model: {sorted(unknown)[:5]}")
    uncovered = set(model_params(model)) - set(params)
    if uncovered:
        raise KeyError(f"params leave model tensors unset: {sorted(uncovered)[:5]}")
    for name, value in params.items():
        own[name].copy_(torch.as_tensor(value))


def to_device(tree: Any, device: torch.device | str) -> Any:
    """``tree`` with every tensor and numpy array leaf as a tensor on ``device``.

    Dicts, lists and tuples are walked; other leaves (numbers, strings) are kept. Arrays on the
    CPU device share memory with the array: read them, never write them.
    """
    if isinstance(tree, (torch.Tensor, np.ndarray)):
        return torch.as_tensor(tree).to(device)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_device(v, device) for v in tree)
    return tree


def delta(global_params: Params, local_params: Params) -> Params:
    """``global - local`` (the project's sign convention), in float32."""
    return {
        k: global_params[k].to(local_params[k].device, torch.float32) - local_params[k].float()
        for k in global_params
    }


def zeros_like(params: Params, dtype: torch.dtype | None = None) -> Params:
    return {k: torch.zeros_like(v, dtype=dtype or v.dtype) for k, v in params.items()}


def to_cpu(obj: Any) -> Any:
    """A copy of ``obj`` with every tensor moved to the CPU: dicts, lists, tuples, dataclasses."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: to_cpu(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        )
    return obj


def tensor_leaves(obj: Any, name: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) of every tensor in dicts, lists, tuples and dataclasses, depth first.

    A path reads like ``delta/1.weight`` (dict keys and list indices joined by ``/``).
    """
    if isinstance(obj, torch.Tensor):
        yield name, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from tensor_leaves(value, f"{name}/{key}" if name else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensor_leaves(value, f"{name}/{i}" if name else str(i))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from tensor_leaves(getattr(obj, f.name), f"{name}/{f.name}" if name else f.name)


def _float_leaves(tree: Any) -> list[tuple[str, torch.Tensor]]:
    return [(k, t) for k, t in tensor_leaves(tree) if t.is_floating_point() or t.is_complex()]


_NARROW_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _finite_flag(t: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor on ``t``'s device: whether ``t`` holds no NaN and no infinity.

    For floats of up to 32 bits the float64 sum is finite exactly when every element is (NaN and
    infinity propagate; n finite elements sum to at most n * 3.4e38, far below float64's 1.8e308),
    and it reads the tensor once without allocating a mask. Wider types are checked element-wise.
    """
    if t.dtype in _NARROW_FLOATS:
        return torch.isfinite(t.sum(dtype=torch.float64))
    return torch.isfinite(t).all()


@torch.no_grad()
def is_finite(tree: Any) -> bool:
    """Whether no floating-point tensor in ``tree`` holds a NaN or an infinity.

    One reduction per tensor, on the tensor's device; the flags are combined there, so the
    answer costs one device-to-host sync however many tensors the tree holds.
    """
    flags = [_finite_flag(t) for _, t in _float_leaves(tree)]
    if not flags:
        return True
    device = flags[0].device
    return bool(torch.stack([f.to(device) for f in flags]).all())


@torch.no_grad()
def nonfinite_names(tree: Any) -> list[str]:
    """The paths (``tensor_leaves``) of the tensors that hold a NaN or an infinity.

    One sync per tensor: for error messages, after ``is_finite`` said no.
    """
    return [name for name, t in _float_leaves(tree) if not bool(torch.isfinite(t).all())]


def num_bytes(tree: Tree) -> int:
    """Bytes of all tensor or array leaves."""
    if isinstance(tree, dict):
        return sum(num_bytes(v) for v in tree.values())
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, np.ndarray):
        return int(tree.nbytes)
    return 0


def num_elements(params: Params) -> int:
    return sum(v.numel() for v in params.values())


# What torch.load(weights_only=True) reads back: state made of anything else saves, then fails to load.
_LOADABLE = (torch.Tensor, int, float, bool, str, bytes, complex, type(None))


def check_loadable(tree: Any, where: str) -> None:
    """Raises TypeError naming the first value a weights-only load would refuse.

    Plugin state (``ServerState.extra``, client state) must be tensors, numbers, strings and
    dicts / lists / tuples / sets of them; convert numpy arrays with ``torch.from_numpy``.
    """
    if isinstance(tree, dict):
        for key, value in tree.items():
            check_loadable(key, f"{where} key")
            check_loadable(value, f"{where}[{key!r}]")
    elif isinstance(tree, (list, tuple, set)):
        for i, value in enumerate(tree):
            check_loadable(value, f"{where}[{i}]")
    elif not isinstance(tree, _LOADABLE):
        raise TypeError(
            f"{where} is a {type(tree).__module__}.{type(tree).__name__}; state must hold "
            f"only tensors, numbers, strings and dicts/lists/tuples/sets of them"
        )
