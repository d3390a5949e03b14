"""Cohort sampling and seed derivation: every random choice is a pure function of its inputs.

Seeds derive from ``(run seed, round_num, client_id)`` and a purpose tag, so results do not depend
on worker count, arrival order or what ran before; resuming needs only ``round_num``.

Usage:
    cohort = sample_cohort(num_clients=1000, cohort_size=50, seed=0, round_num=3)
    cohort = sample_poisson(num_clients=1000, rate=0.05, seed=0, round_num=3)  # of varying size
    seed = client_seed(0, 3, int(cohort[0]))
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeGuard

import numpy as np

from raysim.errors import ConfigError

# purpose tags keep the streams independent
_COHORT, _CLIENT, _EVAL, _HELDOUT, _VALIDATION, _GROUPS, _SERVER_NOISE, _CLIENT_NOISE = 1, 2, 3, 4, 5, 6, 7, 8
_SELECTION = 9  # a guided selection's draws (raysim.selection)
_COMPRESSION = 10  # random-k's and QSGD's draws (raysim.compress); 11-18: raysim.systems (17-18: async_clock)
_DOWNLOAD = 19  # the server's draws encoding its broadcast (raysim.compress.downlink)


def sample_cohort(num_clients: int, cohort_size: int, seed: int, round_num: int) -> np.ndarray:
    """Client ids drawn uniformly without replacement, in draw order."""
    if not 0 < cohort_size <= num_clients:
        raise ConfigError(
            [f"engine.cohort_size: must be in 1..{num_clients} (the number of clients), got {cohort_size}"]
        )
    rng = np.random.default_rng([seed, round_num, _COHORT])
    return rng.choice(num_clients, size=cohort_size, replace=False).astype(np.int64)


def selection_rng(seed: int, round_num: int) -> np.random.Generator:
    """The generator of every random choice a guided selection (``engine.selection``) makes in
    a round: a pure function of (seed, round), apart from the uniform draw's."""
    return np.random.default_rng([seed, round_num, _SELECTION])


def sample_poisson(num_clients: int, rate: float, seed: int, round_num: int) -> np.ndarray:
    """Each of ``num_clients`` independently with probability ``rate`` (Poisson sampling, what a
    privacy accountant's amplification assumes), as ids ascending; the cohort's size varies and
    may be 0."""
    if not 0 < rate <= 1:
        raise ConfigError(
            [f"engine.sampling: poisson samples each client with probability {rate}; it must be in (0, 1]"]
        )
    rng = np.random.default_rng([seed, round_num, _COHORT])
    return np.flatnonzero(rng.random(num_clients) < rate).astype(np.int64)


def poisson_rate(pool_size: int, cohort_size: int, bands: int = 1) -> float:
    """Each client's probability under Poisson sampling so that a round expects ``cohort_size``
    clients: ``cohort_size / pool_size``, or, when only one of ``bands`` groups may take part a
    round (DP-FTRL's cyclic sampling), ``cohort_size * bands / pool_size``. What the engine draws
    with and what the privacy accountant is told: one function, so the two cannot disagree.

    Raises:
        ConfigError: the rate would exceed 1 (the expected cohort is more than a group holds).
    """
    rate = cohort_size * bands / pool_size
    if rate > 1:
        raise ConfigError(
            [
                f"engine.cohort_size: {cohort_size} expected clients a round from groups of about "
                f"{pool_size / bands:.0f} ({pool_size} clients in {bands} bands) would need a sampling "
                f"probability above 1; lower engine.cohort_size or privacy.central.bands"
            ]
        )
    return rate


def cyclic_groups(num_clients: int, bands: int, seed: int) -> np.ndarray:
    """Each client's group in 0..bands-1 (DP-FTRL's cyclic sampling): a seeded permutation dealt
    round-robin, so group sizes differ by at most 1. Fixed for the run: a pure function of the seed."""
    if not 1 <= bands <= num_clients:
        raise ConfigError(
            [f"privacy.central.bands: {bands} groups need at least {bands} clients, not {num_clients}"]
        )
    order = np.random.default_rng([seed, _GROUPS]).permutation(num_clients)
    group_of = np.empty(num_clients, dtype=np.int64)
    group_of[order] = np.arange(num_clients) % bands
    return group_of


