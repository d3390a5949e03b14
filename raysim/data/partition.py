"""Partitioners: split the rows of a source table into clients.

Every partitioner returns a CSR-style ``Partition``: one permutation of row indices (``order``) in
which each client's rows are contiguous, plus the number of rows per client (``sizes``). It is
computed with a handful of vectorised sorts, O(n log n) in the number of rows, so that grouping a
dataset by a key never filters the table once per client (Flower's NaturalIdPartitioner took ~60 h
on FEMNIST that way).

All randomness comes from ``np.random.default_rng(seed)``, so a (config, seed) pair always yields
the same clients.

Usage:
    config = DirichletPartition(num_clients=100, alpha=0.5)
    part = partition(config, labels=y, keys=None, seed=0)
    rows_of_client_3 = part.rows(3)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from raysim.errors import DataError

MAX_DIRICHLET_TRIES = 1000


class IidPartition(BaseModel, frozen=True, extra="forbid"):
    """Shuffle the rows, then split them as evenly as possible (sizes differ by at most one)."""

    kind: Literal["iid"] = "iid"
    num_clients: PositiveInt = 100


class DirichletPartition(BaseModel, frozen=True, extra="forbid"):
    """Label skew: each class's rows are spread over the clients by proportions ~ Dir(alpha).

    Smaller ``alpha`` gives more skew. Draws repeat until every client holds ``min_size`` rows.
    With ``max_size``, no client holds more: classes are dealt out in label order and a client
    at the cap gets no share of later classes. That is the balance rule of the "hetero-dir"
    partitioners FuseFL and IMA use (Yurochkin et al.'s, with a threshold of rows / clients and
    min_size 10; Tang et al., NeurIPS 2024, arXiv:2410.20380; Zhou et al., IEEE TMC 2024,
    arXiv:2305.07845). There the class
    that crosses the threshold may overshoot it, so sizes stay unequal; here the cap is hard:
    rows that would take a client past it go to the clients with room, in proportion to their
    draw. (max_size = rows / clients therefore gives every client the same size.)
    """

    kind: Literal["dirichlet"] = "dirichlet"
    num_clients: PositiveInt = 100
    alpha: PositiveFloat = 0.5
    min_size: NonNegativeInt = 10
    # Left out of dumps when unset: the store cache path hashes the dump, and stores prepared
    # before max_size existed must keep theirs.
    max_size: PositiveInt | None = Field(None, exclude_if=lambda value: value is None)

    @model_validator(mode="after")
    def _max_size_not_below_min_size(self) -> "DirichletPartition":
        if self.max_size is not None and self.max_size < self.min_size:
            raise ValueError(f"max_size ({self.max_size}) must be at least min_size ({self.min_size})")
        return self


class ShardsPartition(BaseModel, frozen=True, extra="forbid"):
    """McMahan et al.'s pathological non-iid split (arXiv:1602.05629).

    Rows are sorted by label and cut into ``num_clients * classes_per_client`` equal shards; each
    client gets ``classes_per_client`` shards at random. As in the paper, a client may receive two
    shards of the same class, so it holds *at most* ``classes_per_client`` distinct classes.
    """

    kind: Literal["shards"] = "shards"
    num_clients: PositiveInt = 100
    classes_per_client: PositiveInt = 2


class NaturalPartition(BaseModel, frozen=True, extra="forbid"):
    """One client per distinct value of a key column (speaker, user, URL host), in sorted order."""

    kind: Literal["natural"] = "natural"
    column: str


class DomainPartition(BaseModel, frozen=True, extra="forbid"):
    """Feature shift: each client holds rows of one domain; a domain is split iid over
    ``clients_per_domain`` clients. Domains are taken in sorted order."""

    kind: Literal["domain"] = "domain"
    column: str
    clients_per_domain: PositiveInt = 1


class DomainDirichletPartition(BaseModel, frozen=True, extra="forbid"):
    """Feature and label skew (IMA's Digit-Five/PACS "+FS" rows, Zhou et al., IEEE TMC 2024,
    arXiv:2305.07845): each domain, in sorted order, gets ``clients_per_domain`` clients and is split
    over them by Dirichlet(alpha) label skew, as ``dirichlet`` splits a whole dataset (each of
    its clients holds ``min_size`` rows)."""

    kind: Literal["domain_dirichlet"] = "domain_dirichlet"
    column: str
    clients_per_domain: PositiveInt = 20
    alpha: PositiveFloat = 0.1
    min_size: NonNegativeInt = 10


PartitionConfig = Annotated[
    IidPartition
    | DirichletPartition
    | ShardsPartition
    | NaturalPartition
    | DomainPartition
    | DomainDirichletPartition,
    Field(discriminator="kind"),
]


@dataclass(frozen=True)
class Partition:
    """Rows per client in CSR form.

    Attributes:
        order: row indices of the source table (int64); client 0's rows first, each client's
            rows contiguous.
        sizes: rows per client (int64), one entry per client.
        keys: the natural id or domain name of each client, or None.
    """

    order: np.ndarray
    sizes: np.ndarray
    keys: list[str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", np.asarray(self.order, dtype=np.int64))
        object.__setattr__(self, "sizes", np.asarray(self.sizes, dtype=np.int64))
        if self.order.ndim != 1 or self.sizes.ndim != 1:
            raise DataError("Partition.order and Partition.sizes must be 1-D arrays")
        if (self.sizes < 0).any() or int(self.sizes.sum()) != len(self.order):
            raise DataError(
                f"Partition.sizes must be non-negative and sum to len(order)={len(self.order)}, "
                f"got sum {int(self.sizes.sum())}"
            )
        if self.keys is not None and len(self.keys) != len(self.sizes):
            raise DataError(f"Partition.keys has {len(self.keys)} entries for {len(self.sizes)} clients")

    @property
    def num_clients(self) -> int:
        return len(self.sizes)

    @property
    def offsets(self) -> np.ndarray:
        """(num_clients + 1,) start of each client's rows in ``order``, then the end."""
        return np.concatenate([[0], np.cumsum(self.sizes)])

    def rows(self, client_id: int) -> np.ndarray:
        """Source row indices of one client."""
        start = int(self.sizes[:client_id].sum())
        return self.order[start : start + int(self.sizes[client_id])]


