"""The GLUE recipe (datasets/glue.py) on small local files in GLUE's schema: json, csv, parquet.

Token ids are checked against the bytes tokenizer's definition, written out here: UTF-8 bytes,
EOS = 256 after each text, PAD = 257. Truncation of pairs by hand: "abcdefghij" (10 tokens) with
"xyz" (3) in max_length 10 leaves a budget of 8 for text, so the shorter text stays whole and
the longer keeps 8 - 3 = 5 tokens: "abcde" EOS "xyz" EOS.
"""

from __future__ import annotations

import json
import os
import sys
from types import ModuleType

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.csv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from raysim import registry  # noqa: E402
from raysim.data.prepare import open_dataset  # noqa: E402
from raysim.data.text.tokenizer import longest_first  # noqa: E402
from raysim.errors import DataError  # noqa: E402

EOS, PAD = 256, 257
BYTES = {"kind": "bytes"}


def glue() -> ModuleType:
    registry.load_plugin_file(registry.REPO_ROOT / "datasets" / "glue.py", "datasets")
    return sys.modules["raysim_plugins.datasets.glue"]


@pytest.fixture
def hf_offline(monkeypatch, tmp_path):
    """HuggingFace offline, caching under tmp_path."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    monkeypatch.setattr(registry, "load_builtins", lambda: None)  # only the recipe loaded here
    return datasets


def write(path, rows: list[dict]) -> str:
    """rows as json lines, csv or parquet, by the path's suffix."""
    if path.suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    else:
        table = pa.Table.from_pylist(rows)
        pq.write_table(table, path) if path.suffix == ".parquet" else pyarrow.csv.write_csv(table, path)
    return str(path)


def tokens(*texts: str) -> list[int]:
    return [t for text in texts for t in (*text.encode(), EOS)]


def rows_of(table) -> list[list[int]]:
    return table.column("x").to_pylist()


SST2 = [{"sentence": s, "label": y, "idx": i} for i, (s, y) in enumerate([("great film", 1), ("dull", 0)])]
PAIRS = [
    {"sentence1": "abcdefghij", "sentence2": "xyz", "label": 1, "idx": 0},
    {"sentence1": "a b", "sentence2": "c", "label": 0, "idx": 1},
]


def test_single_sentences_from_json_lines(tmp_path, hf_offline):
    files = {"train": write(tmp_path / "t.jsonl", SST2), "validation": write(tmp_path / "v.jsonl", SST2[:1])}
    examples = glue().Glue(glue().GlueConfig(task="sst2", data_files=files, tokenizer=BYTES)).load_examples()
    assert rows_of(examples.table) == [tokens("great film"), tokens("dull")]
    assert examples.table.column("y").to_pylist() == [1, 0]
    assert examples.table.column("y").type == pa.int64()
    assert rows_of(examples.central_test) == [tokens("great film")]  # the dev split
    spec = examples.spec
    assert (spec.task, spec.input_shape, spec.num_classes, spec.pad_token_id) == (
        "classification",
        (128,),
        2,
        PAD,
    )
    assert spec.metrics == ()


def test_pairs_from_csv_are_encoded_as_pairs_and_truncated_longest_first(tmp_path, hf_offline):
    files = {"train": write(tmp_path / "t.csv", PAIRS), "validation": write(tmp_path / "v.csv", PAIRS)}
    config = glue().GlueConfig(task="mrpc", data_files=files, tokenizer=BYTES, max_length=10)
    examples = glue().Glue(config).load_examples()
    assert rows_of(examples.table) == [tokens("abcde", "xyz"), tokens("a b", "c")]
    assert examples.spec.metrics == ("f1",) and examples.spec.input_shape == (10,)