def eligible(group_of: np.ndarray, round_num: int, bands: int) -> np.ndarray:
    """The clients (ascending) of group ``round_num mod bands``: who may take part this round."""
    return np.flatnonzero(np.asarray(group_of) == round_num % bands).astype(np.int64)


def sample_cyclic_poisson(
    group_of: np.ndarray, bands: int, rate: float, seed: int, round_num: int
) -> np.ndarray:
    """Cyclic Poisson sampling: each client of the round's group independently with probability
    ``rate``, so a client takes part at most once in any ``bands`` consecutive rounds (the
    amplification ``raysim.privacy.banded_noise.banded_event`` accounts for)."""
    candidates = eligible(group_of, round_num, bands)
    return candidates[sample_poisson(len(candidates), rate, seed, round_num)]


def split_population(num_clients: int, heldout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training clients, held-out clients), both sorted; held-out clients never train."""
    num_heldout = int(round(num_clients * heldout_fraction))
    if heldout_fraction > 0 and not 0 < num_heldout < num_clients:
        raise ConfigError(
            [
                f"evaluation.heldout_fraction: {heldout_fraction} of {num_clients} clients "
                f"leaves no held-out or no training client"
            ]
        )
    if num_heldout == 0:  # what the permutation below gives, without its 8 bytes per client twice
        return np.arange(num_clients, dtype=np.int64), np.empty(0, np.int64)
    order = np.random.default_rng([seed, _HELDOUT]).permutation(num_clients)
    return np.sort(order[num_heldout:]).astype(np.int64), np.sort(order[:num_heldout]).astype(np.int64)


def split_validation(
    num_train: int, num_validation: int, seed: int, client_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, validation rows) of one client: positions in its stored training rows,
    each ascending; the validation rows a seeded choice of ``num_validation``."""
    order = np.random.default_rng([seed, client_id, _VALIDATION]).permutation(num_train)
    return np.sort(order[num_validation:]), np.sort(order[:num_validation])


def client_seed(seed: int, round_num: int, client_id: int) -> int:
    """A 63-bit seed for one client's work in one round."""
    return _seed_of([seed, round_num, client_id, _CLIENT])


def noise_seed(seed: int, round_num: int, client_id: int | None = None, salt: int = 0) -> int:
    """A 63-bit seed for a privacy mechanism's noise in one round: the server's (``client_id``
    None) or one client's, apart from every training and sampling stream. ``seed`` is the run's
    for the server's noise and local DP's; DP-SGD passes the client's training seed
    (``ClientContext.seed``), so each training a client runs draws its own noise, apart from its
    local DP noise. ``salt`` is the job's ``raysim.config.job.noise_salt``: runs of two jobs with one
    seed must not share noise, or the difference of their releases would cancel it. A simulation's
    noise is reproducible by design; a deployment draws it from a secure source."""
    if client_id is None:
        return _seed_of([seed, round_num, _SERVER_NOISE, salt])
    return _seed_of([seed, round_num, client_id, _CLIENT_NOISE, salt])


def compression_seed(seed: int, round_num: int, client_id: int) -> int:
    """A 63-bit seed for the draws that encode one client's update in one round (random-k's
    coordinates, QSGD's rounding): the server, holding the same three numbers, draws alike."""
    return _seed_of([seed, round_num, client_id, _COMPRESSION])


def download_seed(seed: int, round_num: int) -> int:
    """A 63-bit seed for the draws that encode the server's broadcast in one round: every client,
    holding the run seed and the round, draws alike (random-k's coordinates travel as no index)."""
    return _seed_of([seed, round_num, _DOWNLOAD])


def _seed_of(entropy: list[int]) -> int:
    state = np.random.SeedSequence(entropy).generate_state(2)
    return int((int(state[0]) << 31 ^ int(state[1])) & (2**63 - 1))


def sample_eval_clients(num_clients: int, max_clients: int | None, seed: int) -> np.ndarray:
    """The fixed set of clients whose test splits are evaluated (all, or a seeded subset)."""
    if max_clients is None or max_clients >= num_clients:
        return np.arange(num_clients, dtype=np.int64)
    rng = np.random.default_rng([seed, _EVAL])
    return np.sort(rng.choice(num_clients, size=max_clients, replace=False)).astype(np.int64)


