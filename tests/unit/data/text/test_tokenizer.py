"""raysim.data.text.tokenizer: packing, and the bytes, bpe and hf tokenizers, all offline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from raysim.data.text.packing import pack
from raysim.data.text.tokenizer import (
    BYTES_EOS,
    BYTES_PAD,
    TokenizerConfig,
    bytes_tokenizer,
    load_tokenizer,
    prepare_tokenizer,
    train_bpe,
)
from raysim.errors import DataError

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Federated learning trains one model on data that stays on many clients.",
    "A client is one simulated participant; a cohort is the clients sampled in a round.",
] * 20


def test_pack_concatenates_documents_with_eos_and_drops_the_remainder():
    # Stream with EOS=9: 1 2 3 9 | 4 5 9 | 6 9  -> 9 tokens -> two blocks of 4, the last token dropped.
    rows = pack([[1, 2, 3], [4, 5], [6]], seq_len=4, eos_id=9)
    assert rows.dtype == np.int32
    assert rows.tolist() == [[1, 2, 3, 9], [4, 5, 9, 6]]
    assert pack([[1, 2, 3], [4, 5], [6]], seq_len=3, eos_id=9).tolist() == [[1, 2, 3], [9, 4, 5], [9, 6, 9]]
    assert pack([[1, 2]], seq_len=4, eos_id=0).shape == (0, 4)  # too short: no sequence
    assert pack([], seq_len=4, eos_id=0).shape == (0, 4)


def test_bytes_tokenizer_round_trips_utf8():
    tokenizer = bytes_tokenizer()
    text = "naïve café — 字"
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < 256
    assert tokenizer.decode([*ids, BYTES_EOS]) == text  # specials are left out
    assert (tokenizer.vocab_size, tokenizer.eos_id, tokenizer.pad_id) == (258, BYTES_EOS, BYTES_PAD)
    assert load_tokenizer(TokenizerConfig(kind="bytes")).encode("ab") == [97, 98]


def test_bpe_trains_offline_deterministically_and_round_trips(tmp_path):
    config = TokenizerConfig(kind="bpe", vocab_size=300, min_frequency=1)
    tokenizer = prepare_tokenizer(config, iter(CORPUS), tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    assert tokenizer.vocab_size == 300 and (tokenizer.eos_id, tokenizer.pad_id) == (0, 1)
    ids = tokenizer.encode(CORPUS[1])
    assert len(ids) < len(CORPUS[1].encode()) / 2  # merges learnt from the corpus compress it
    assert tokenizer.decode(ids) == CORPUS[1]
    unseen = "Zebra ¿qué? 42"  # the byte alphabet covers text the sample never showed
    assert tokenizer.decode(tokenizer.encode(unseen)) == unseen
    again = train_bpe(iter(CORPUS), config)
    assert json.loads(again.to_str()) == json.loads((tmp_path / "tokenizer.json").read_text())
    assert load_tokenizer(config, tmp_path).encode(CORPUS[0]) == tokenizer.encode(CORPUS[0])


def test_bpe_needs_a_trained_file(tmp_path):
    with pytest.raises(DataError, match="no trained bpe tokenizer"):
        load_tokenizer(TokenizerConfig(kind="bpe"), tmp_path)


def test_hf_tokenizer_loads_from_a_local_directory(tmp_path):
    from transformers import PreTrainedTokenizerFast

    rust = train_bpe(iter(CORPUS), TokenizerConfig(kind="bpe", vocab_size=280))
    saved = tmp_path / "hf-tok"
    PreTrainedTokenizerFast(
        tokenizer_object=rust, eos_token="<|endoftext|>", pad_token="<pad>"
    ).save_pretrained(str(saved))
    config = TokenizerConfig(kind="hf", name_or_path=str(saved))
    tokenizer = load_tokenizer(config)
    assert (tokenizer.vocab_size, tokenizer.eos_id, tokenizer.pad_id) == (280, 0, 1)
    assert tokenizer.encode(CORPUS[0]) == rust.encode(CORPUS[0], add_special_tokens=False).ids
    store = tmp_path / "store"
    store.mkdir()
    copy = prepare_tokenizer(config, iter(()), store)  # copied into the store: works without the source
    assert (store / "tokenizer").is_dir() and copy.encode("dog") == tokenizer.encode("dog")


def test_hf_hub_id_offline_is_a_clear_error():
    with pytest.raises(DataError, match="use tokenizer.kind=bpe or bytes"):
        load_tokenizer(TokenizerConfig(kind="hf", name_or_path="gpt2"))


def test_tokenizer_config_checks_name_or_path():
    with pytest.raises(ValueError, match="name_or_path is required"):
        TokenizerConfig(kind="hf")
    with pytest.raises(ValueError, match="only used"):
        TokenizerConfig(kind="bytes", name_or_path="gpt2")