def test_stsb_from_parquet_is_regression_through_the_store(tmp_path, hf_offline):
    scores = [0.0, 1.25, 2.5, 3.75, 5.0, 4.2]
    rows = [{"sentence1": f"{i} a", "sentence2": "b", "label": s, "idx": i} for i, s in enumerate(scores)]
    files = {
        "train": write(tmp_path / "t.parquet", rows),
        "validation": write(tmp_path / "v.parquet", rows[:2]),
    }
    config = glue().GlueConfig(
        task="stsb",
        data_files=files,
        tokenizer=BYTES,
        max_length=8,
        partition={"kind": "iid", "num_clients": 2},
        test_fraction=0.0,
        cache_dir=str(tmp_path / "cache"),
    )
    store = open_dataset("glue", config)
    spec = store.spec
    assert (spec.task, spec.input_shape, spec.num_classes, spec.metrics) == (
        "regression",
        (8,),
        1,
        ("pearson",),
    )
    train = [store.client_data(c).arrays for c in range(2)]
    assert [len(a["y"]) for a in train] == [3, 3]  # an equal IID split
    y = np.concatenate([a["y"] for a in train])
    assert y.dtype == np.float32 and sorted(y.tolist()) == pytest.approx(sorted(scores))
    x = np.concatenate([a["x"] for a in train])
    i = int(np.flatnonzero(y == np.float32(1.25))[0])  # row 1: "1 a", "b" -> 6 tokens + 2 pads
    assert x[i].tolist() == tokens("1 a", "b") + [PAD, PAD]
    central = store.central_test().arrays
    assert central["y"].tolist() == [0.0, 1.25] and central["x"].shape == (2, 8)


def test_longest_first_matches_the_tokenizers_library():
    """Reference: the Rust ``tokenizers`` truncation transformers' fast tokenizers use."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(30)}}
    reference = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    reference.pre_tokenizer = pre_tokenizers.Whitespace()
    for budget in (1, 4, 7, 10):
        reference.enable_truncation(budget, strategy="longest_first")
        for len_a in range(0, 13):
            for len_b in range(0, 13):
                a = " ".join(f"w{i}" for i in range(len_a))
                b = " ".join(f"w{i}" for i in range(len_b))
                encoding = reference.encode(a, b)
                kept = (encoding.type_ids.count(0), encoding.type_ids.count(1))
                assert longest_first(len_a, len_b, budget) == kept, (len_a, len_b, budget)


def test_each_task_has_its_dev_split_and_columns():
    module = glue()
    assert module.GlueConfig(task="mnli").central_split == "validation_matched"
    assert module.GlueConfig(task="rte").central_split == "validation"
    assert module.GlueConfig(task="mrpc", test_split="test").central_split == "test"  # the code's quirk
    assert module.TASKS["qnli"].text_columns == ("question", "sentence")
    assert module.TASKS["cola"].metrics == ("mcc",) and module.TASKS["stsb"].num_labels == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"task": "sst2", "tokenizer": {"kind": "bpe"}}, "pretrained model"),
        ({"task": "stsb", "partition": {"kind": "dirichlet"}}, "STS-B is regression"),
        ({"task": "mnli", "data_files": {"train": "t.jsonl", "validation": "v.jsonl"}}, "validation_matched"),
        ({"task": "rte", "data_files": {"train": "t.tsv", "validation": "v.tsv"}}, "set builder"),
    ],
)
def test_configs_that_cannot_work_are_refused(options, message):
    with pytest.raises(ValidationError, match=message):
        glue().GlueConfig(**options)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{**SST2[0], "label": -1}], "GLUE hides its test labels"),
        ([{**SST2[0], "label": 2}], "class ids 0..1"),
        ([{"text": "no sentence column", "label": 0}], "no column 'sentence'"),
    ],
)
def test_bad_rows_are_data_errors(tmp_path, hf_offline, rows, message):
    files = {"train": write(tmp_path / "t.jsonl", rows), "validation": write(tmp_path / "v.jsonl", rows)}
    with pytest.raises(DataError, match=message):
        glue().Glue(glue().GlueConfig(task="sst2", data_files=files, tokenizer=BYTES)).load_examples()


def test_the_hub_offline_is_a_clear_data_error(hf_offline):
    from raysim.data.hub import load_split

    with pytest.raises(DataError, match="hub cannot be reached.*data_files"):
        load_split("glue", "sst2", split="train")
    recipe = glue().Glue(glue().GlueConfig(task="cola", tokenizer=BYTES))
    with pytest.raises(DataError, match="'nyu-mll/glue' \\(cola\\).*GLUE schema"):
        recipe.load_examples()
