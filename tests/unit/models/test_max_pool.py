"""Tests of raysim/models/max_pool.py: ``MaxPool2d`` is ``nn.MaxPool2d``, bit for bit.

The reference is torch's own module on a copy of the same input. Equality is ``torch.equal`` on
the output, its layout, and the input's gradient, in both input layouts, for the windows raysim's
models use (2x2 stride 2; AlexNet's overlapping 3x3 stride 2) and for padding, dilation and
``ceil_mode``. Ties are made on purpose: values rounded to a few levels and ReLU's zeros give
windows with several equal maxima, where the gradient must reach the same one element (the first
in scan order) as torch's; a NaN must win its window as torch's does.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from raysim.models import build_model, max_pool
from raysim.models.max_pool import MaxPool2d, fast_path_applies
from raysim.types import DataSpec

WINDOWS = [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2},
    {"kernel_size": 3, "stride": 1, "padding": 1},
    {"kernel_size": 2, "stride": 2, "dilation": 2},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": (2, 3), "stride": (1, 2), "padding": (1, 0)},
]
LAYOUTS = [torch.contiguous_format, torch.channels_last]


@pytest.fixture(autouse=True)
def copies_for_small_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies are kept for maps of 65,536 elements and more; these tests' small maps, which
    show ties and windows plainly, take them too."""
    monkeypatch.setattr(max_pool, "_SMALLEST_COPIED", 1)


