"""FuseFL's fused network (Tang et al., NeurIPS 2024, arXiv:2410.20380).

A client model is cut at named split points (``anatomy.split_blocks``: a block name, or a stage such
as "layer2" that fits ResNet-10/18/26 alike) into K stages, the head left apart. The fused model
places the M clients' stages side by side as M towers: stage 1 of every tower reads the image; at
every later stage each tower's own adapter reads the outputs of ALL towers (in tower order) and
feeds that tower's block. The "conv1x1" adapter concatenates the M outputs along channels and maps
them back to one tower's width with a 1x1 conv (a linear layer for flat (B, D) outputs); "avg"
averages them (no parameters). The M final outputs, flattened, are summed into the features
(``feature_fusion: sum``, the official code's) or averaged (``mean``, the scale each client's head
trained on), and one head (the clients' averaged, then CCVR-calibrated classifier) maps them to
logits.

State-dict names: ``stages.<k>.<m>.adapter.*`` and ``stages.<k>.<m>.block.*`` for stage k (0-based)
of tower m, and ``head.*``; a client's upload at stage k is one ``FusedPart``'s state dict.

The towers are given as models (``fused_net(towers, ...)``), one per client, so per-client
architectures (ResNet-10/18/26 mixed, FuseFL paper, Sec. 6.2, Table 3) need only towers whose stage
outputs have the same spatial sizes at every split point (a conv1x1 adapter reads the sum of their
channels, "avg" needs equal outputs) and the same flattened feature size at the top (the head is
one, averaged): ``tower_misfits`` names what does not align. The registered ``fusefl_fused`` model
builds M copies of one ``base`` model section, or one tower per section of ``towers`` (per-client
architectures).

Usage:
    stages = client_stages(model, ("layer2",))       # [stem..layer2.1, layer3.0..pool]
    net = fused_net([model_a, model_b], ("layer2",), "conv1x1", spec)
    towers = net.tower_outputs(x)                    # M tensors
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from pydantic import Field, PositiveInt
from torch import nn

from raysim.errors import ConfigError
from raysim.models.anatomy import param_groups, parts, split_blocks
from raysim.models.weights import ModelConfig
from raysim.registry import register
from raysim.types import DataSpec

AdapterKind = Literal["conv1x1", "avg"]
FeatureFusion = Literal["mean", "sum"]  # how the towers' top features join into the head's input
FrozenBN = Literal["eval", "train"]  # what frozen fused blocks' BatchNorm does while clients train


class FusedConfig(ModelConfig, frozen=True, extra="forbid"):
    """FuseFL's fused model: M towers of one base model joined by adapters at the split points."""

    base: dict[str, Any] = Field(default_factory=lambda: {"name": "cnn_mnist"})  # one client's model section
    # block or stage names, bottom-up; K = len(splits) + 1 stages; None: after each tower's middle block
    splits: tuple[str, ...] | None = None
    num_towers: PositiveInt = 1  # M, the clients fused
    adapter: AdapterKind = "conv1x1"
    feature_fusion: FeatureFusion = "sum"  # the towers' top features summed (the code's), or averaged
    # one model section per tower (per-client architectures); empty: num_towers copies of base
    towers: tuple[dict[str, Any], ...] = ()