def partition(
    config: PartitionConfig,
    labels: np.ndarray | None,
    keys: np.ndarray | None,
    seed: int,
    *,
    num_rows: int | None = None,
) -> Partition:
    """Splits rows into clients as ``config`` says.

    Args:
        config: which partitioner and its settings.
        labels: (n,) integer labels; required by ``dirichlet`` and ``shards``.
        keys: (n,) values of ``config.column``; required by ``natural`` and ``domain``.
        seed: seeds every random choice.
        num_rows: the number of rows, for ``iid`` on data with neither labels nor keys.

    Returns:
        The partition; every row is used exactly once.

    Raises:
        DataError: a required column is missing, or the setting cannot be met by the data.
    """
    rng = np.random.default_rng(seed)
    if isinstance(config, IidPartition):
        num_rows = _num_rows(labels, keys, num_rows)
        _check_enough_rows(config.num_clients, num_rows, "iid")
        return _iid(rng.permutation(num_rows), config.num_clients)
    if isinstance(config, DirichletPartition):
        return _dirichlet(config, _require(labels, config.kind, "labels (column 'y')"), rng)
    if isinstance(config, ShardsPartition):
        return _shards(config, _require(labels, config.kind, "labels (column 'y')"), rng)
    if isinstance(config, NaturalPartition):
        return _natural(_require(keys, config.kind, f"the key column {config.column!r}"))
    if isinstance(config, DomainPartition):
        return _domain(config, _require(keys, config.kind, f"the key column {config.column!r}"), rng)
    if isinstance(config, DomainDirichletPartition):
        keys = _require(keys, config.kind, f"the key column {config.column!r}")
        return _domain_dirichlet(config, _require(labels, config.kind, "labels (column 'y')"), keys, rng)
    raise DataError(f"unknown partition config {config!r}")


