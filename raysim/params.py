"""State-dict arithmetic, and maps over trees of tensors.

A tree (``raysim.types.Tree``) nests dicts, lists, tuples and dataclasses around its leaves:
SCAFFOLD's update is a frozen dataclass of two dicts of tensors. The tree functions here walk all
four, rebuilding a dataclass with ``dataclasses.replace`` (so a frozen one stays frozen, and fields
with ``init=False`` are recomputed rather than walked).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import torch
from torch import nn

from raysim.types import NumpyParams, Params, Tree

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from typing_extensions import TypeIs

T = TypeVar("T")


def is_dataclass_instance(obj: object) -> TypeIs[DataclassInstance]:
    """Whether ``obj`` is a dataclass instance (not a dataclass type)."""
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def tree_map(fn: Callable[..., object], tree: T, *rest: T) -> T:
    """Applies ``fn`` leaf-wise over trees of the same structure; the result has that structure.

    Dicts, lists, tuples and dataclasses are walked; anything else is a leaf. ``fn`` receives the
    leaf of ``tree`` and those of ``rest`` at the same place.
    """
    others: tuple[Any, ...] = rest  # each of tree's structure, walked alongside it
    if isinstance(tree, dict):
        return cast(T, {k: tree_map(fn, v, *(r[k] for r in others)) for k, v in tree.items()})
    if isinstance(tree, (list, tuple)):
        return cast(T, type(tree)(tree_map(fn, *branch) for branch in zip(tree, *others, strict=True)))
    if is_dataclass_instance(tree):
        names = [f.name for f in dataclasses.fields(tree) if f.init]
        walked = {k: tree_map(fn, getattr(tree, k), *(getattr(r, k) for r in others)) for k in names}
        return cast(T, dataclasses.replace(tree, **walked))
    return cast(T, fn(tree, *others))


def leaves(tree: Tree) -> Iterator[object]:
    """Every leaf of ``tree`` in order: what ``tree_map`` would call ``fn`` on."""
    if isinstance(tree, dict):
        for value in tree.values():
            yield from leaves(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from leaves(value)
    elif is_dataclass_instance(tree):
        for f in dataclasses.fields(tree):
            if f.init:
                yield from leaves(getattr(tree, f.name))
    else:
        yield tree


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


def to_device(tree: T, device: torch.device | str) -> T:
    """``tree`` with every tensor and numpy array leaf as a tensor on ``device``.

    Other leaves (numbers, strings) are kept. Arrays on the CPU device share memory with the
    array: read them, never write them.
    """

    def move(leaf: object) -> object:
        if isinstance(leaf, (torch.Tensor, np.ndarray)):
            return torch.as_tensor(leaf).to(device)
        return leaf

    return tree_map(move, tree)


def numpy_leaves(tree: T) -> T:
    """``tree`` with every tensor leaf as a numpy array (CPU), for a payload's extra: arrays cross
    to Ray workers without a copy. Typed as ``tree`` because the client reads those leaves back
    as tensors on its device (``to_device`` in the worker), which is what the plugin's type says."""
    return tree_map(
        lambda leaf: leaf.detach().cpu().numpy() if isinstance(leaf, torch.Tensor) else leaf, tree
    )


def delta(global_params: Params, local_params: Params) -> Params:
    """``global - local`` (the project's sign convention), in float32."""
    return {
        k: global_params[k].to(local_params[k].device, torch.float32) - local_params[k].float()
        for k in global_params
    }


def global_norm(params: Mapping[str, torch.Tensor], skip: Collection[str] = ()) -> float:
    """The L2 norm of every tensor in ``params`` but those named in ``skip``, as one vector.

    Every entry counts, float buffers (BatchNorm statistics) included: pass ``skip=buffer_keys``
    (``ServerState.buffer_keys``) for a norm over the parameters alone, as ``server/delta_norm``
    is. Squares are summed in float64 (a float32 square exactly), slice by slice on a CPU
    (``_sum_of_squares``), and the tensors' sums added in order, with one device-to-host transfer
    for all of them. 0.0 when nothing is left.
    """
    sums = [_sum_of_squares(v) for k, v in params.items() if k not in skip]
    if not sums:
        return 0.0
    device = sums[0].device
    return math.sqrt(sum(torch.stack([s.to(device) for s in sums]).tolist()))


# elements: a slice's float64 squares (1 MiB) stay in cache, where a whole tensor's were written and
# read back (12.8 MB for pfl's CNN's dense layer). pfl's CNN's norm, from a cold cache on the
# 2-core VM: 2.1 ms that way, 1.0 ms in slices; it is on the driver's path each round
_NORM_SLICE = 1 << 17


def _sum_of_squares(v: torch.Tensor) -> torch.Tensor:
    """``(v.double() ** 2).sum()`` as a 0-d float64 tensor on ``v``'s device: on a CPU, the sum of
    the sums of slices of ``_NORM_SLICE`` elements (the same float64 sum but for the order of its
    additions); one reduction on a GPU, whose bandwidth a whole tensor's copy does not tax."""
    v = v.detach()
    if v.device.type != "cpu" or v.numel() <= _NORM_SLICE:
        return _squared(v).sum()
    flat = v.reshape(-1)
    starts = range(0, flat.numel(), _NORM_SLICE)
    return torch.stack([_squared(flat[start : start + _NORM_SLICE]).sum() for start in starts]).sum()


def _squared(v: torch.Tensor) -> torch.Tensor:
    """``v.double() ** 2`` with one float64 tensor, not two (the same values: a square is ``x * x``)."""
    return v.to(torch.float64, copy=True).square_()