def middle_split(model: nn.Module) -> tuple[str, ...]:
    """The default split point: the middle one of the blocks below the head (ResNet-18: the end
    of layer2, FuseFL's K = 2 split; a model of one block below its head: that block)."""
    names = list(parts(model))[:-1]  # type: ignore[arg-type]
    return (names[(len(names) - 1) // 2],)


def client_stages(model: nn.Module, splits: Sequence[str]) -> list[nn.Sequential]:
    """The model's blocks (its head excluded) cut after each split point, as K ``nn.Sequential``s
    sharing the model's modules (training a stage trains the model).

    Raises:
        ConfigError: a split point names no block of the model, or they are not in forward order
            (``split_blocks``' message names the blocks and stages to choose from).
    """
    blocks = parts(model)  # type: ignore[arg-type]
    names = list(blocks)[:-1]  # the head is apart
    cuts = [0]
    for point in splits:
        lower, _ = split_blocks(model, point)  # type: ignore[arg-type]
        if len(lower) <= cuts[-1]:
            raise ConfigError(
                [
                    f"split point {point!r} does not lie above the one before it: "
                    f"list the split points bottom-up, each once"
                ]
            )
        cuts.append(len(lower))
    cuts.append(len(names))
    return [nn.Sequential(*(blocks[n] for n in names[a:b])) for a, b in zip(cuts, cuts[1:])]


class ConcatAdapter(nn.Module):
    """Eq. 8: the M tower outputs concatenated along channels, mapped to ``out`` channels by a 1x1
    conv (or, for flat (B, D) outputs, the equivalent linear layer)."""

    def __init__(self, in_channels: int, out_channels: int, spatial: bool) -> None:
        super().__init__()
        self.map = (
            nn.Conv2d(in_channels, out_channels, 1) if spatial else nn.Linear(in_channels, out_channels)
        )

    def forward(self, towers: list[torch.Tensor]) -> torch.Tensor:
        return self.map(torch.cat(towers, dim=1))


class AverageAdapter(nn.Module):
    """Eq. 7: the elementwise mean of the M tower outputs (equal shapes), no parameters."""

    def forward(self, towers: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(towers).mean(dim=0)


class FusedPart(nn.Module):
    """One tower's stage: its adapter (None at stage 1, which reads the input) and its block."""

    def __init__(self, adapter: nn.Module | None, block: nn.Module) -> None:
        super().__init__()
        self.adapter = adapter
        self.block = block

    def forward(self, inputs: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        if self.adapter is None:
            assert isinstance(inputs, torch.Tensor)
            return self.block(inputs)
        assert isinstance(inputs, list)
        return self.block(self.adapter(inputs))


class FusedStages(nn.Module):
    """Stages 1..k of M towers: an image (B, ...) -> the M towers' outputs at stage k."""

    def __init__(self, stages: list[list[FusedPart]]) -> None:
        super().__init__()
        self.stages = nn.ModuleList(nn.ModuleList(stage) for stage in stages)

    def tower_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        stages: list[nn.ModuleList] = list(self.stages)  # type: ignore[arg-type]
        outputs = [part(x) for part in stages[0]]
        for stage in stages[1:]:
            outputs = [part(outputs) for part in stage]
        return outputs

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.tower_outputs(x)


class FusedNet(FusedStages):
    """The fused model F_fus: all K stages of the towers, then the sum (or the mean) of their
    flattened outputs, then one head."""

    def __init__(
        self, stages: list[list[FusedPart]], head: nn.Module, feature_fusion: FeatureFusion = "sum"
    ) -> None:
        super().__init__(stages)
        self.head = head
        self.feature_fusion = feature_fusion

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The sum (``feature_fusion: mean``: the mean) over towers of each tower's flattened
        last-stage output, (B, D)."""
        tops = torch.stack([t.flatten(1) for t in self.tower_outputs(x)])  # (M, B, D)
        return tops.mean(dim=0) if self.feature_fusion == "mean" else tops.sum(dim=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.head(self.features(x))


class StagedNet(nn.Module):
    """Client m's model at stage k (Eq. 5): the frozen fused stages 0..k-1 (none at k = 0), its own
    adapter and block k, its own upper blocks and head."""

    def __init__(
        self,
        lower: FusedStages | None,
        own: FusedPart,
        upper: list[nn.Module],
        head: nn.Module,
        frozen_bn: FrozenBN,
    ) -> None:
        super().__init__()
        self.lower = lower
        self.own = own
        self.upper = nn.Sequential(*upper)
        self.head = head
        self.frozen_bn = frozen_bn
        if lower is not None:
            lower.requires_grad_(False)

    def train(self, mode: bool = True) -> StagedNet:
        super().train(mode)
        if self.lower is not None and self.frozen_bn == "eval":
            self.lower.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lower is None:
            h = self.own(x)
        else:
            with torch.no_grad():  # frozen: no graph through the fused blocks
                towers = self.lower.tower_outputs(x)
            h = self.own(towers)
        return self.head(self.upper(h).flatten(1))


def stage_output_shapes(stages: Sequence[nn.Module], spec: DataSpec) -> list[tuple[int, ...]]:
    """Each stage's output shape for one example of ``spec`` (batch dim dropped), by a forward of
    zeros in eval mode (BatchNorm neither learns from them nor needs two examples)."""
    modes = [m.training for m in stages]
    shapes, x = [], torch.zeros(1, *spec.input_shape)
    with torch.no_grad():
        for stage in stages:
            stage.eval()
            x = stage(x)
            shapes.append(tuple(x.shape[1:]))
    for stage, mode in zip(stages, modes):
        stage.train(mode)
    return shapes


def make_adapter(
    kind: AdapterKind, tower_shapes: Sequence[tuple[int, ...]], own: tuple[int, ...]
) -> nn.Module:
    """The adapter in front of one tower's next block, for the towers' output shapes at the split.

    Raises:
        ValueError: the shapes cannot be joined (different spatial sizes, or "avg" over different
            channel counts).
    """
    if any(shape[1:] != own[1:] for shape in tower_shapes):
        raise ValueError(
            f"fused towers' outputs differ in size at a split point: {sorted(set(tower_shapes))}"
        )
    if kind == "avg":
        if any(shape != own for shape in tower_shapes):
            raise ValueError(
                f"adapter avg needs equal tower outputs, got {sorted(set(tower_shapes))}: use conv1x1"
            )
        return AverageAdapter()
    return ConcatAdapter(sum(shape[0] for shape in tower_shapes), own[0], spatial=len(own) == 3)


def split_points(model: nn.Module, splits: Sequence[str] | None) -> tuple[str, ...]:
    """``splits``, or None: the model's own middle split (ResNet-10/18/26: the end of layer2)."""
    return middle_split(model) if splits is None else tuple(splits)


def tower_models(
    model_of: Callable[[int], nn.Module] | None, model: nn.Module, num_towers: int
) -> list[nn.Module]:
    """The towers' architectures, tower m being client m's (``ClientContext.model_of``; only their
    structure is read), or ``model`` for every tower where no worker built the context."""
    return [model] * num_towers if model_of is None else [model_of(m) for m in range(num_towers)]


def tower_shapes(
    towers: Sequence[nn.Module], splits: Sequence[str] | None, spec: DataSpec
) -> list[list[tuple[int, ...]]]:
    """Each tower's output shape at each of its stages (the towers are only read)."""
    return [stage_output_shapes(client_stages(t, split_points(t, splits)), spec) for t in towers]


def tower_misfits(
    towers: Sequence[nn.Module], splits: Sequence[str] | None, adapter: AdapterKind, spec: DataSpec
) -> list[str]:
    """What keeps these client models from being fused: a different number of stages, different
    spatial sizes at a split point ("avg": any different shape), a different flattened feature
    size at the top, or heads of different shapes (the fused head is their average)."""
    shapes = tower_shapes(towers, splits, spec)
    if len({len(s) for s in shapes}) > 1:
        return [
            f"the towers have {sorted({len(s) for s in shapes})} stages: "
            f"name the same number of split points in each"
        ]
    problems = []
    for k in range(len(shapes[0]) - 1):
        at_split = [s[k] for s in shapes]
        joined = at_split if adapter == "avg" else [shape[1:] for shape in at_split]
        if len(set(joined)) > 1:
            what = "outputs" if adapter == "avg" else "spatial sizes"
            problems.append(
                f"split point {k + 1} gives {what} {at_split} across the towers: they must be equal"
                + (" (adapter conv1x1 needs only equal spatial sizes)" if adapter == "avg" else "")
            )
    features = {math.prod(s[-1]) for s in shapes}
    heads = {tuple(tuple(w.shape) for w in parts(t)["head"].parameters()) for t in towers}  # type: ignore[arg-type]
    if len(features) > 1 or len(heads) > 1:
        problems.append(
            f"the towers' top features ({sorted(features)} values) or heads differ in size: the fused "
            f"model has one head, the towers' average, so the last stage's width must be equal"
        )
    return problems


def fused_parts(
    towers: Sequence[nn.Module], splits: Sequence[str] | None, adapter: AdapterKind, spec: DataSpec
) -> list[list[FusedPart]]:
    """Per stage, each tower's part: copies of its blocks, a fresh adapter from stage 2 on
    (``splits`` None: each tower's middle split)."""
    stages = [client_stages(copy.deepcopy(tower), split_points(tower, splits)) for tower in towers]
    shapes = [stage_output_shapes(tower_stages, spec) for tower_stages in stages]
    out: list[list[FusedPart]] = []
    for k in range(len(stages[0])):
        below = [tower_shapes[k - 1] for tower_shapes in shapes] if k else []
        out.append(
            [
                FusedPart(make_adapter(adapter, below, below[m]) if k else None, stages[m][k])
                for m in range(len(towers))
            ]
        )
    return out


def fused_net(
    towers: Sequence[nn.Module],
    splits: Sequence[str] | None,
    adapter: AdapterKind,
    spec: DataSpec,
    feature_fusion: FeatureFusion = "sum",
) -> FusedNet:
    """F_fus of these client models (copied), the first one's head (copied) as the shared head."""
    head = copy.deepcopy(parts(towers[0])["head"])  # type: ignore[arg-type]
    return FusedNet(fused_parts(towers, splits, adapter, spec), head, feature_fusion)


def num_parameters(model: nn.Module) -> int:
    """Parameters (buffers excluded): the paper's |F_fus| in Table 4 counts these."""
    return sum(p.numel() for p in model.parameters())


@register("model", "fusefl_fused", config=FusedConfig)
def build_fused(config: FusedConfig, spec: DataSpec) -> FusedNet:
    """FuseFL's fused model of ``num_towers`` copies of ``base``, or of the ``towers`` (loaded with
    the clients' blocks)."""
    from raysim.models import build_model

    sections = config.towers or (config.base,)
    built = {json.dumps(s, sort_keys=True, default=str): s for s in sections}
    models = {key: build_model(str(s["name"]), s, spec) for key, s in built.items()}
    for model in models.values():
        param_groups(model)  # type: ignore[arg-type]  # a model whose blocks miss tensors fails here, by name
    towers = [models[json.dumps(s, sort_keys=True, default=str)] for s in sections]
    towers = towers if config.towers else towers * config.num_towers
    return fused_net(towers, config.splits, config.adapter, spec, config.feature_fusion)
