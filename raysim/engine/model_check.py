"""A job's model against its data, before any worker or MLflow run starts: one forward pass on two
rows of the store.

A model that cannot read the data's inputs (a CNN with a fixed first layer for 1x28x28 images on
3x32x32 ones), that returns another number of classes (a 10-class head on a 100-class store) or
whose token embedding is smaller than the data's vocabulary would otherwise fail in every client
of round 0, after the workers and the MLflow run had started. Here it is a ``ConfigError``
naming the model, the dataset and the mismatch.

The batch is the store's first two rows, decoded as clients get them. Token inputs are cut to
``CHECK_TOKENS`` positions (a transformer's cost grows with the length; a model that needs the
full length is retried with it before it is judged), and their last token is set to the largest
id the data holds, so that an embedding too small for the vocabulary fails here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from raysim.config import JobConfig
from raysim.data.store import ClientStore
from raysim.errors import ConfigError
from raysim.plugin_defaults import model_problems, models_problems
from raysim.types import DataSpec

BATCH = 2
CHECK_TOKENS = 16


def check_model_fits(model: nn.Module, store: ClientStore, model_name: str, dataset_name: str) -> None:
    """Runs ``model`` on a batch of ``store``'s inputs and checks its output's shape.

    Leaves the model's weights, buffers, training mode and torch's random state as they were.

    Raises:
        ConfigError: the forward pass fails or its output does not have the shape the task needs.
    """
    spec, vocab = store.spec, token_vocabulary(store)
    full = _inputs(store, vocab)
    tries = (
        [full[:, :CHECK_TOKENS].clone(), full]
        if _is_tokens(full) and full.shape[1] > CHECK_TOKENS
        else [full]
    )
    if vocab is not None:
        for x in tries:
            x[-1, -1] = vocab - 1
    error: Exception | None = None
    for x in tries:
        try:
            output = _forward(model, x)
        except Exception as exc:  # any failure on the data's own shape is the model's mismatch
            error = error or exc
            continue
        problem = _output_problem(output, x, spec)
        if problem is None:
            return
        raise ConfigError([_message(model_name, dataset_name, spec, problem)])
    assert error is not None
    raise ConfigError([_message(model_name, dataset_name, spec, _failure(model, tries[0], vocab, error))])


def token_vocabulary(store: ClientStore) -> int | None:
    """The number of token ids the data may hold: the tokenizer's vocabulary (text stores, and a
    language model's classes), else one more than the largest id (token classification stores
    record it); None for inputs that are not tokens."""
    meta = store.meta
    tokenizer = meta.get("tokenizer")
    if isinstance(tokenizer, dict) and isinstance(tokenizer.get("vocab_size"), int):
        return int(tokenizer["vocab_size"])
    if store.spec.task == "causal_lm":
        return store.spec.num_classes
    if isinstance(meta.get("max_token_id"), int):
        return int(meta["max_token_id"]) + 1
    return None


def _inputs(store: ClientStore, vocab: int | None) -> torch.Tensor:
    """(BATCH, *input_shape) inputs from the store's first rows (zeros for an empty store)."""
    x = store.first_rows(BATCH).arrays["x"]
    if len(x) == 0:
        dtype = np.int64 if vocab is not None else np.float32
        x = np.zeros((BATCH, *store.spec.input_shape), dtype)
    return torch.from_numpy(np.resize(x, (BATCH, *x.shape[1:])))  # repeats a lone row


def _is_tokens(x: torch.Tensor) -> bool:
    return not torch.is_floating_point(x) and x.dim() == 2


def _forward(model: nn.Module, x: torch.Tensor) -> Any:
    """``model(x)`` in eval mode, without gradients or a trace in torch's random state."""
    was_training = model.training
    model.eval()  # batch norm neither learns from this batch nor needs more than one row
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            return model(x)
    finally:
        model.train(was_training)


