"""The fastest GPU layout (``resources.gpus_per_worker: auto`` with ``engine.vectorize: auto``):
the candidates memory and CPUs allow, the choice from injected timings, its record and cache, and
a configured chunk that cannot fit the card."""

import json

import pytest

from raysim.config import ResourcesConfig
from raysim.errors import ResourceError
from raysim.runtime import layout_timing
from raysim.runtime.gpu_auto import LAYOUT_FILE, chooses_layout, fastest_layout, sized_resources
from raysim.runtime.gpu_layout import (
    Layout,
    LayoutTiming,
    candidates,
    choose,
    layout_tags,
    read_cached,
    shape_key,
)
from raysim.runtime.gpu_sizing import ProbeWork, WorkerPeak, chunk_fit_error
from raysim.runtime.wire import WorkerSetup
from raysim.types import Payload

GiB = 2**30
WORK = ProbeWork(Payload(params={}), [0], cohort=(0, 1))
AUTO = {"engine": {"vectorize": "auto", "cohort_size": 50}, "model": {"name": "cnn_pfl"}}


def timing(per_card: int, round_s: float, clients: int = 50) -> LayoutTiming:
    return LayoutTiming(Layout(per_card), round_s, clients)


def test_candidates_double_up_to_the_least_of_memory_cpus_and_the_cap():
    assert [c.workers_per_card for c in candidates(fits_per_card=12, cpus_per_card=16)] == [1, 2, 4, 8]
    assert [c.workers_per_card for c in candidates(fits_per_card=3, cpus_per_card=16)] == [1, 2]
    assert [c.workers_per_card for c in candidates(fits_per_card=40, cpus_per_card=5)] == [1, 2, 4]
    assert candidates(fits_per_card=0, cpus_per_card=0) == [Layout(1)]  # one a card at least


def test_the_most_clients_a_second_wins_and_a_tie_goes_to_fewer_workers():
    assert choose([timing(1, 0.20), timing(2, 0.15), timing(4, 0.18)]).layout == Layout(2)
    assert choose([timing(1, 0.20), timing(2, 0.20)]).layout == Layout(1)
    with pytest.raises(ValueError, match="no layout"):
        choose([])


def test_a_layouts_share_is_rounded_down_to_what_ray_counts():
    assert Layout(1).share == 1.0 and Layout(4).share == 0.25 and Layout(3).share == 0.3333


def test_the_tags_name_the_choice_and_every_candidates_clients_per_s():
    timings = [timing(1, 0.5), timing(2, 0.25)]
    assert layout_tags(choose(timings), timings) == {
        "gpus_per_worker": "0.5", "gpu_workers_per_card": "2", "gpu_layout_clients_per_s": "200.0",
        "gpu_layout_1_per_card_clients_per_s": "100.0", "gpu_layout_2_per_card_clients_per_s": "200.0",
    }  # fmt: skip


def test_only_vectorize_auto_with_the_worker_count_left_unset_chooses_a_layout():
    assert chooses_layout(ResourcesConfig(gpus_per_worker="auto"), AUTO)
    assert not chooses_layout(ResourcesConfig(gpus_per_worker="auto", num_workers=4), AUTO)
    assert not chooses_layout(ResourcesConfig(gpus_per_worker="auto"), {"engine": {"vectorize": "on"}})


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    """A cluster of 2 cards and 16 CPUs whose layouts time as injected; the cache in tmp_path."""
    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("raysim.runtime.ray_placement.cluster_shape", lambda: (2, 16.0))
    peak = WorkerPeak(
        30 * GiB, 0.5 * GiB, 80 * GiB, "Test GPU 80GB", 64, least_bytes=6 * GiB, vectorizes=True
    )
    monkeypatch.setattr("raysim.runtime.ray_placement.probe_gpu_worker", lambda setup, resources, work: peak)
    timed: list[list[int]] = []

    def time_layouts(setup, resources, work, layouts, cards):
        counts = [layout.workers_per_card for layout in layouts]
        timed.append(counts)
        return [timing(n, {1: 0.30, 2: 0.20, 4: 0.25}[n] * cards) for n in counts]

    monkeypatch.setattr(layout_timing, "time_layouts", time_layouts)
    return timed


