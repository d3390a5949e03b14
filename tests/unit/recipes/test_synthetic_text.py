"""The synthetic_text recipe: seeded, one client per stream, packed by the real text writer."""

import numpy as np

from raysim.data.prepare import open_dataset


def config(module, tmp_path, **fields):
    return module.SyntheticTextConfig(
        cache_dir=str(tmp_path), num_clients=6, words_per_client=400, seq_len=32,
        tokenizer={"kind": "bytes"}, test_fraction=0.0, **fields,
    )  # fmt: skip


def test_the_same_seed_gives_the_same_text_and_another_seed_other_text(tmp_path, recipe):
    module = recipe("synthetic_text")
    first, again = (list(module.SyntheticText(config(module, tmp_path)).documents()) for _ in range(2))
    other = list(module.SyntheticText(config(module, tmp_path, seed=1)).documents())
    assert first == again and first != other
    assert {key for key, _ in first} == {f"client_{c:05d}" for c in range(6)}
    words = [w for _, sentence in first for w in sentence.rstrip(".").lower().split()]
    assert len(words) == 6 * 400
    # Zipf: the most frequent word is far above the uniform share of 1 / vocabulary.
    assert max(np.unique(words, return_counts=True)[1]) / len(words) > 50 / 5_000


def test_a_store_of_packed_sequences_one_client_per_stream(tmp_path, only_loaded_recipes, recipe):
    module = recipe("synthetic_text")
    store = open_dataset("synthetic_text", config(module, tmp_path))
    assert store.spec.task == "causal_lm" and store.spec.input_shape == (32,)
    assert store.num_clients == 6
    x = store.client_data(0, "train").arrays["x"]
    assert x.shape[1] == 32 and len(x) >= 400 * 3 // 32  # bytes: 3+ tokens a word, packed in 32s
