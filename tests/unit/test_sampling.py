"""Cohort sampling and seeds are pure functions of their inputs."""

import json
import math

import numpy as np
import pytest

from raysim.errors import ConfigError
from raysim.sampling import (
    CohortSchedule,
    client_seed,
    compression_seed,
    cyclic_groups,
    download_seed,
    eligible,
    poisson_rate,
    sample_cohort,
    sample_cyclic_poisson,
    sample_eval_clients,
    sample_poisson,
)


def test_cohort_is_deterministic_unique_and_round_dependent():
    a = sample_cohort(1000, 50, seed=0, round_num=3)
    assert np.array_equal(a, sample_cohort(1000, 50, seed=0, round_num=3))
    assert len(set(a.tolist())) == 50 and a.min() >= 0 and a.max() < 1000
    assert not np.array_equal(a, sample_cohort(1000, 50, seed=0, round_num=4))
    assert not np.array_equal(a, sample_cohort(1000, 50, seed=1, round_num=3))


def test_cohort_sampling_is_uniform():
    counts = np.zeros(20)
    for r in range(2000):
        counts[sample_cohort(20, 5, seed=0, round_num=r)] += 1
    # each client is expected 2000 * 5/20 = 500 times; binomial std ~ 19
    assert np.all(np.abs(counts - 500) < 80)


def test_cohort_of_a_million_clients_is_cheap_and_valid():
    cohort = sample_cohort(1_000_000, 100, seed=0, round_num=0)
    assert len(np.unique(cohort)) == 100


def test_bad_cohort_size_is_a_config_error():
    with pytest.raises(ConfigError, match="cohort_size"):
        sample_cohort(10, 11, seed=0, round_num=0)


def test_client_seeds_differ_by_client_round_and_run():
    seeds = {client_seed(s, r, c) for s in range(2) for r in range(3) for c in range(4)}
    assert len(seeds) == 24
    assert client_seed(0, 1, 2) == client_seed(0, 1, 2)


def test_eval_clients_subset_is_sorted_and_fixed():
    a = sample_eval_clients(100, 10, seed=0)
    assert np.array_equal(a, sample_eval_clients(100, 10, seed=0))
    assert np.all(np.diff(a) > 0)
    assert len(sample_eval_clients(5, None, seed=0)) == 5


def test_schedule_round_trip_and_errors(tmp_path):
    path = tmp_path / "cohorts.json"
    CohortSchedule([[1, 2], [3, 4]], num_clients=5).save(path)
    schedule = CohortSchedule.load(path, num_clients=5)
    assert schedule.cohort(1).tolist() == [3, 4]
    with pytest.raises(ConfigError, match=r"covers rounds 0..1, the job asks for round 2"):
        schedule.cohort(2)
    CohortSchedule([[0, 1]], num_clients=5, first_round=7).save(tmp_path / "branch.json")
    assert CohortSchedule.load(tmp_path / "branch.json", num_clients=5).cohort(7).tolist() == [0, 1]
    with pytest.raises(ConfigError, match="names client 3"):
        CohortSchedule.load(path, num_clients=3)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="cannot read"):
        CohortSchedule.load(tmp_path / "bad.json", num_clients=5)


def test_population_split_is_disjoint_deterministic_and_sized():
    from raysim.sampling import split_population

    train, heldout = split_population(100, 0.2, seed=0)
    assert len(heldout) == 20 and len(train) == 80
    assert set(train.tolist()).isdisjoint(heldout.tolist())
    assert sorted([*train, *heldout]) == list(range(100))
    assert np.array_equal(heldout, split_population(100, 0.2, seed=0)[1])
    assert len(split_population(10, 0.0, seed=0)[1]) == 0
    with pytest.raises(ConfigError, match="leaves no held-out"):
        split_population(3, 0.1, seed=0)


def test_cyclic_groups_split_the_population_and_keep_clients_b_rounds_apart():
    bands, num_clients = 3, 20
    group_of = cyclic_groups(num_clients, bands, seed=0)
    assert sorted(np.bincount(group_of)) == [6, 7, 7]
    np.testing.assert_array_equal(group_of, cyclic_groups(num_clients, bands, seed=0))
    assert not np.array_equal(group_of, cyclic_groups(num_clients, bands, seed=1))
    covered = np.concatenate([eligible(group_of, r, bands) for r in range(5, 5 + bands)])
    assert sorted(covered) == list(range(num_clients))  # any b consecutive rounds: everyone exactly once
    last_round = {}
    for round_num in range(30):
        cohort = sample_cyclic_poisson(group_of, bands, 0.5, seed=0, round_num=round_num)
        assert set(cohort) <= set(eligible(group_of, round_num, bands))
        for client in cohort:
            assert round_num - last_round.get(client, -bands) >= bands
            last_round[client] = round_num


