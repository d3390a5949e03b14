"""Per-domain accuracy: the global model's client evaluation grouped by the clients' domains.

A store partitioned by domain (``domain`` or ``domain_dirichlet``) names each client's domain
(``ClientStore.client_key``). The evaluated clients' test rows are then pooled per domain, as
``eval/clients/*`` pools them all: ``eval/domain/<name>/accuracy`` (and ``loss``) is the
accuracy over the test examples of that domain's evaluated clients, and
``eval/domain/accuracy_mean`` the unweighted mean over domains, the number IMA reports for
Digit-Five and PACS (Zhou et al., IEEE TMC 2024, arXiv:2305.07845).

Usage:
    domain_of = client_domains(store, plan.clients)   # {} unless the partition is by domain
    metrics = summarize_domains(rows, domain_of)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from raysim.data.store import ClientStore
from raysim.measure import scores
from raysim.measure.pooling import pool_rows
from raysim.types import Metrics

DOMAIN_PARTITIONS = frozenset({"domain", "domain_dirichlet"})
_NOT_METRICS = frozenset({"client_id", "num_examples"})


def client_domains(store: ClientStore, clients: np.ndarray) -> dict[int, str]:
    """The domain of each of ``clients``; empty unless the store's partition is by domain."""
    partition = store.meta.get("config", {}).get("partition", {})
    if partition.get("kind") not in DOMAIN_PARTITIONS:
        return {}
    return {int(c): store.client_key(int(c)) for c in clients}


def summarize_domains(per_client: list[Metrics], domain_of: Mapping[int, str]) -> Metrics:
    """``eval/domain/<name>/<metric>`` per domain of the rows' clients (examples pooled, as
    ``raysim.measure.pooling.pool_rows``), and ``eval/domain/accuracy_mean`` over the domains.

    Rows carry ``client_id`` (``raysim.engine.evaluation.evaluate_clients``); a client outside
    ``domain_of`` is left out. Empty when ``domain_of`` is.
    """
    by_domain: dict[str, list[Metrics]] = {}
    for row in per_client:
        domain = domain_of.get(int(row["client_id"]))
        if domain is not None:
            by_domain.setdefault(domain, []).append(row)
    out: Metrics = {}
    for domain, rows in sorted(by_domain.items()):
        pooled = pool_rows(rows)
        if pooled is not None:
            reported = scores.without_sums(pooled)
            out |= {f"eval/domain/{domain}/{k}": v for k, v in reported.items() if k not in _NOT_METRICS}
    accuracies = [v for k, v in out.items() if k.endswith("/accuracy")]
    if accuracies:
        out["eval/domain/accuracy_mean"] = float(np.mean(accuracies))
    return out