def _output_problem(output: Any, x: torch.Tensor, spec: DataSpec) -> str | None:
    """What is wrong with the output's shape for ``spec.task``, or None."""
    if not isinstance(output, torch.Tensor):
        return f"it returns a {type(output).__name__}, not a tensor of outputs"
    rows, width = x.shape[0], spec.num_classes
    expected = (rows, x.shape[1], width) if spec.task == "causal_lm" else (rows, width)
    shape = tuple(output.shape)
    if shape == expected or (spec.task == "regression" and width == 1 and shape == (rows,)):
        return None
    return f"on inputs of shape {tuple(x.shape)} it returns {shape}, where the data needs {expected}"


def _failure(model: nn.Module, x: torch.Tensor, vocab: int | None, error: Exception) -> str:
    """Why the forward pass failed: a vocabulary too small, or the error itself."""
    if vocab is not None and _takes_token(model, x, 0):
        low, high = 0, vocab - 1  # the model takes id ``low`` and not ``high``: bisect
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if _takes_token(model, x, middle) else (low, middle)
        return (
            f"its token embedding takes ids below {high}, the data's vocabulary has {vocab} "
            f"({type(error).__name__}: {error}); give the model {vocab} token ids "
            f"(hf_classifier: model.vocab_size={vocab})"
        )
    return (
        f"it fails on inputs of shape {tuple(x.shape)} ({x.dtype}) like the data's: "
        f"{type(error).__name__}: {error}"
    )


def _takes_token(model: nn.Module, x: torch.Tensor, token: int) -> bool:
    """Whether the model runs on a batch shaped like ``x`` of nothing but ``token``."""
    try:
        _forward(model, torch.full_like(x, token))
    except Exception:
        return False
    return True


def _message(model_name: str, dataset_name: str, spec: DataSpec, problem: str) -> str:
    outputs = {"classification": "classes", "regression": "outputs", "causal_lm": "token vocabulary"}
    what = f"{spec.task}, input {spec.input_shape}, {spec.num_classes} {outputs[spec.task]}"
    return f"model: {model_name!r} does not fit dataset {dataset_name!r} ({what}): {problem}"


def check_plugin_model(job: JobConfig, model: nn.Module) -> None:
    """The algorithm Config's optional ``check_model(model) -> list[str]``: the checks that need
    the job's built model (FuseFL's split points), on the driver before any worker starts.

    Raises:
        ConfigError: the problems it names.
    """
    problems = model_problems(job.algorithm.config, model)
    if problems:
        raise ConfigError(problems)


def check_model_groups(job: JobConfig, store: ClientStore) -> tuple[dict[str, Any], ...]:
    """Each client's model section (``model_groups``; empty without them), after the checks a
    group's model needs before any worker starts: it fits the data, every group has a client, the
    algorithm's ``check_model`` passes on it, and for mixed architectures its ``check_models``
    (FuseFL: the split points align) and no ``engine.vectorize: on`` (a chunk trains one model).

    Raises:
        ConfigError: every problem found, with its ``model_groups`` key.
    """
    from raysim.runtime.builders import build_section_model

    groups = job.model_groups
    if groups is None:
        return ()
    problems = groups.empty_groups(store.num_clients, job.seed)
    if groups.is_mixed and job.engine.vectorize == "on":
        problems.append(
            "engine.vectorize: on trains one architecture per chunk, but model_groups mixes several; "
            "set engine.vectorize=off"
        )
    models = []
    for i, group in enumerate(groups.models):
        model = build_section_model(job, group.to_dict(), store.spec)
        check_model_fits(model, store, group.name, job.dataset.name)
        problems += [f"model_groups.models[{i}]: {p}" for p in model_problems(job.algorithm.config, model)]
        models.append(model)
    if groups.is_mixed and not problems:
        problems += models_problems(job.algorithm.config, models, store.spec)
    if problems:
        raise ConfigError(problems)
    return groups.client_models(store.num_clients, job.seed)