def stratified_holdout(labels: np.ndarray, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Picks ``size`` rows with the class proportions of ``labels`` (largest-remainder rounding).

    Returns:
        (kept, held_out): ascending row indices; together they cover every row once.
    """
    if not 0 <= size <= len(labels):
        raise DataError(f"cannot hold out {size} of {len(labels)} rows")
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    quota = counts * size / len(labels)
    take = np.floor(quota).astype(np.int64)
    # Give the rows lost to flooring to the classes with the largest remainders (ties: lowest).
    short = size - int(take.sum())
    take[np.argsort(-(quota - take), kind="stable")[:short]] += 1
    grouped = _group_shuffled(inverse, np.random.default_rng(seed))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(len(labels)) - np.repeat(starts, counts)  # position within its class
    is_held = rank < np.repeat(take, counts)
    return np.sort(grouped[~is_held]), np.sort(grouped[is_held])


def _iid(rows: np.ndarray, num_clients: int) -> Partition:
    """Splits shuffled ``rows`` into ``num_clients`` runs; the first ones get the spare rows."""
    return Partition(rows, _even_sizes(len(rows), num_clients))


def _dirichlet(config: DirichletPartition, labels: np.ndarray, rng: np.random.Generator) -> Partition:
    k, num_rows = config.num_clients, len(labels)
    if k * config.min_size > num_rows:
        raise DataError(
            f"dirichlet partition: {k} clients x min_size {config.min_size} needs "
            f"{k * config.min_size} rows but the data has {num_rows}; lower partition.min_size "
            "or partition.num_clients"
        )
    if config.max_size is not None and k * config.max_size < num_rows:
        raise DataError(
            f"dirichlet partition: {k} clients x max_size {config.max_size} hold at most "
            f"{k * config.max_size} rows but the data has {num_rows}; raise partition.max_size "
            "or partition.num_clients"
        )
    _, inverse, class_counts = np.unique(labels, return_inverse=True, return_counts=True)
    grouped = _group_shuffled(inverse, rng)  # rows by class, shuffled within each class
    for _ in range(MAX_DIRICHLET_TRIES):
        proportions = rng.dirichlet(np.full(k, config.alpha), size=len(class_counts))
        if config.max_size is None:
            counts = _split_counts(proportions, class_counts)  # (classes, clients)
        else:
            counts = _capped_counts(proportions, class_counts, config.max_size)
        if counts.sum(axis=0).min() >= config.min_size:
            client_of_row = np.repeat(np.tile(np.arange(k), len(class_counts)), counts.ravel())
            return Partition(grouped[np.argsort(client_of_row, kind="stable")], counts.sum(axis=0))
    raise DataError(
        f"dirichlet partition: no draw in {MAX_DIRICHLET_TRIES} gave every one of {k} clients at "
        f"least {config.min_size} rows (alpha={config.alpha}, {num_rows} rows); lower "
        "partition.min_size, raise partition.alpha or use fewer partition.num_clients"
    )


def _capped_counts(proportions: np.ndarray, class_counts: np.ndarray, max_size: int) -> np.ndarray:
    """(classes, clients) rows per client as ``_split_counts`` gives them, but dealt class by
    class so that no client passes ``max_size`` (needs clients x max_size >= all rows)."""
    counts = np.zeros(proportions.shape, dtype=np.int64)
    room = np.full(proportions.shape[1], max_size, dtype=np.int64)
    for c, (shares, num_rows) in enumerate(zip(proportions, class_counts, strict=True)):
        counts[c] = _fill(shares, int(num_rows), room)
        room -= counts[c]
    return counts


def _fill(shares: np.ndarray, num_rows: int, room: np.ndarray) -> np.ndarray:
    """``num_rows`` split by ``shares`` over the clients with room, none given more than its room.

    What a client cannot take is split again over the others with room, by their shares (by
    their room where those shares are all zero). Each pass places every row or fills a client,
    so with ``room.sum() >= num_rows`` it ends within one pass per client.
    """
    given = np.zeros(len(shares), dtype=np.int64)
    while (left := num_rows - int(given.sum())) > 0:
        has_room = np.flatnonzero(given < room)
        free = (room - given)[has_room]
        weights = shares[has_room] if shares[has_room].sum() > 0 else free.astype(np.float64)
        split = _split_counts((weights / weights.sum())[None], np.array([left]))[0]
        given[has_room] += np.minimum(split, free)
    return given


def _shards(config: ShardsPartition, labels: np.ndarray, rng: np.random.Generator) -> Partition:
    num_shards = config.num_clients * config.classes_per_client
    if num_shards > len(labels):
        raise DataError(
            f"shards partition: num_clients x classes_per_client = {num_shards} shards but the "
            f"data has only {len(labels)} rows; lower partition.num_clients or "
            "partition.classes_per_client"
        )
    _, inverse = np.unique(labels, return_inverse=True)
    by_label = _group_shuffled(inverse, rng)
    shard_of_row = np.repeat(np.arange(num_shards), _even_sizes(len(labels), num_shards))
    client_of_shard = np.empty(num_shards, dtype=np.int64)
    client_of_shard[rng.permutation(num_shards)] = np.arange(num_shards) // config.classes_per_client
    client_of_row = client_of_shard[shard_of_row]
    order = by_label[np.argsort(client_of_row, kind="stable")]
    return Partition(order, np.bincount(client_of_row, minlength=config.num_clients))


def _natural(keys: np.ndarray) -> Partition:
    names, inverse, sizes = _unique(keys)
    return Partition(np.argsort(inverse, kind="stable"), sizes, [str(n) for n in names])


def _domain(config: DomainPartition, keys: np.ndarray, rng: np.random.Generator) -> Partition:
    names, inverse, domain_sizes = _unique(keys)
    per_domain = config.clients_per_domain
    if domain_sizes.min() < per_domain:
        small = str(names[int(np.argmin(domain_sizes))])
        raise DataError(
            f"domain partition: domain {small!r} has {domain_sizes.min()} rows, fewer than "
            f"partition.clients_per_domain={per_domain}; lower clients_per_domain"
        )
    order = _group_shuffled(inverse, rng)  # rows by domain, shuffled: an iid split of each domain
    sizes = np.concatenate([_even_sizes(int(n), per_domain) for n in domain_sizes])
    return Partition(order, sizes, [str(n) for n in names for _ in range(per_domain)])


def _domain_dirichlet(
    config: DomainDirichletPartition, labels: np.ndarray, keys: np.ndarray, rng: np.random.Generator
) -> Partition:
    """Each domain's rows split by ``_dirichlet`` over its own clients, one domain after another
    from the same ``rng``."""
    names, inverse, _ = _unique(keys)
    per_domain = config.clients_per_domain
    within = DirichletPartition(num_clients=per_domain, alpha=config.alpha, min_size=config.min_size)
    orders, sizes = [], []
    for d, name in enumerate(names):
        rows = np.flatnonzero(inverse == d)
        try:
            part = _dirichlet(within, labels[rows], rng)
        except DataError as e:  # its fix names this partition's key
            hint = str(e).replace("partition.num_clients", "partition.clients_per_domain")
            raise DataError(f"domain_dirichlet partition, domain {str(name)!r}: {hint}") from None
        orders.append(rows[part.order])
        sizes.append(part.sizes)
    return Partition(
        np.concatenate(orders), np.concatenate(sizes), [str(n) for n in names for _ in range(per_domain)]
    )


def _group_shuffled(group_of_row: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Row indices grouped by ascending group id, in random order within each group."""
    perm = rng.permutation(len(group_of_row))
    return perm[np.argsort(group_of_row[perm], kind="stable")]


def _split_counts(proportions: np.ndarray, num_rows: np.ndarray) -> np.ndarray:
    """(classes, clients) rows per client when each class's ``num_rows`` consecutive rows are cut
    at the cumulative ``proportions`` (classes, clients)."""
    num_rows = num_rows[:, None]
    cuts = np.floor(np.cumsum(proportions, axis=1)[:, :-1] * num_rows).astype(np.int64)
    zeros = np.zeros_like(num_rows)
    return np.diff(np.concatenate([zeros, np.minimum(cuts, num_rows), num_rows], axis=1), axis=1)


def _even_sizes(num_rows: int, num_parts: int) -> np.ndarray:
    """Sizes of ``num_parts`` runs covering ``num_rows``; the first ``num_rows % num_parts``
    runs get one row more."""
    sizes = np.full(num_parts, num_rows // num_parts, dtype=np.int64)
    sizes[: num_rows % num_parts] += 1
    return sizes


def _unique(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted distinct keys, each row's key index and the row count per key, in one sort."""
    try:
        return np.unique(np.asarray(keys), return_inverse=True, return_counts=True)
    except TypeError as e:  # e.g. None mixed with strings
        raise DataError(f"the key column has missing or mixed-type values: {e}") from e


def _require(values: np.ndarray | None, kind: str, what: str) -> np.ndarray:
    if values is None:
        raise DataError(f"{kind} partition needs {what}, which this dataset does not have")
    return np.asarray(values)


def _num_rows(labels: np.ndarray | None, keys: np.ndarray | None, num_rows: int | None) -> int:
    for known in (num_rows, labels, keys):
        if known is not None:
            return known if isinstance(known, int) else len(known)
    raise DataError("partition needs num_rows, labels or keys to know the number of rows")


def _check_enough_rows(num_clients: int, num_rows: int, kind: str) -> None:
    if num_clients > num_rows:
        raise DataError(
            f"{kind} partition: num_clients={num_clients} is more than the {num_rows} rows; "
            "lower partition.num_clients"
        )