def test_poisson_cohort_takes_each_eligible_client_at_the_rate():
    group_of = cyclic_groups(4000, 2, seed=0)
    sizes = [len(sample_cyclic_poisson(group_of, 2, 0.1, seed=0, round_num=r)) for r in range(20)]
    assert np.mean(sizes) == pytest.approx(200, abs=5 * math.sqrt(2000 * 0.1 * 0.9 / 20))
    assert len(set(sizes)) > 1  # Poisson: the cohort's size varies


def test_poisson_sampling_takes_each_client_at_the_rate_and_varies_the_size():
    sizes = [len(sample_poisson(1000, 0.05, seed=0, round_num=r)) for r in range(200)]
    assert np.mean(sizes) == pytest.approx(50, abs=5 * np.sqrt(1000 * 0.05 * 0.95 / 200))
    assert len(set(sizes)) > 5
    np.testing.assert_array_equal(sample_poisson(1000, 0.05, 3, 7), sample_poisson(1000, 0.05, 3, 7))


def test_the_poisson_rate_keeps_the_expected_cohort_and_refuses_more_than_a_group_holds():
    assert poisson_rate(1000, 50) == 0.05 and poisson_rate(1000, 50, bands=4) == 0.2
    with pytest.raises(ConfigError, match="sampling probability above 1"):
        poisson_rate(20, 6, bands=4)
    with pytest.raises(ConfigError, match="bands: 30 groups need at least 30 clients, not 20"):
        cyclic_groups(20, 30, seed=0)


def test_the_broadcasts_draws_are_a_stream_of_their_own_per_round():
    seeds = {download_seed(0, r) for r in range(50)}
    assert len(seeds) == 50 and download_seed(0, 3) == download_seed(0, 3)
    assert not seeds & {compression_seed(0, r, c) for r in range(50) for c in range(20)}
    assert not seeds & {client_seed(0, r, c) for r in range(50) for c in range(20)}


def test_every_purpose_tag_names_one_stream():
    """Two draws sharing a tag would be correlated streams (the download's and the async clock's
    launches once both took 17): every tag of raysim.sampling and raysim.systems is distinct."""
    import raysim.sampling as sampling
    from raysim.systems import async_clock, availability, devices, rounds

    tags = {
        f"{module.__name__}.{name}": value
        for module in (sampling, async_clock, availability, devices, rounds)
        for name, value in vars(module).items()
        if name.startswith("_") and name.isupper() and isinstance(value, int) and not isinstance(value, bool)
    }
    assert len(tags) >= 19
    assert len(set(tags.values())) == len(tags), sorted(tags.items(), key=lambda item: item[1])


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ({"num_clients": 20, "cohorts": [[1, 2.5]]}, "client ids are whole numbers, found 2.5"),  # client 2
        ({"num_clients": 20, "cohorts": [[1, True]]}, "client ids are whole numbers, found True"),
        ({"num_clients": 20, "cohorts": [[1, 20]]}, "names client 20, but the dataset has 20 clients"),
        ({"num_clients": 50, "cohorts": [[1, 2]]}, "it was made for 50 clients, the dataset has 20"),
        ({"num_clients": 20, "first_round": -1, "cohorts": [[1]]}, "first_round must be a round number"),
        ({"num_clients": 20, "first_round": 1.5, "cohorts": [[1]]}, "first_round must be a round number"),
        ({"num_clients": 20, "cohorts": [1, 2]}, "cohorts must be a list of lists of client ids"),
    ],
)
def test_a_schedule_file_is_checked_whole_as_it_is_read(tmp_path, content, says):
    path = tmp_path / "cohorts.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=f"engine.schedule: {path}: {says}"):
        CohortSchedule.load(path, 20)


def test_a_schedule_must_fix_every_round_the_job_runs_each_with_distinct_clients(tmp_path):
    path = tmp_path / "cohorts.json"
    path.write_text(json.dumps({"num_clients": 20, "first_round": 2, "cohorts": [[1, 2], [3], [], [4, 4]]}))
    schedule = CohortSchedule.load(path, 20)
    schedule.check_runs(2, 4)  # an empty round (a Poisson draw of nobody) trains nobody: it stays
    for first, last, says in [
        (0, 3, "covers rounds 2..5, the job runs rounds 0..3"),
        (2, 6, "covers rounds 2..5, the job runs rounds 2..6"),
        (5, 5, "the cohort of round 5 names a client twice"),
    ]:
        with pytest.raises(ConfigError, match=f"engine.schedule: {says}"):
            schedule.check_runs(first, last)