def distance(
    a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], skip: Collection[str] = ()
) -> float:
    """``||a - b||``, the ``global_norm`` of the difference over ``a``'s keys but ``skip``
    (buffers included unless skipped); the difference is taken in the tensors' own dtype."""
    return global_norm({k: a[k] - b[k] for k in a if k not in skip})


def zeros_like(params: Params, dtype: torch.dtype | None = None) -> Params:
    return {k: torch.zeros_like(v, dtype=dtype or v.dtype) for k, v in params.items()}


def to_cpu(tree: T) -> T:
    """A copy of ``tree`` with every tensor leaf moved to the CPU; other leaves are kept."""
    return tree_map(lambda leaf: leaf.cpu() if isinstance(leaf, torch.Tensor) else leaf, tree)


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


def float_leaves(tree: Any) -> list[torch.Tensor]:
    """The floating-point tensors among ``tree``'s leaves, in ``tree_map``'s order (a dataclass's
    ``init`` fields); numbers, integer tensors and arrays are left out."""
    return [t for t in leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def tree_norm(tree: Any, ord: int = 2) -> torch.Tensor:
    """The L``ord`` norm (1 or 2) of every float leaf of ``tree`` as one vector: a 0-d float64
    tensor on the first leaf's device, not read back (0 for a tree without float leaves)."""
    if ord not in (1, 2):
        raise ValueError(f"ord must be 1 (L1) or 2 (L2), got {ord}")
    # accumulated in float64 (a model's million squares in float32 lose the low digits a bound is
    # compared to), read in the leaf's dtype: no float64 copy of a per-example gradient
    norms = [torch.linalg.vector_norm(t.detach(), ord, dtype=torch.float64) for t in float_leaves(tree)]
    if not norms:
        return torch.zeros((), dtype=torch.float64)
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]), ord)  # of the leaves


def clip_factor(norm: torch.Tensor, bound: float) -> torch.Tensor:
    """``min(1, bound / norm)`` element-wise, on ``norm``'s device (1 where ``norm`` is 0)."""
    return (bound / norm.clamp(min=1e-12)).clamp(max=1.0)


def clip_tree(tree: T, bound: float, ord: int = 2) -> tuple[T, torch.Tensor]:
    """``tree`` scaled by ``clip_factor`` of its ``tree_norm``, and that norm before clipping (not
    read back). Float leaves keep their dtype and device (scaled in at least float32: a bf16
    factor would overshoot the bound); other leaves pass unchanged."""
    norm = tree_norm(tree, ord)
    factor = clip_factor(norm, bound)

    def clip(leaf: object) -> object:
        if not isinstance(leaf, torch.Tensor) or not leaf.is_floating_point():
            return leaf
        wide = torch.promote_types(leaf.dtype, torch.float32)
        return (leaf.detach().to(wide) * factor.to(leaf.device, wide)).to(leaf.dtype)

    return tree_map(clip, tree), norm


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
    answer costs one device-to-host sync however many tensors the tree holds. On the CPU, where a
    read costs nothing, each tensor is first summed in its own dtype, several times faster than a
    float32 sum into float64: a finite sum proves every element finite (NaN and infinity
    propagate), and only a sum that is not (a NaN, or finite elements overflowing) is checked
    exactly.
    """
    leaves = float_leaves(tree)
    if all(t.device.type == "cpu" for t in leaves) and all(math.isfinite(t.sum()) for t in leaves):
        return True  # one vectorized pass each, in the tensor's own dtype (below)
    flag = finite_flag(leaves)
    return True if flag is None else bool(flag)


@torch.no_grad()
def finite_flag(tree: Any) -> torch.Tensor | None:
    """``is_finite`` as a 0-d bool tensor, not yet read back (on the first tensor's device);
    None for a tree without floating-point tensors."""
    flags = [_finite_flag(t) for t in float_leaves(tree)]
    if not flags:
        return None
    device = flags[0].device
    return torch.stack([f.to(device) for f in flags]).all()


@torch.no_grad()
def nonfinite_names(tree: Any) -> list[str]:
    """The paths (``tensor_leaves``) of the tensors that hold a NaN or an infinity.

    One sync per tensor: for error messages, after ``is_finite`` said no.
    """
    return [
        name for name, t in tensor_leaves(tree) if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]


def num_bytes(tree: Tree) -> int:
    """Bytes of all tensor or array leaves."""
    total = 0
    for leaf in leaves(tree):
        if isinstance(leaf, torch.Tensor):
            total += leaf.numel() * leaf.element_size()
        elif isinstance(leaf, np.ndarray):
            total += int(leaf.nbytes)
    return total


def num_values(tree: Tree) -> int:
    """Values (elements) of all tensor or array leaves: the numbers a message carries, whatever
    their dtype (``num_bytes`` weighs them)."""
    return sum(
        leaf.numel() if isinstance(leaf, torch.Tensor) else int(leaf.size)
        for leaf in leaves(tree)
        if isinstance(leaf, (torch.Tensor, np.ndarray))
    )


def num_elements(params: Params) -> int:
    return sum(v.numel() for v in params.values())


# What torch.load(weights_only=True) reads back: state made of anything else saves, then fails to load.
_LOADABLE = (torch.Tensor, int, float, bool, str, bytes, complex, type(None))


def check_loadable(tree: object, where: str) -> None:
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


def pure_aggregate(params: Params, pseudo_grad: Params) -> Params:
    """``params - pseudo_grad`` where the pseudo-gradient has an entry: server SGD with lr 1."""
    return {k: (w - pseudo_grad[k].to(w)) if k in pseudo_grad else w for k, w in params.items()}
