"""Cost accounting end to end on the serial backend (4 clients of tiny digits, an MLP 64-16-10),
for plugins that carry no cost code: memory and seconds of the client updates present and
positive every round, the values sent up and down and the MACs against hand counts, and the
inference cost of the predictor each plugin evaluates (the global model, FuseFL's fused model,
the Ensemble's four members)."""

from jobs import tiny_job
from raysim.engine.loop import run

FOUR_CLIENTS = {"partition": {"kind": "dirichlet", "num_clients": 4, "alpha": 0.5, "min_size": 20}}
MACS = 64 * 16 + 16 * 10  # the MLP's two matrix products, per example
PARAMS = (64 * 16 + 16) + (16 * 10 + 10)


def job(algorithm, cohort_size=3):
    return tiny_job(
        algorithm=algorithm, dataset=FOUR_CLIENTS, engine={"num_rounds": 2, "cohort_size": cohort_size}
    )


def test_every_round_logs_what_its_client_updates_cost(tmp_path):
    result = run(
        job({"name": "fedavg", "local": {"epochs": 1, "batch_size": 16, "lr": 0.1}}), output_dir=tmp_path
    )
    for _, metrics in result.history:
        assert metrics["sys/client_seconds"] > 0
        assert metrics["sys/client_peak_bytes"] > 0  # the resident set's growth, on this CPU
        assert metrics["sys/params_up"] == 3 * PARAMS  # each client uploads the model
        assert metrics["sys/params_down"] == 3 * PARAMS
        assert metrics["sys/bytes_up"] == 4 * metrics["sys/params_up"]  # float32
        assert metrics["sys/macs_per_example"] == MACS
        assert metrics["sys/inference_macs_per_example"] == MACS  # the global model, evaluated
        assert metrics["sys/inference_params"] == PARAMS


def test_the_fused_model_and_the_ensemble_are_costed_as_evaluated(tmp_path):
    """FuseFL's fused model runs 4 towers and adapters; the Ensemble's predictor is 4 MLPs."""
    fusefl = run(job({"name": "fusefl"}, cohort_size=4), output_dir=tmp_path / "f")
    history = dict(fusefl.history)
    final = history[2]  # after CCVR: the fused model's evaluation
    assert history[0]["sys/macs_per_example"] == MACS  # each client trains its own MLP
    assert final["sys/inference_params"] == final["fusefl/params"]
    assert final["sys/bytes_up"] > 0  # CCVR's feature statistics: the engine weighs a protocol's steps too
    # 4 first layers (64 -> 16), 4 adapters (4 x 16 -> 16), one head (16 -> 10): wider than one MLP
    assert final["sys/inference_macs_per_example"] == 4 * 64 * 16 + 4 * 64 * 16 + 16 * 10 > MACS
    local = {"epochs": 1, "batch_size": 16, "lr": 0.1}
    ensemble = run(job({"name": "ensemble", "cache_dir": str(tmp_path / "cache"), "local": local},
                       cohort_size=4), output_dir=tmp_path / "e")  # fmt: skip
    [(_, metrics)] = ensemble.history
    assert metrics["sys/inference_macs_per_example"] == 4 * MACS
    assert metrics["sys/inference_params"] == 4 * PARAMS == metrics["ensemble/params"]
    assert metrics["sys/params_up"] == 4 * PARAMS  # the members travel up whole
    assert metrics["sys/bytes_up"] == 4 * metrics["sys/params_up"]


def test_ray_workers_report_the_same_accounting(tmp_path, ray_local):
    """Two Ray workers, each in its own process: their reports carry the peak and the values."""
    ray_job = tiny_job(dataset=FOUR_CLIENTS, engine={"num_rounds": 1, "cohort_size": 4},
                       resources={"backend": "ray", "num_workers": 2})  # fmt: skip
    [(_, metrics)] = run(ray_job, output_dir=tmp_path).history
    assert metrics["sys/client_peak_bytes"] > 0 and metrics["sys/client_seconds"] > 0
    assert metrics["sys/params_up"] == metrics["sys/params_down"] == 4 * PARAMS