def test_auto_takes_the_fastest_measured_layout_records_it_and_caches_it(cluster, tmp_path):
    setup = WorkerSetup(job=AUTO, store_path="s", state_dir=str(tmp_path / "run" / "client_state"))
    resources = ResourcesConfig(gpus_per_worker="auto", cpus_per_worker=2)
    work = ProbeWork(Payload(params={}), [0], cohort=(0, 1))
    sized = sized_resources(resources, setup, lambda: work)
    assert cluster == [[1, 2, 4]]  # 6 GiB a worker fits 10 a card; 16 CPUs / 2 cards / 2 a worker: 4
    assert sized.resources.gpus_per_worker == 0.5 and sized.resources.num_workers is None
    assert (
        sized.tags["gpu_workers_per_card"] == "2"
        and sized.tags["gpu_layout_4_per_card_clients_per_s"] == "100.0"
    )
    assert "2 worker(s) per GPU, 0.5 each, the fastest of the layouts measured" in sized.note
    recorded = json.loads((tmp_path / "run" / LAYOUT_FILE).read_text())
    assert recorded["chosen"]["layout"] == {"workers_per_card": 2} and len(recorded["measured"]) == 3
    again = sized_resources(resources, setup, lambda: work)  # the same machine and job shape
    assert cluster == [[1, 2, 4]] and again.resources == sized.resources and "measured before" in again.note
    other = WorkerSetup(
        job={**AUTO, "engine": {**AUTO["engine"], "cohort_size": 1000}},
        store_path="s",
        state_dir=setup.state_dir,
    )
    sized_resources(resources, other, lambda: work)
    assert len(cluster) == 2  # another cohort is another shape: measured afresh


def test_a_damaged_cache_is_measured_again(cluster, tmp_path):
    key = shape_key(AUTO, "card", 1, 8.0)
    assert read_cached(key) is None
    from raysim.runtime.gpu_layout import cache_path

    cache_path(key).parent.mkdir(parents=True)
    cache_path(key).write_text("{not json")
    assert read_cached(key) is None


def test_a_configured_chunk_that_cannot_fit_the_card_is_one_error_naming_the_fix():
    peak = WorkerPeak(70 * GiB, 0.5 * GiB, 80 * GiB, "Test GPU 80GB", 256)
    assert chunk_fit_error(256, 256, peak) == (
        "engine.vectorize_chunk: 256 clients at once peak at 72,192 MiB, more than 80% of the whole "
        "Test GPU 80GB (81,920 MiB); set engine.vectorize_chunk to 232 or auto"
    )
    assert chunk_fit_error(256, 128, peak) == (
        "engine.vectorize_chunk: 256 clients at once ran out of memory on the whole Test GPU 80GB "
        "(81,920 MiB), 128 fit; set engine.vectorize_chunk to 128 or auto"
    )
    assert chunk_fit_error(64, 64, WorkerPeak(20 * GiB, 0.5 * GiB, 80 * GiB, "g", 64)) is None


def test_a_worker_whose_one_client_does_not_fit_the_card_is_refused_before_any_layout(cluster, tmp_path):
    setup = WorkerSetup(job=AUTO, store_path="s", state_dir=str(tmp_path / "run" / "client_state"))
    huge = WorkerPeak(70 * GiB, 0.5 * GiB, 80 * GiB, "Test GPU 80GB", 64, 70 * GiB, vectorizes=True)
    with pytest.raises(ResourceError, match=r"one worker peaks at 71,680 MiB, more than 80% of the GPU"):
        fastest_layout(ResourcesConfig(gpus_per_worker="auto"), setup, WORK, huge)
    assert cluster == []  # nothing timed
