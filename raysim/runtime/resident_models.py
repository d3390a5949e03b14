"""A worker's resident models: the job's, built once, and one per other architecture it meets (the
job's model groups, a ``map_clients`` request's model section), each built once and then kept.

A client trains on its architecture's resident model. With mixed architectures no broadcast
travels, so each client starts from its architecture's own initial weights (the run seed's),
restored in place as a broadcast would be.

Usage:
    models = ResidentModels(job, spec, num_clients, device)
    model = models.of_client(client_id)      # the client's architecture, resident
    models.restore_initial(client_id)        # its initial weights, where architectures mix
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from raysim import params as P
from raysim.config import JobConfig
from raysim.config.model_groups import model_key
from raysim.runtime.builders import build_job_model, build_section_model
from raysim.types import DataSpec, Params


class ResidentModels:
    """The models a worker keeps by their section's key (``model_key``)."""

    def __init__(self, job: JobConfig, spec: DataSpec, num_clients: int, device: torch.device) -> None:
        self.job, self.spec, self.device = job, spec, device
        self.model = build_job_model(job, spec).to(device)
        self.section = job.model.to_dict()  # dumped once: every client's context names it
        self.models: dict[str, nn.Module] = {model_key(self.section): self.model}
        groups = job.model_groups
        self.client_models = () if groups is None else groups.client_models(num_clients, job.seed)
        for section in {model_key(s): s for s in self.client_models}.values():
            self.for_section(section)  # each group's model seeded as the job's model
        self.mixes = len(self.models) > 1  # the job's model and others: no broadcast, no chunks
        self.initial: dict[str, Params] = (
            {key: P.clone(P.model_params(m)) for key, m in self.models.items()} if self.mixes else {}
        )

    def for_section(self, section: dict[str, Any] | None) -> nn.Module:
        """The job's model (None), or the resident model of another architecture."""
        if section is None:
            return self.model
        key = model_key(section)
        if key not in self.models:
            self.models[key] = build_section_model(self.job, section, self.spec).to(self.device)
        return self.models[key]

    def section_of(self, client_id: int) -> dict[str, Any]:
        """The model section of the client's architecture."""
        return self.client_models[client_id] if self.client_models else self.section

    def of_client(self, client_id: int) -> nn.Module:
        """The resident model of the client's architecture (the job's model without model groups)."""
        return self.for_section(self.client_models[client_id]) if self.client_models else self.model

    def restore_initial(self, client_id: int) -> None:
        """The client's architecture's initial weights, in place (mixed architectures only)."""
        if self.initial:
            P.load_into(self.of_client(client_id), self.initial[model_key(self.section_of(client_id))])
