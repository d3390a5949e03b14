"""The fastest layout of a GPU node's workers (``resources.gpus_per_worker: auto`` with
``engine.vectorize: auto``): how many workers share each card, chosen from a short measurement
of each candidate, not from memory alone.

Memory bounds the count (each worker's slice must hold one client's training and its CUDA
context) and so do the node's CPUs; below that bound a card is tried with 1, 2, 4, ... workers.
One worker a card trains its clients in large chunks; several overlap their host work (Python,
kernel launches, the driver's copies) while the card time-slices between them. Which wins depends
on the model, the clients' sizes and the driver's share of a round, so each candidate is timed
(``layout_timing.time_layouts``) and the most clients a second wins. These functions are pure:
the timings come in, so the choice is tested without a GPU.

Usage:
    layouts = candidates(fits_per_card=12, cpus_per_card=16)   # 1, 2, 4 and 8 workers a card
    timings = time_layouts(...)                                 # one LayoutTiming each
    best = choose(timings)
    tags = layout_tags(best, timings)                           # the run's MLflow tags
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MAX_PER_CARD = 8  # past this many processes a card spends more on switching contexts than it gains
ENGINE_SHAPE = ("cohort_size", "vectorize", "vectorize_chunk", "max_client_examples")
TIMED_ROUNDS = 1  # after one warm-up round (CUDA start-up, kernel selection)


@dataclass(frozen=True)
class Layout:
    """How many workers share each card (each holding ``1 / workers_per_card`` of it)."""

    workers_per_card: int

    @property
    def share(self) -> float:
        """The ``resources.gpus_per_worker`` of this layout, in Ray's 1/10,000ths, rounded down."""
        return max(1, 10_000 // self.workers_per_card) / 10_000


@dataclass(frozen=True)
class LayoutTiming:
    """One candidate measured: its timed round's seconds for ``clients`` clients."""

    layout: Layout
    round_s: float
    clients: int

    @property
    def clients_per_s(self) -> float:
        return self.clients / self.round_s if self.round_s > 0 else 0.0


def candidates(fits_per_card: int, cpus_per_card: int) -> list[Layout]:
    """1, 2, 4, ... workers a card, up to what the card's memory (``fits_per_card``: workers
    whose measured peak fits), the node's CPUs per card and ``MAX_PER_CARD`` allow; at least one."""
    most = max(1, min(fits_per_card, cpus_per_card, MAX_PER_CARD))
    counts = [1 << i for i in range(most.bit_length()) if 1 << i <= most]
    return [Layout(n) for n in counts]


def choose(timings: list[LayoutTiming]) -> LayoutTiming:
    """The candidate with the most clients a second; a tie goes to fewer workers a card (less
    memory, fewer processes).

    Raises:
        ValueError: no timings.
    """
    if not timings:
        raise ValueError("no layout was measured")
    return max(timings, key=lambda t: (t.clients_per_s, -t.layout.workers_per_card))


def layout_tags(best: LayoutTiming, timings: list[LayoutTiming]) -> dict[str, str]:
    """The run's tags: the chosen layout and every candidate's measured clients/s."""
    tags = {
        "gpus_per_worker": f"{best.layout.share:g}",
        "gpu_workers_per_card": str(best.layout.workers_per_card),
        "gpu_layout_clients_per_s": f"{best.clients_per_s:.1f}",
    }
    for t in timings:
        tags[f"gpu_layout_{t.layout.workers_per_card}_per_card_clients_per_s"] = f"{t.clients_per_s:.1f}"
    return tags


def describe_choice(best: LayoutTiming, timings: list[LayoutTiming], cached: bool = False) -> str:
    """The console line: each candidate's clients/s and the one chosen."""
    measured = ", ".join(f"{t.layout.workers_per_card} a card {t.clients_per_s:,.1f}" for t in timings)
    source = "as measured before on this machine for this job's shape" if cached else "measured"
    return (
        f"resources.gpus_per_worker: auto: {best.layout.workers_per_card} worker(s) per GPU, "
        f"{best.layout.share:g} each, the fastest of the layouts {source} (clients/s: {measured})"
    )


def layout_record(best: LayoutTiming, timings: list[LayoutTiming], key: dict[str, Any]) -> dict[str, Any]:
    """What the run's folder and the cache keep of a choice (JSON)."""
    return {
        "chosen": asdict(best) | {"clients_per_s": best.clients_per_s},
        "measured": [asdict(t) | {"clients_per_s": t.clients_per_s} for t in timings],
        "shape": key,
    }


def from_record(record: dict[str, Any]) -> tuple[LayoutTiming, list[LayoutTiming]]:
    """A cached record's choice and timings."""

    def timing(raw: dict[str, Any]) -> LayoutTiming:
        return LayoutTiming(Layout(**raw["layout"]), float(raw["round_s"]), int(raw["clients"]))

    return timing(record["chosen"]), [timing(t) for t in record["measured"]]


def shape_key(job: dict[str, Any], card: str, cards: int, cpus: float) -> dict[str, Any]:
    """What a layout's speed depends on: the machine (card, their count, CPUs) and the job's
    shape (data, model, local training, cohort, chunking, precision), not its name or seed."""
    engine = job.get("engine", {})
    resources = job.get("resources", {})
    return {
        "card": card,
        "cards": cards,
        "cpus": cpus,
        "dataset": job.get("dataset"),
        "model": job.get("model"),
        "algorithm": job.get("algorithm"),
        "engine": {k: engine.get(k) for k in ENGINE_SHAPE},
        "resources": {k: resources.get(k) for k in ("cpus_per_worker", "precision", "deterministic")},
    }


def cache_path(key: dict[str, Any]) -> Path:
    """Where a machine keeps the choice for one job shape: ``$RAYSIM_CACHE/layouts``, else
    ``~/.cache/raysim/layouts``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    root = Path(os.environ.get("RAYSIM_CACHE") or Path.home() / ".cache" / "raysim")
    return root / "layouts" / f"{digest}.json"


def read_cached(key: dict[str, Any]) -> dict[str, Any] | None:
    """The cached record of this shape, if any and readable (a damaged one is measured again)."""
    try:
        record: dict[str, Any] = json.loads(cache_path(key).read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("shape") == json.loads(json.dumps(key, default=str)) else None


def write_record(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