def tied_maps(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """ReLU'd values on a grid of quarters: most windows hold equal maxima (zeros, or equal levels)."""
    g = torch.Generator().manual_seed(seed)
    return torch.relu(torch.round(torch.randn(shape, generator=g) * 4) / 4).to(dtype)


def pooled_and_grad(
    module: nn.Module,
    x: torch.Tensor,
    layout: torch.memory_format,
    grad_layout: torch.memory_format | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool's output on ``x`` laid out as ``layout``, and the input's gradient for a seeded
    output gradient: contiguous (as a ``Flatten`` after the pool hands it back) or ``grad_layout``."""
    leaf = x.clone().contiguous(memory_format=layout).requires_grad_()
    out = module(leaf)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    out.backward(grad if grad_layout is None else grad.contiguous(memory_format=grad_layout))
    assert leaf.grad is not None
    return out, leaf.grad


@pytest.mark.parametrize("layout", LAYOUTS, ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: ",".join(f"{k}={v}" for k, v in w.items()))
def test_equals_torch_max_pool_bit_for_bit(window: dict, layout: torch.memory_format) -> None:
    x = tied_maps((3, 5, 11, 10))
    ours, our_grad = pooled_and_grad(MaxPool2d(**window), x, layout)
    theirs, their_grad = pooled_and_grad(nn.MaxPool2d(**window), x, layout)
    assert torch.equal(ours, theirs)
    assert torch.equal(our_grad, their_grad)
    assert ours.stride() == theirs.stride()  # the layout the next layer receives
    assert our_grad.stride() == their_grad.stride()


@pytest.mark.parametrize("layout", LAYOUTS, ids=["contiguous", "channels_last"])
def test_a_gradient_in_the_outputs_layout_equals_torch(layout: torch.memory_format) -> None:
    """The gradient a convolution after the pool hands back: laid out as the output."""
    x = tied_maps((2, 6, 9, 9))
    ours, our_grad = pooled_and_grad(MaxPool2d(3, 2), x, layout, grad_layout=layout)
    theirs, their_grad = pooled_and_grad(nn.MaxPool2d(3, 2), x, layout, grad_layout=layout)
    assert torch.equal(ours, theirs) and torch.equal(our_grad, their_grad)
    assert our_grad.stride() == their_grad.stride()


def test_a_batch_pooled_in_several_copies_equals_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A contiguous batch is copied channels-last a few images at a time: 7 images of 2,560
    bytes in copies of at most 6,000 bytes are pooled 2, 2, 2 and 1 at a time."""
    monkeypatch.setattr(max_pool, "_COPY_BYTES", 6_000)
    x = tied_maps((7, 4, 16, 10))
    assert max_pool._images_per_copy(x) == 2
    ours, our_grad = pooled_and_grad(MaxPool2d(3, 2, padding=1), x, torch.contiguous_format)
    theirs, their_grad = pooled_and_grad(nn.MaxPool2d(3, 2, padding=1), x, torch.contiguous_format)
    assert torch.equal(ours, theirs) and torch.equal(our_grad, their_grad)
    with torch.no_grad():
        assert torch.equal(MaxPool2d(2)(x), nn.MaxPool2d(2)(x))


@pytest.mark.parametrize("layout", LAYOUTS, ids=["contiguous", "channels_last"])
def test_ties_send_the_gradient_to_one_element_as_torch_does(layout: torch.memory_format) -> None:
    """A 2x2 window of four equal values: the whole gradient goes to its first element."""
    x = torch.ones(1, 2, 2, 2)
    _, grad = pooled_and_grad(MaxPool2d(2), x, layout)
    expected = torch.zeros(1, 2, 2, 2)
    expected[:, :, 0, 0] = grad[:, :, 0, 0]  # by hand: the gradient's value, at (0, 0) only
    assert torch.equal(grad, expected)
    assert bool((grad[:, :, 0, 0] != 0).all())


@pytest.mark.parametrize("layout", LAYOUTS, ids=["contiguous", "channels_last"])
def test_nan_and_infinity_pool_as_torch_does(layout: torch.memory_format) -> None:
    x = tied_maps((2, 3, 6, 6))
    x[0, 0, 0, 1] = float("nan")
    x[0, 1, 2, 2] = float("inf")
    x[1, 2, 4, 4] = float("-inf")
    x[1, 0, 0, 0] = x[1, 0, 1, 1] = float("nan")  # two NaNs in one window
    ours, our_grad = pooled_and_grad(MaxPool2d(2), x, layout)
    theirs, their_grad = pooled_and_grad(nn.MaxPool2d(2), x, layout)
    assert torch.equal(ours.isnan(), theirs.isnan())
    assert torch.equal(ours.nan_to_num(), theirs.nan_to_num())
    assert torch.equal(our_grad, their_grad)


def test_float64_and_one_channel_maps_equal_torch() -> None:
    for shape, dtype in [((2, 4, 8, 8), torch.float64), ((3, 1, 9, 9), torch.float32)]:
        x = tied_maps(shape, dtype)
        for layout in LAYOUTS:
            ours, our_grad = pooled_and_grad(MaxPool2d(2), x, layout)
            theirs, their_grad = pooled_and_grad(nn.MaxPool2d(2), x, layout)
            assert torch.equal(ours, theirs) and torch.equal(our_grad, their_grad)
            assert ours.stride() == theirs.stride()


def test_without_grad_the_output_equals_torch() -> None:
    x = tied_maps((2, 8, 12, 12))
    with torch.no_grad():
        assert torch.equal(MaxPool2d(3, 2)(x), nn.MaxPool2d(3, 2)(x))
    leaf = x.clone().requires_grad_()
    with torch.no_grad():  # a leaf that wants gradients, outside grad mode: nothing kept for them
        pooled = MaxPool2d(3, 2)(leaf)
    assert pooled.grad_fn is None and torch.equal(pooled, nn.MaxPool2d(3, 2)(x))


CHANNELS_LAST_STRIDED = {
    "one channel, permuted from NHWC": lambda x: (
        x[:, :1].permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    ),
    "a channel slice": lambda x: x.contiguous(memory_format=torch.channels_last)[:, 1:4],
    "every other image": lambda x: x.contiguous(memory_format=torch.channels_last)[::2],
    "a column slice": lambda x: x.contiguous(memory_format=torch.channels_last)[..., 1:9],
    "1x1 maps": lambda x: x[..., :1, :1].permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2),
}


@pytest.mark.parametrize("view", CHANNELS_LAST_STRIDED.values(), ids=CHANNELS_LAST_STRIDED.keys())
def test_maps_torch_pools_channels_last_keep_torchs_output_layout(view) -> None:
    """torch pools by the layout its strides suggest, dense or not, one channel or many (an
    augmentation's ``permute`` hands on such images): the output's strides, which choose the next
    layer's kernel and so its bits, are torch's too; so is the gradient through the view."""
    maps = tied_maps((4, 5, 10, 10))
    for grad in (False, True):
        bases = [maps.clone().requires_grad_(grad) for _ in range(2)]
        views = [view(base) for base in bases]
        pool = 1 if views[0].shape[-1] == 1 else 2
        ours, theirs = MaxPool2d(pool)(views[0]), nn.MaxPool2d(pool)(views[1])
        assert torch.equal(ours, theirs) and ours.stride() == theirs.stride()
        if grad:
            ours.pow(2).sum().backward()
            theirs.pow(2).sum().backward()
            assert torch.equal(bases[0].grad, bases[1].grad)


def test_each_layout_takes_its_fast_path() -> None:
    """Losing the speed-up fails here: a contiguous map's pool is the channels-last copies' function,
    a channels-last map's output carries the hook that lays its gradient out."""
    x = tied_maps((2, 4, 8, 8)).requires_grad_()
    assert type(MaxPool2d(2)(x).grad_fn).__name__ == "_PooledChannelsLastBackward"
    channels_last = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    pooled = MaxPool2d(2)(channels_last)
    assert type(pooled.grad_fn) is type(nn.MaxPool2d(2)(channels_last).grad_fn)
    assert pooled._backward_hooks  # torch's pool, with the hook


@pytest.mark.parametrize("layout", LAYOUTS, ids=["contiguous", "channels_last"])
def test_second_derivatives_equal_torch(layout: torch.memory_format) -> None:
    """A gradient penalty differentiates the pool's backward: the same graph as torch's."""
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    grads = []
    for module in (MaxPool2d(2), nn.MaxPool2d(2)):
        leaf = x.clone().contiguous(memory_format=layout).requires_grad_()
        (first,) = torch.autograd.grad((module(leaf) ** 3).sum(), leaf, create_graph=True)
        (second,) = torch.autograd.grad((first**2).sum(), leaf)
        grads.append(second)
    assert torch.equal(grads[0], grads[1])
    assert bool((grads[0] != 0).any())


def test_vmap_and_per_example_gradients_take_torchs_path() -> None:
    """Inside torch.func transforms the module is nn.MaxPool2d itself: the results equal it."""
    x = tied_maps((4, 2, 3, 8, 8))
    pool, reference = MaxPool2d(2), nn.MaxPool2d(2)
    assert torch.equal(torch.func.vmap(pool)(x), torch.func.vmap(reference)(x))
    maps, scales = x[0].requires_grad_(), torch.arange(3.0)  # an input vmap does not batch
    ours = torch.func.vmap(lambda w: (pool(maps) * w).sum())(scales)
    assert torch.equal(ours, torch.func.vmap(lambda w: (reference(maps) * w).sum())(scales))

    def loss(module: nn.Module, sample: torch.Tensor) -> torch.Tensor:
        return (module(sample) ** 2).sum()

    ours = torch.func.vmap(torch.func.grad(lambda s: loss(pool, s)))(x)
    theirs = torch.func.vmap(torch.func.grad(lambda s: loss(reference, s)))(x)
    assert torch.equal(ours, theirs)


def test_fast_path_is_the_cpu_float_maps_only() -> None:
    assert fast_path_applies(torch.zeros(1, 2, 4, 4))
    assert fast_path_applies(torch.zeros(1, 2, 4, 4, dtype=torch.float64))
    assert not fast_path_applies(torch.zeros(2, 4, 4))  # unbatched
    assert not fast_path_applies(torch.zeros(0, 2, 4, 4))  # an empty batch: torch's own shape checks
    assert not fast_path_applies(torch.zeros(1, 2, 4, 4, dtype=torch.bfloat16))
    with_indices = MaxPool2d(2, return_indices=True)(torch.arange(16.0).view(1, 1, 4, 4))
    assert isinstance(with_indices, tuple)  # nn.MaxPool2d's own (output, indices)
    assert torch.equal(with_indices[1], torch.tensor([[[[5, 7], [13, 15]]]]))


def test_unbatched_maps_fall_back_to_torch() -> None:
    x = tied_maps((3, 8, 8)).requires_grad_()
    assert torch.equal(MaxPool2d(2)(x), nn.MaxPool2d(2)(x))


@pytest.mark.parametrize("name", ["cnn_pfl", "cnn_mnist", "simple_cnn", "vgg11"])
def test_the_models_pool_with_it_and_keep_their_state_dict(name: str) -> None:
    model = build_model(name, {}, DataSpec("classification", (3, 32, 32), 10))
    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    assert pools and all(type(m) is MaxPool2d for m in pools)
    assert not any(list(m.parameters()) or list(m.buffers()) for m in pools)  # the state dict is as before


def test_a_trained_cnn_equals_one_built_with_torchs_pool() -> None:
    """Three SGD steps of cnn_pfl (channels-last weights, as raysim's CPU steps lay them out) with
    raysim's pool and with nn.MaxPool2d swapped in: the same weights to the last bit."""
    spec = DataSpec("classification", (3, 16, 16), 10)
    weights = []
    for swap in (False, True):
        torch.manual_seed(0)
        model = build_model("cnn_pfl", {}, spec).to(memory_format=torch.channels_last)
        if swap:
            swapped = [
                setattr(block, name, nn.MaxPool2d(child.kernel_size))
                for block in list(model.modules())
                for name, child in block.named_children()
                if isinstance(child, MaxPool2d)
            ]
            assert swapped and not any(type(m) is MaxPool2d for m in model.modules())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        weights.append(model.state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_small_contiguous_maps_are_pooled_by_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below ``_SMALLEST_COPIED`` elements the copies cost more than torch's slow kernel."""
    monkeypatch.setattr(max_pool, "_SMALLEST_COPIED", 1 << 16)
    small, large = tied_maps((2, 4, 8, 8)).requires_grad_(), tied_maps((1, 4, 128, 128)).requires_grad_()
    assert type(MaxPool2d(2)(small).grad_fn) is type(nn.MaxPool2d(2)(small).grad_fn)
    assert type(MaxPool2d(2)(large).grad_fn).__name__ == "_PooledChannelsLastBackward"


def test_forward_mode_ad_takes_torchs_path() -> None:
    x, tangent = tied_maps((2, 3, 8, 8)), torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    for wants_grad in (False, True):  # forward and reverse mode together too
        tangents = []
        for module in (MaxPool2d(2), nn.MaxPool2d(2)):
            with torch.autograd.forward_ad.dual_level():
                primal = x.clone().requires_grad_(wants_grad)
                out = module(torch.autograd.forward_ad.make_dual(primal, tangent))
                tangents.append(torch.autograd.forward_ad.unpack_dual(out).tangent)
        assert torch.equal(tangents[0], tangents[1])
