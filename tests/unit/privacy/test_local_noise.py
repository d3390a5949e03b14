"""Local DP's release: the update clipped over all its float leaves at once (L2 for gaussian, L1
for laplace), then noised coordinate-wise at ``noise_multiplier * clip_bound``, the noise a pure
function of the client's noise seed.

The noise checks compare sample statistics with their laws: for N draws of N(0, s^2) the sample
standard deviation has standard error about s / sqrt(2N); for Laplace(b), |z| is Exp(b), whose
mean b has standard error b / sqrt(N). Each test allows five standard errors."""

import math
from dataclasses import dataclass

import pytest
import torch

from raysim.config.privacy import LocalPrivacy
from raysim.privacy.local_noise import release_result, release_update
from raysim.sampling import noise_seed
from raysim.types import ClientResult

N = 200_000  # noise coordinates drawn per statistic


@dataclass(frozen=True)
class Update:
    delta: dict[str, torch.Tensor]
    steps: torch.Tensor  # an integer leaf: not clipped, not noised


def l2(tree: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tree.values()))


def l1(tree: dict[str, torch.Tensor]) -> float:
    return sum(float(t.double().abs().sum()) for t in tree.values())


def random_update(scale: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": scale * torch.randn(30, 20, generator=g), "b": scale * torch.randn(20, generator=g).double()}


@pytest.mark.parametrize(("mechanism", "norm"), [("gaussian", l2), ("laplace", l1)])
def test_the_release_clips_in_its_mechanisms_norm_and_reports_the_norm_before(mechanism, norm):
    """With noise too small to matter, the release is the update clipped (``raysim.params.clip_tree``,
    tested against numpy there): L2 for gaussian, L1 for laplace."""
    config = LocalPrivacy(mechanism=mechanism, clip_bound=3.0, noise_multiplier=1e-9)
    for scale in (0.1, 1000.0):
        update = random_update(scale)
        released, measured = release_update(update, config, torch.Generator().manual_seed(0))
        assert measured == pytest.approx(norm(update), rel=1e-9)
        assert norm(released) == pytest.approx(min(norm(update), 3.0), rel=1e-6)
        assert torch.allclose(released["w"], update["w"] * min(1.0, 3.0 / norm(update)), atol=1e-6)


def test_the_gaussian_noise_has_std_noise_multiplier_times_bound():
    config = LocalPrivacy(mechanism="gaussian", clip_bound=0.5, noise_multiplier=1.5)
    zero = {"w": torch.zeros(N)}
    released, _ = release_update(zero, config, torch.Generator().manual_seed(1))
    noise = released["w"].double()
    expected = 1.5 * 0.5
    assert float(noise.std()) == pytest.approx(expected, abs=5 * expected / math.sqrt(2 * N))
    assert abs(float(noise.mean())) < 5 * expected / math.sqrt(N)


def test_the_laplace_noise_has_mean_absolute_deviation_its_scale():
    config = LocalPrivacy(mechanism="laplace", clip_bound=2.0, noise_multiplier=0.75)
    released, _ = release_update({"w": torch.zeros(N)}, config, torch.Generator().manual_seed(2))
    noise = released["w"].double()
    scale = 0.75 * 2.0
    assert float(noise.abs().mean()) == pytest.approx(scale, abs=5 * scale / math.sqrt(N))
    # Laplace, not Gaussian: the Gaussian of that mean absolute deviation has kurtosis 3, Laplace 6
    kurtosis = float((noise**4).mean() / (noise**2).mean() ** 2)
    assert kurtosis == pytest.approx(6.0, abs=0.5)


def test_the_same_seed_gives_the_same_noise_another_client_another():
    config = LocalPrivacy(clip_bound=1.0, noise_multiplier=1.0)
    update = random_update(0.01)

    def released(client_id: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(noise_seed(7, 3, client_id))
        return release_update(update, config, generator)[0]["w"]

    assert torch.equal(released(5), released(5))
    assert not torch.allclose(released(5), released(6))


def test_a_tree_keeps_its_structure_and_dtypes_and_integer_leaves_pass_unchanged():
    config = LocalPrivacy(mechanism="laplace", clip_bound=1.0, noise_multiplier=0.1)
    update = Update(
        {"w": torch.ones(4, dtype=torch.float16), "v": torch.ones(2, dtype=torch.float64)}, torch.tensor(9)
    )
    released, norm = release_update(update, config, torch.Generator().manual_seed(0))
    assert isinstance(released, Update) and torch.equal(released.steps, torch.tensor(9))
    assert released.delta["w"].dtype == torch.float16 and released.delta["v"].dtype == torch.float64
    assert norm == pytest.approx(6.0)  # L1 over both float leaves; the integer leaf counts not
    assert not torch.equal(released.delta["v"], update.delta["v"] / 6.0)  # noised


def test_a_released_result_carries_the_norm_and_its_seeds_noise():
    config = LocalPrivacy(clip_bound=1.0, noise_multiplier=0.5)
    result = ClientResult({"w": torch.full((3,), 2.0)}, weight=10.0, metrics={"train/loss": 1.0})
    released = release_result(result, config, seed=noise_seed(0, 1, 2))
    again, _ = release_update(result.update, config, torch.Generator().manual_seed(noise_seed(0, 1, 2)))
    assert torch.equal(released.update["w"], again["w"])
    assert released.weight == 10.0 and released.metrics["train/loss"] == 1.0
    assert released.metrics["privacy/local_norm"] == pytest.approx(math.sqrt(12.0))