def schedule_problems(cohorts: object, first_round: object, recorded: object, num_clients: int) -> list[str]:
    """What is wrong with a schedule's cohorts, first round and recorded population, at most one
    line a kind (a client id 2.5 would train client 2)."""

    def whole(value: object) -> TypeGuard[int]:
        return isinstance(value, int) and not isinstance(value, bool)

    if not isinstance(cohorts, list) or not all(isinstance(c, list) for c in cohorts):
        return ["cohorts must be a list of lists of client ids"]
    problems = []
    if not (whole(first_round) and first_round >= 0):
        problems.append(f"first_round must be a round number (0 or more), got {first_round!r}")
    if recorded != num_clients:
        problems.append(f"it was made for {recorded!r} clients, the dataset has {num_clients}")
    ids = [c for cohort in cohorts for c in cohort]
    if not_ids := [c for c in ids if not whole(c)]:
        problems.append(f"client ids are whole numbers, found {not_ids[0]!r}")
    elif outside := [c for c in ids if not 0 <= c < num_clients]:
        problems.append(f"names client {outside[0]}, but the dataset has {num_clients} clients")
    return problems


class CohortSchedule:
    """A fixed participation schedule: the cohort of every round, shared across algorithms.

    Stored as JSON ``{"num_clients": N, "first_round": r, "cohorts": [[ids of round r], ...]}``;
    ``raysim`` writes one for every run (artifact ``cohorts.json``) so another run can reuse it. A
    run resumed at round r records from r on.
    """

    def __init__(self, cohorts: list[list[int]], num_clients: int, first_round: int = 0) -> None:
        self.cohorts = cohorts
        self.num_clients = num_clients
        self.first_round = first_round

    @classmethod
    def load(cls, path: str | Path, num_clients: int) -> CohortSchedule:
        """The schedule in ``path``, checked whole against a population of ``num_clients``.

        Raises:
            ConfigError: an unreadable file; a population, round or client id that is not a
                whole number, or not this dataset's.
        """
        try:
            raw = json.loads(Path(path).read_text())
            cohorts, first_round = raw["cohorts"], raw.get("first_round", 0)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                [f"engine.schedule: cannot read a cohort schedule from {path}: {exc}"]
            ) from None
        problems = schedule_problems(cohorts, first_round, raw.get("num_clients", num_clients), num_clients)
        if problems:
            raise ConfigError([f"engine.schedule: {path}: {problem}" for problem in problems])
        return cls(cohorts, num_clients, first_round)

    def check_runs(self, first: int, last: int) -> None:
        """Refuses a schedule that cannot fix the cohorts of rounds ``first`` to ``last``: a round
        without a cohort, a client twice in one (an asynchronous run's record may hold that: a
        client that arrived twice). An empty cohort stays: a Poisson draw of nobody, or a round
        nobody reported in, trains nobody and keeps the model."""
        end = self.first_round + len(self.cohorts) - 1
        if self.first_round > first or end < last:
            covered = f"covers rounds {self.first_round}..{end}"
            raise ConfigError([f"engine.schedule: {covered}, the job runs rounds {first}..{last}"])
        for round_num in range(first, last + 1):
            cohort = self.cohorts[round_num - self.first_round]
            if len(set(cohort)) < len(cohort):
                problem = "names a client twice (a client trains once a round)"
                raise ConfigError([f"engine.schedule: the cohort of round {round_num} {problem}"])

    def cohort(self, round_num: int) -> np.ndarray:
        index = round_num - self.first_round
        if not 0 <= index < len(self.cohorts):
            last = self.first_round + len(self.cohorts) - 1
            raise ConfigError(
                [
                    f"engine.schedule: covers rounds {self.first_round}..{last}, the "
                    f"job asks for round {round_num}"
                ]
            )
        return np.asarray(self.cohorts[index], dtype=np.int64)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(
            json.dumps(
                {"num_clients": self.num_clients, "first_round": self.first_round, "cohorts": self.cohorts}
            )
        )
