"""DENSE: data-free one-shot FL (Zhang et al., "DENSE: Data-Free One-Shot Federated Learning",
NeurIPS 2022, arXiv:2112.12371), as FuseFL compares it (Tang et al., NeurIPS 2024, arXiv:2410.20380): one
round of
local training, then the server, without any data, trains a generator against the ensemble of the
M client models and distils the ensemble into one model on the synthetic images.

The client models come from ``raysim.train.oneshot.local_models`` (the cache the one-shot methods
share). Each of ``epochs`` epochs (``raysim.train.datafree``): ``synthesis.steps`` generator steps
on a fresh latent batch (BatchNorm-statistics loss, the ensemble's cross-entropy to random labels,
the adversarial boundary term), the lowest-loss batch joins the image pool, then one pass of the
student over the whole pool, KL to the ensemble at temperature ``temperature`` (SGD, momentum 0.9).
Defaults are the DENSE README's CIFAR-10 command (200 epochs, 30 generator steps, batches of 256,
lr_g 1e-3, student lr 0.005, T = 20, bn = oh = adv = 1). The student starts from the run's
initial model as in DENSE's code (``student_init: average`` starts it at one-shot FedAvg's model).
Logged at step 0: the global (distilled) model's evaluation, ``dense/pool_images``,
``dense/kd_loss`` (the last epoch's mean) and ``dense/generator_loss`` (the last epoch's
lowest, the batch that joined the pool).

The teachers need BatchNorm layers for the statistics loss (``synthesis.bn`` 0 lifts that) and the
images' sides must be multiples of 4 (the generator upsamples twice): both are refused before any
worker starts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from raysim import params as P
from raysim.aggregate import Gathered
from raysim.errors import ConfigError
from raysim.models import build_with_params
from raysim.registry import register
from raysim.services import Services
from raysim.train.datafree import (
    BatchNormStatistics,
    Generator,
    SynthesisConfig,
    distill_on_pool,
    pool_targets,
    synthesize,
)
from raysim.train.oneshot import OneShotConfig, average_models, keep_local_model, local_models
from raysim.train.server_opt import init_state
from raysim.types import ClientContext, ClientResult, Params, RunInfo, ServerState


class DenseConfig(OneShotConfig, frozen=True, extra="forbid"):
    """One-shot local training (shared), the generator, and the student's distillation."""

    epochs: int = Field(200, ge=1)  # synthesis + distillation epochs
    synthesis: SynthesisConfig = SynthesisConfig()
    lr: float = Field(0.005, gt=0)  # the student's SGD learning rate (momentum 0.9)
    batch_size: int = Field(256, ge=1)  # the student's minibatches over the pool
    temperature: float = Field(20.0, gt=0)  # T of the KD loss
    student_init: Literal["initial", "average"] = "initial"

    def check_model(self, model: nn.Module) -> list[str]:
        """Checked on the driver with the job's model, before any worker starts: the statistics
        loss needs BatchNorm layers in the teachers."""
        if self.synthesis.bn > 0 and not any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):
            return [
                "algorithm.synthesis.bn: the model has no BatchNorm2d layer whose statistics the "
                "generator could match; choose a model with BatchNorm (resnet10, norm: batch) or set "
                "algorithm.synthesis.bn: 0"
            ]
        return []


@register("algorithm", "dense")
class Dense:
    """DENSE: a generator against the client ensemble, an image pool, and KD into one model."""

    Config = DenseConfig
    # a job that names no model gets one with BatchNorm, which the statistics loss reads
    DEFAULT_MODEL = {"name": "resnet10", "width": 16}

    def __init__(self, config: DenseConfig) -> None:
        self.config = config

    def init(self, params: Params, info: RunInfo) -> ServerState[None]:
        shape = info.spec.input_shape
        if len(shape) != 3 or shape[1] % 4 or shape[2] % 4:
            raise ConfigError(
                [
                    f"algorithm.name: dense generates images (C, H, W) whose sides are multiples of 4; "
                    f"this dataset's inputs are {tuple(shape)}: choose an image dataset such as mnist"
                ]
            )
        return init_state(params, info, None)

    def client_update(self, ctx: ClientContext[None, None]) -> ClientResult[Params, None]:
        return keep_local_model(ctx, self.config.local)

    def protocol(
        self, services: Services[Gathered[ClientResult[Params, None]]], state: ServerState[None]
    ) -> ServerState[None]:
        config, info = self.config, services.info
        trained = local_models(services, state.params, config.local, config.cache_dir)
        teachers = [
            build_with_params(info.model, info.spec, P.from_numpy(trained.models[c]))
            for c in sorted(trained.models)
        ]
        start = average_models(trained, state.params) if config.student_init == "average" else state.params
        student = build_with_params(info.model, info.spec, start)
        if config.synthesis.bn > 0 and not any(isinstance(m, nn.BatchNorm2d) for m in student.modules()):
            raise ValueError(
                "dense: the model has no BatchNorm2d for the statistics loss; set algorithm.synthesis.bn: 0"
            )
        generator = Generator(config.synthesis.latent_dim, config.synthesis.width, info.spec.input_shape)
        optimizer = torch.optim.SGD(student.parameters(), lr=config.lr, momentum=0.9)
        rng = torch.Generator().manual_seed(info.seed)
        pool: list[torch.Tensor] = []
        targets: list[torch.Tensor] = []  # the ensemble's logits on the pool, batch for batch
        kd = generated = float("nan")
        with BatchNormStatistics(teachers) as statistics:
            for _ in range(config.epochs):
                images, generated = synthesize(
                    generator, teachers, student, statistics, config.synthesis, info.spec.num_classes, rng
                )
                pool.append(images)
                targets.append(pool_targets(teachers, images))
                kd = distill_on_pool(
                    student,
                    torch.cat(pool),
                    torch.cat(targets),
                    optimizer,
                    config.batch_size,
                    config.temperature,
                    rng,
                )
        own = student.state_dict()
        state = replace(state, params={k: own[k].detach().clone() for k in state.params})
        metrics = {
            "dense/pool_images": float(sum(len(b) for b in pool)),
            "dense/kd_loss": kd,
            "dense/generator_loss": generated,
        }
        services.log(trained.summary | metrics | services.evaluate(state, 0), 0)
        return state
