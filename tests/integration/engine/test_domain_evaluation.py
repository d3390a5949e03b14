"""Per-domain accuracy in a run: eval/domain/<name>/accuracy against a hand count of the final model."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from raysim import params as P
from raysim.config import JobConfig
from raysim.data.prepare import open_dataset
from raysim.engine.loop import run
from raysim.models import build_model


def digit_tree(root: Path) -> None:
    """Two domains of 3 classes, 6 train images a class: "bright" draws class c as a bright
    stripe in row 2c over noise and has 2 test images a class; "dark" a dim one, and its 1 test
    image a class has the stripe in a random row, so that the domains' accuracies differ."""
    rng = np.random.default_rng(0)
    for domain, level, num_test in (("bright", 250, 2), ("dark", 120, 1)):
        for c in range(3):
            for i in range(6 + num_test):
                is_test = i >= 6
                pixels = rng.integers(0, 60, (6, 6), dtype=np.uint8)
                pixels[2 * (rng.integers(3) if is_test and domain == "dark" else c)] = level
                path = root / domain / ("test" if is_test else "train") / str(c) / f"{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(pixels).save(path)


def test_each_domains_accuracy_is_the_share_of_its_test_images_the_final_model_gets_right(tmp_path):
    digit_tree(tmp_path / "tree")
    dataset = {
        "name": "digit5",
        "root": str(tmp_path / "tree"),
        "domains": ["bright", "dark"],
        "mode": "L",
        "size": 6,
        "partition": {"kind": "domain", "column": "domain", "clients_per_domain": 2},
        "cache_dir": str(tmp_path / "cache"),
    }
    job = JobConfig.from_dict(
        {
            "name": "domains",
            "dataset": dataset,
            "model": {"name": "mlp", "hidden": [16]},
            "algorithm": {"name": "fedavg", "local": {"epochs": 2, "batch_size": 6, "lr": 0.1}},
            "engine": {"num_rounds": 2, "cohort_size": 4},
            "evaluation": {"every": 1},
            "resources": {"backend": "serial", "num_workers": 1},
            "tracking": {"enabled": False, "progress": False},
        }
    )
    result = run(job, output_dir=tmp_path / "out")
    store = open_dataset(job.dataset.name, job.dataset.config)
    model = build_model("mlp", job.model.config, store.spec)
    P.load_into(model, result.state.params)
    correct = {"bright": [0, 0], "dark": [0, 0]}  # right, total
    for client in range(store.num_clients):
        test = store.client_data(client, "test").arrays
        with torch.no_grad():
            predicted = model(torch.as_tensor(test["x"])).argmax(1).numpy()
        tally = correct[store.client_key(client)]
        tally[0] += int((predicted == test["y"]).sum())
        tally[1] += len(test["y"])
    final = result.final
    assert [tally[1] for tally in correct.values()] == [6, 3]  # each domain's test images
    for domain, (right, total) in correct.items():
        assert final[f"eval/domain/{domain}/accuracy"] == pytest.approx(right / total)
    expected_mean = np.mean([right / total for right, total in correct.values()])
    assert final["eval/domain/accuracy_mean"] == pytest.approx(expected_mean)
    assert final["eval/domain/bright/accuracy"] != final["eval/domain/dark/accuracy"]
