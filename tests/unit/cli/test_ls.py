"""``raysim ls``: every option's type, default and allowed values; partitioners; clear errors."""

from __future__ import annotations

import pytest

from raysim.cli import ls
from raysim.cli.main import main
from raysim.cli.options import Option


def rows(kind: str, name: str) -> dict[str, Option]:
    (listed,) = ls.find(name, kind)
    return {option.key: option for option in listed.options}


def test_overview_lines_show_type_default_and_literal_choices():
    (fedfish,) = ls.find("fedfish", "algorithms")
    lines = fedfish.lines
    assert "fisher_mode: train|eval = train" in lines
    assert "local: {epochs, batch_size, lr, lr_decay, +8}" in lines  # a nested section, compact
    (digits,) = ls.find("digits", "datasets")
    assert "partition: {iid|dirichlet|shards|natural|domain|domain_dirichlet} = iid" in digits.lines
    assert "cache_dir: str | null = null" in digits.lines
    (fedadam,) = ls.find("fedadam", "algorithms")
    assert any(line.startswith("server: {kind, lr,") and line.endswith("= adam") for line in fedadam.lines)


def test_detail_flattens_sections_to_dotted_keys_with_their_own_defaults():
    fedadam = rows("algorithms", "fedadam")
    lr = fedadam["local.lr"]
    assert (lr.type, lr.default, lr.allowed) == ("float", "0.05", "> 0")
    assert (fedadam["server.lr"].default, fedadam["server.kind"].default) == (
        "0.01",
        "adam",
    )  # FedAdam's, not SGD's
    assert fedadam["server.kind"].allowed == "sgd | adam | yogi | adagrad"
    assert fedadam["local.optimizer"].allowed == "sgd | adam"  # from the field's pattern
    assert fedadam["local.momentum"].allowed == ">= 0, < 1"
    assert fedadam["local.lr_decay"].description == "round r trains at lr * lr_decay**r"  # its line's comment
    assert "exponential(decay)" in fedadam["local.lr_schedule"].description  # a section of several kinds


def test_detail_of_a_tagged_union_and_of_an_optional_section():
    digits = rows("datasets", "digits")
    kinds = "iid | dirichlet | shards | natural | domain | domain_dirichlet"
    assert digits["partition.kind"].allowed == kinds
    assert "dirichlet(num_clients, alpha, min_size, max_size)" in digits["partition.kind"].description
    assert digits["partition.num_clients"].default == "100"
    assert digits["seed"].description.startswith("seeds the partition and the split")  # Attributes: docs
    lm = rows("models", "hf_causal_lm")
    assert lm["lora"].default == "null" and lm["lora.r"].default == "8"  # its options once it is set
    assert lm["init_from.path"].default == "required"


def test_partitioners_are_listed_with_their_options(capsys):
    assert main(["ls", "partitioners"]) == 0
    out = capsys.readouterr().out
    for name in ("iid", "dirichlet", "shards", "natural", "domain", "domain_dirichlet"):
        assert f"│ {name} " in out
    assert "alpha: float = 0.5" in out and "classes_per_client: int = 2" in out and "fedavg" not in out
    assert main(["ls", "partitioners", "dirichlet"]) == 0
    assert "min_size" in capsys.readouterr().out


def test_every_table_fits_120_columns(capsys):
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 120
    for title in ("algorithms", "datasets", "models", "probes", "partitioners"):
        assert title in out
    assert main(["ls", "algorithms", "ima"]) == 0
    assert max(map(len, capsys.readouterr().out.splitlines())) <= 120


def test_a_name_alone_is_looked_up_in_every_kind(capsys):
    assert main(["ls", "fedprox"]) == 0
    out = capsys.readouterr().out
    assert "fedprox (algorithm)" in out and "local.batch_size" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ls", "algorithms", "fedavgg"], "no algorithm is called 'fedavgg'; did you mean 'fedavg'"),
        (
            ["ls", "fedavgg"],
            "no algorithm, dataset, model, probe or partitioner is called 'fedavgg'; did you mean",
        ),
        (["ls", "models", "fedavg"], "no model is called 'fedavg'; see raysim ls algorithms fedavg"),
        (["ls", "partitioners", "dirichelt"], "did you mean 'dirichlet'"),
        (["ls", "widgets", "x"], "unknown kind 'widgets'; choose one of algorithms, datasets"),
    ],
)
def test_unknown_names_are_one_clear_message(argv, message, capsys):
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Traceback" not in err
