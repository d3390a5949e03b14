"""Overrides aimed at one variant (``fedprox:algorithm.mu=1.0``) and ``!unset``, which drops a key
a variant would inherit from the base."""

import pytest
import yaml
from raw_jobs import BASE, REPO

from raysim.config import load_jobs
from raysim.errors import ConfigError

README_TIP = "fedprox:algorithm.mu=1.0"


def test_the_readme_tip_overrides_fedprox_only():
    assert f"raysim run jobs/quickstart.yaml {README_TIP}" in (REPO / "README.md").read_text()
    fedavg, fedprox, fedadam = load_jobs(REPO / "jobs" / "quickstart.yaml", [README_TIP, "seed=3"])
    assert fedprox.algorithm.config.mu == 1.0
    assert [job.seed for job in (fedavg, fedprox, fedadam)] == [3, 3, 3]
    assert fedprox.origin.overrides == ("algorithm.mu=1.0", "seed=3")
    assert fedavg.origin.overrides == ("seed=3",)


def test_an_override_of_every_variant_that_fits_some_names_the_per_variant_form():
    with pytest.raises(ConfigError) as info:
        load_jobs(REPO / "jobs" / "quickstart.yaml", ["algorithm.mu=1.0"])
    assert "override 'algorithm.mu=1.0' fits variants fedprox only: write fedprox:algorithm.mu=1.0" in (
        info.value.problems
    )


def test_a_prefix_naming_no_variant_is_one_error_listing_the_variants(tmp_path):
    with pytest.raises(ConfigError, match=r"no variant 'fedprx'; variants: fedavg, fedprox, fedadam"):
        load_jobs(REPO / "jobs" / "quickstart.yaml", ["fedprx:algorithm.mu=1.0"])
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(BASE))
    with pytest.raises(ConfigError, match="the job has no variants"):
        load_jobs(path, ["fedprox:algorithm.mu=1.0"])


def test_a_colon_in_the_value_is_no_variant_prefix(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(BASE))
    (job,) = load_jobs(path, ["tracking.tags={team: fl}"])
    assert job.tracking.tags == {"team": "fl"}


def test_unset_drops_a_key_the_variant_inherits(tmp_path):
    base = yaml.safe_dump({**BASE, "algorithm": {"name": "fedprox", "mu": 0.1}})
    path = tmp_path / "job.yaml"
    inherits = base + "variants:\n- {name: fedprox}\n- {name: fedavg, algorithm: {name: fedavg}}\n"
    path.write_text(inherits)
    with pytest.raises(ConfigError, match="variant 'fedavg': algorithm.mu: unknown key"):
        load_jobs(path)
    unset = "- name: fedavg\n  algorithm:\n    name: fedavg\n    mu: !unset\n"
    path.write_text(inherits.replace("- {name: fedavg, algorithm: {name: fedavg}}\n", unset))
    fedprox, fedavg = load_jobs(path)
    assert (fedprox.algorithm.config.mu, fedavg.algorithm.name) == (0.1, "fedavg")
    # the same from the command line, on one variant
    path.write_text(inherits)
    fedprox, fedavg = load_jobs(path, ["fedavg:algorithm.mu=!unset"])
    assert (fedprox.algorithm.config.mu, fedavg.algorithm.name) == (0.1, "fedavg")


def test_a_dotted_grid_axis_override_is_one_line_naming_the_whole_grid_form():
    """Before, ``sweep.grid.algorithm.local.lr=[0.1]`` nested the axis and every cell failed on
    "algorithm.name: required", one line per cell."""
    from raysim.config.overrides import split_sweep

    with pytest.raises(ConfigError) as info:
        split_sweep(["sweep.grid.algorithm.local.lr=[0.1]", "sweep.seeds=[0]"], "job.yaml")
    assert info.value.problems == [
        "override 'sweep.grid.algorithm.local.lr=[0.1]': a sweep axis's name has dots, which an "
        "override's key cannot hold; set the whole sweep.grid: "
        "'sweep.grid={algorithm.local.lr: [0.1]}' (docs/sweeps.md)"
    ]
    assert split_sweep(["sweep.grid={algorithm.local.lr: [0.1]}"], "job.yaml")[0] == [
        "sweep.grid={algorithm.local.lr: [0.1]}"
    ]
