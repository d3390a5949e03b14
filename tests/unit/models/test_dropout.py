"""raysim's ``Dropout`` against a numpy reference of its law, and ``nn.Dropout`` where it falls back.

The law (module docstring): with u = ``torch.rand_like(x)`` drawn from the seeded default
generator, the output is ``x * s`` where an element is kept (u < 1 - p) and 0 elsewhere, with
``s = 1 / (1 - p)`` rounded to the input's dtype, as torch scales; the input's gradient is the
output's times the same mask. The reference below redoes that in numpy from the same draws.
"""

import numpy as np
import pytest
import torch
from torch import nn

from raysim.models import build_model
from raysim.models.dropout import Dropout
from raysim.models.eager_cpu import eager_cpu_float
from raysim.types import DataSpec


def reference(x: torch.Tensor, grad: torch.Tensor, p: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The output and the input's gradient by the law, in numpy, from the draws of ``seed``."""
    torch.manual_seed(seed)
    u = torch.rand_like(x).numpy()
    dtype = u.dtype.type
    scaled_mask = np.where(u < dtype(1.0 - p), dtype(1.0) / dtype(1.0 - p), dtype(0.0))
    return x.detach().numpy() * scaled_mask, grad.numpy() * scaled_mask


def maps(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize(
    "layout", ["contiguous", "channels_last", "transposed", "float64"], ids=lambda name: name
)
@pytest.mark.parametrize("p", [0.25, 0.5, 0.1])
def test_output_and_gradient_follow_the_law(layout: str, p: float) -> None:
    x = maps((4, 6, 5, 5), 0, torch.float64 if layout == "float64" else torch.float32)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.transpose(1, 3)
    x.requires_grad_()
    grad = maps(tuple(x.shape), 1, x.dtype)
    expected_out, expected_grad = reference(x, grad, p, seed=3)
    torch.manual_seed(3)
    out = Dropout(p)(x)
    out.backward(grad)
    assert out.dtype == x.dtype and out.stride() == x.stride()
    np.testing.assert_array_equal(out.detach().numpy(), expected_out)
    np.testing.assert_array_equal(x.grad.numpy(), expected_grad)


def test_it_keeps_one_minus_p_of_the_elements_and_repeats_under_a_seed() -> None:
    """4M draws: the kept share within 5 standard deviations (1.1e-3) of 0.7."""
    x = torch.ones(4_000_000)
    torch.manual_seed(11)
    first = Dropout(0.3)(x)
    torch.manual_seed(11)
    assert torch.equal(Dropout(0.3)(x), first)
    kept = first != 0
    assert abs(float(kept.double().mean()) - 0.7) < 5 * (0.7 * 0.3 / 4e6) ** 0.5
    assert torch.equal(first[kept], torch.full_like(first[kept], np.float32(1) / np.float32(0.7)))


def test_it_draws_other_masks_than_nn_dropout_on_the_cpu() -> None:
    """The fast path ran: torch's ``bernoulli_`` gives other masks from the same seed."""
    x = maps((8, 16, 6, 6), 2)
    torch.manual_seed(5)
    ours = Dropout(0.25)(x)
    torch.manual_seed(5)
    assert not torch.equal(ours, nn.Dropout(0.25)(x))


@pytest.mark.parametrize(
    "case",
    ["evaluation", "p0", "p1", "inplace", "float16", "bfloat16"],
)
def test_where_the_fast_path_does_not_apply_it_is_nn_dropout(case: str) -> None:
    p = {"p0": 0.0, "p1": 1.0}.get(case, 0.25)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(case, torch.float32)
    ours, torchs = Dropout(p, inplace=case == "inplace"), nn.Dropout(p, inplace=case == "inplace")
    if case == "evaluation":
        ours.eval(), torchs.eval()
    outputs = []
    for module in (ours, torchs):
        torch.manual_seed(7)
        outputs.append(module(maps((4, 8, 5, 5), 3).to(dtype)))
    assert torch.equal(outputs[0], outputs[1])


def test_under_vmap_it_is_nn_dropout() -> None:
    x = maps((3, 4, 5), 4)

    def through(module: nn.Module) -> torch.Tensor:
        torch.manual_seed(9)
        return torch.func.vmap(module, randomness="different")(x)

    assert torch.equal(through(Dropout(0.25)), through(nn.Dropout(0.25)))
    fixed = maps((4, 5), 5)  # an input vmap does not batch, inside a vmapped function

    def beside(module: nn.Module) -> torch.Tensor:
        torch.manual_seed(9)
        return torch.func.vmap(lambda row: row + module(fixed), randomness="different")(x)

    assert torch.equal(beside(Dropout(0.25)), beside(nn.Dropout(0.25)))
    assert not torch.func.vmap(lambda row: torch.tensor(eager_cpu_float(row)))(x).any()
    assert eager_cpu_float(x)


def test_cnn_pfl_drops_out_with_it() -> None:
    model = build_model("cnn_pfl", {}, DataSpec("classification", (3, 32, 32), 10))
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert [type(m) for m in dropouts] == [Dropout, Dropout]
    assert [m.p for m in dropouts] == [0.25, 0.5]
