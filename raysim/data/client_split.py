"""Which of each client's rows are its test rows, when the plain rule (a random ``test_fraction``,
``raysim.data.format``) is not what a paper's code does.

- ``stratified_test_rows``: each client's test rows drawn class by class, so that its train and
  test splits hold its labels in the same proportions (the LSS code's per-client 75/25
  ``train_test_split(..., stratify=y)``, Chen et al., NeurIPS 2024, arXiv:2410.23660).
- A recipe whose source fixes the split (DomainNet's official lists) gives a boolean column
  ``is_test`` instead (``given_test_rows``).

Either way a client keeps the number of test rows the plain rule gives it, or the source's count.

Usage:
    is_test = stratified_test_rows(partition, labels, test_fraction=0.25, seed=0)
    is_test[partition.order]      # the test rows of each client, in partition order
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from raysim.data.format import split_sizes
from raysim.data.partition import Partition
from raysim.errors import DataError
from raysim.types import DataSpec

# The stratified draw takes its own stream, apart from the partition's and the shuffle's.
STRATIFY_STREAM = 2
IS_TEST_COLUMN = "is_test"


def choose_test_rows(
    table: pa.Table, spec: DataSpec, partition: Partition, test_fraction: float, seed: int, stratify: bool
) -> np.ndarray | None:
    """(num_rows,) bool: the rows the source (``is_test``) or a stratified split puts in test;
    None: the plain rule (a client's first rows after its shuffle are its train rows).

    Raises:
        DataError: ``is_test`` is not boolean, or ``stratify`` without class labels.
    """
    given = given_test_rows(table)
    if given is not None or not stratify:
        return given
    if "y" not in table.column_names or spec.task != "classification":
        raise DataError("dataset.stratify_test: a stratified split needs class labels (column 'y')")
    return stratified_test_rows(partition, table.column("y").to_numpy(), test_fraction, seed)


def num_test_rows(
    partition: Partition, order: np.ndarray, is_test: np.ndarray | None, test_fraction: float
) -> np.ndarray:
    """(num_clients,) test rows per client: the plain rule's, or the ``is_test`` rows of each
    client's run of ``order``.

    Raises:
        DataError: the source's split leaves a client no training row (it could not train).
    """
    if is_test is None:
        return split_sizes(partition.sizes, test_fraction)[1]
    tests_before = np.concatenate([[0], np.cumsum(is_test[order], dtype=np.int64)])
    num_test = tests_before[partition.offsets[1:]] - tests_before[partition.offsets[:-1]]
    no_train = np.flatnonzero((num_test == partition.sizes) & (partition.sizes > 0))
    if len(no_train):
        raise DataError(
            f"{len(no_train)} clients (the first: client {no_train[0]}) hold only test rows of the "
            "source's train/test split and could not train; give each client more rows (fewer "
            "dataset.partition.clients_per_domain, a larger min_size) or set dataset.source_split: false"
        )
    return num_test


def stratified_test_rows(
    partition: Partition, labels: np.ndarray, test_fraction: float, seed: int
) -> np.ndarray:
    """(num_rows,) bool: the test rows of a split stratified by label within each client.

    A client with n rows keeps t test rows (the plain rule, ``split_sizes``). Class c, with n_c
    of its rows, gives floor(n_c * t / n) of them; the rows left over by the flooring go one each
    to the classes with the largest remainders (ties: the lowest label). Within a class, which
    rows go is a seeded random choice.
    """
    num_classes = int(labels.max()) + 1 if len(labels) else 1
    num_clients = partition.num_clients
    _, num_test = split_sizes(partition.sizes, test_fraction)
    client_of_row = np.repeat(np.arange(num_clients), partition.sizes)  # aligned with partition.order
    groups, group_of_row, group_sizes = np.unique(
        client_of_row * num_classes + labels[partition.order], return_inverse=True, return_counts=True
    )
    client = groups // num_classes  # groups ascend by client, then by label
    scaled = group_sizes * num_test[client]  # integers: the quota's remainder is exact
    take = scaled // partition.sizes[client]
    remainder = scaled % partition.sizes[client]
    short = num_test - np.bincount(client, weights=take, minlength=num_clients).astype(np.int64)
    by_remainder = np.lexsort((np.arange(len(groups)), -remainder, client))
    first_of_client = np.searchsorted(client[by_remainder], client[by_remainder])
    rank_in_client = np.arange(len(groups)) - first_of_client
    take[by_remainder] += rank_in_client < short[client[by_remainder]]
    rng = np.random.default_rng([seed, STRATIFY_STREAM])
    shuffled = rng.permutation(len(group_of_row))
    grouped = shuffled[np.argsort(group_of_row[shuffled], kind="stable")]  # positions by group
    rank_in_group = np.arange(len(grouped)) - np.repeat(np.cumsum(group_sizes) - group_sizes, group_sizes)
    is_test = np.zeros(len(labels), bool)
    is_test[partition.order[grouped[rank_in_group < np.repeat(take, group_sizes)]]] = True
    return is_test


def given_test_rows(table: pa.Table) -> np.ndarray | None:
    """(num_rows,) bool of the table's ``is_test`` column, or None when it has none.

    Raises:
        DataError: the column is not boolean or has missing values.
    """
    if IS_TEST_COLUMN not in table.column_names:
        return None
    column = table.column(IS_TEST_COLUMN)
    if not pa.types.is_boolean(column.type) or column.null_count:
        raise DataError(
            f"column {IS_TEST_COLUMN!r} must be boolean without missing values, got {column.type}"
        )
    return column.to_numpy()
