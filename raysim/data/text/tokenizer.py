"""Tokenizers of text stores: text -> token ids, and the ids a store needs (EOS, PAD).

Three tokenizer kinds (``TokenizerConfig.kind``):

    hf      ``transformers.AutoTokenizer`` from a hub id ("gpt2") when the hub is reachable, or
            from a local ``save_pretrained`` directory (works offline)
    bpe     a byte-level BPE trained with the HuggingFace ``tokenizers`` library on a sample of
            the corpus itself, offline; saved as ``tokenizer.json`` next to the store
    bytes   UTF-8 bytes (ids 0-255) plus EOS (256) and PAD (257): 258 ids, needs nothing

Usage:
    tokenizer = prepare_tokenizer(TokenizerConfig(kind="bpe"), sample_texts, store_dir)
    docs = tokenizer.encode_batch(client_texts)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field, model_validator

from raysim.data.format import META_FILE
from raysim.errors import DataError

BPE_FILE = "tokenizer.json"  # a trained bpe tokenizer, in the store directory
HF_DIR = "tokenizer"  # an hf tokenizer's save_pretrained copy, in the store directory
BPE_SPECIALS = ("<|endoftext|>", "<pad>")  # ids 0 (EOS) and 1 (PAD) of a trained bpe
BYTES_EOS, BYTES_PAD = 256, 257
_ENCODE_BATCH = 1024  # documents per call into the Rust tokenizer
# Texts (or text pairs) -> token ids with a pretrained tokenizer's special tokens, truncated.
EncodeInputs = Callable[[list[str], list[str] | None, int], Sequence[Sequence[int]]]


class TokenizerConfig(BaseModel, frozen=True, extra="forbid"):
    """Which tokenizer turns a text dataset into token ids.

    Attributes:
        kind: "hf" (transformers AutoTokenizer), "bpe" (trained here on the corpus) or "bytes".
        name_or_path: hf only: a hub id such as "gpt2" (needs the hub or its cache) or a local
            directory written by ``save_pretrained``.
        vocab_size: bpe only: the vocabulary to train, special tokens included.
        sample_documents: bpe only: trained on the first this many documents of the corpus.
        min_frequency: bpe only: a merge must occur at least this often in the sample.
    """

    kind: Literal["hf", "bpe", "bytes"] = "bpe"
    name_or_path: str | None = None
    vocab_size: int = Field(4096, ge=258)
    sample_documents: int = Field(20_000, ge=1)
    min_frequency: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _name_only_for_hf(self) -> TokenizerConfig:
        if (self.kind == "hf") != (self.name_or_path is not None):
            raise ValueError("name_or_path is required for kind 'hf' and only used by it")
        return self


class Tokenizer:
    """Text -> token ids, with the ids a text store needs.

    Built by ``load_tokenizer`` / ``prepare_tokenizer`` around one of the three backends; only
    functions differ between kinds, so there is no class per kind.

    Attributes:
        name: what it is ("bytes", "bpe-4096", "gpt2", a directory).
        vocab_size: number of token ids (the model's output size).
        eos_id: the separator appended after every document.
        pad_id: the padding id, or None when the vocabulary has none distinct from EOS. Packed
            sequences never hold padding.
    """

    def __init__(
        self,
        name: str,
        vocab_size: int,
        eos_id: int,
        pad_id: int | None,
        encode_batch: Callable[[list[str]], Sequence[Sequence[int] | np.ndarray]],
        decode: Callable[[list[int]], str],
        encode_inputs: EncodeInputs | None = None,
    ) -> None:
        self.name = name
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.pad_id = pad_id
        self._encode_batch = encode_batch
        self._decode = decode
        self._encode_inputs = encode_inputs

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens."""
        return [int(i) for i in self._encode_batch([text])[0]]

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text as an int32 array, encoded in batches (Rust-parallel for hf/bpe)."""
        out: list[np.ndarray] = []
        for start in range(0, len(texts), _ENCODE_BATCH):
            chunk = list(texts[start : start + _ENCODE_BATCH])
            out += [np.asarray(ids, np.int32) for ids in self._encode_batch(chunk)]
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; special tokens are left out."""
        return self._decode([int(i) for i in ids])

    def encode_inputs(
        self, first: Sequence[str], second: Sequence[str] | None, max_length: int
    ) -> list[np.ndarray]:
        """Classifier inputs: each text, or each pair (``first[i]``, ``second[i]``), as int32 ids
        of at most ``max_length`` tokens, unpadded.

        An hf tokenizer adds its model's special tokens (BERT: [CLS] a [SEP] b [SEP]; RoBERTa:
        <s> a </s></s> b </s>) and truncates the longer text of a pair first, as transformers
        does. bpe and bytes have no such tokens: each text ends with EOS (a EOS b EOS), truncated
        by the same longest-first rule.
        """
        if second is not None and len(second) != len(first):
            raise ValueError(f"{len(first)} first texts but {len(second)} second texts")
        if self._encode_inputs is not None:
            out: list[np.ndarray] = []
            for start in range(0, len(first), _ENCODE_BATCH):
                end = start + _ENCODE_BATCH
                pairs = None if second is None else list(second[start:end])
                out += [
                    np.asarray(ids, np.int32)
                    for ids in self._encode_inputs(list(first[start:end]), pairs, max_length)
                ]
            return out
        firsts = self.encode_batch(first)
        seconds = self.encode_batch(second) if second is not None else [None] * len(firsts)
        return [self._end_with_eos(a, b, max_length) for a, b in zip(firsts, seconds)]

    def _end_with_eos(self, a: np.ndarray, b: np.ndarray | None, max_length: int) -> np.ndarray:
        eos = np.array([self.eos_id], np.int32)
        if b is None:
            return np.concatenate([a[: max_length - 1], eos])
        keep_a, keep_b = longest_first(len(a), len(b), max_length - 2)
        return np.concatenate([a[:keep_a], eos, b[:keep_b], eos])


def longest_first(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths a pair keeps under the ``tokenizers`` library's "longest_first" truncation to
    ``budget`` tokens (what transformers' fast tokenizers run): the shorter text stays whole
    if the longer one can make room; otherwise both get half, the odd token to the longer one
    (to the second on a tie)."""
    swap = len_a > len_b
    short, long = (len_b, len_a) if swap else (len_a, len_b)
    keep_short, keep_long = short, max(short, budget - short)
    if keep_short + keep_long > budget:
        keep_short, keep_long = budget // 2, budget // 2 + budget % 2
    kept = min(short, keep_short), min(long, keep_long)
    return (kept[1], kept[0]) if swap else kept


def bytes_tokenizer() -> Tokenizer:
    """UTF-8 bytes as ids 0-255, EOS 256, PAD 257."""

    def encode_batch(texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]

    def decode(ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    return Tokenizer("bytes", 258, BYTES_EOS, BYTES_PAD, encode_batch, decode)


def train_bpe(texts: Iterable[str], config: TokenizerConfig) -> Any:
    """Trains a byte-level BPE (a ``tokenizers.Tokenizer``) on ``texts``; deterministic.

    The byte alphabet is always included, so any text encodes without unknown tokens.
    """
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = RustTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=list(BPE_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def prepare_tokenizer(config: TokenizerConfig, texts: Iterable[str], directory: Path) -> Tokenizer:
    """Makes a store's tokenizer and saves what it needs in ``directory``.

    bpe is trained on ``texts`` (consumed only for bpe) and saved as ``tokenizer.json``; an hf
    tokenizer is copied with ``save_pretrained`` so the store works without the hub later.

    Raises:
        DataError: an hf tokenizer cannot be loaded.
    """
    directory = Path(directory)
    if config.kind == "bpe":
        train_bpe(texts, config).save(str(directory / BPE_FILE))
    elif config.kind == "hf":
        assert config.name_or_path is not None  # TokenizerConfig requires it for hf
        _load_auto_tokenizer(config.name_or_path).save_pretrained(str(directory / HF_DIR))
    return load_tokenizer(config, directory)


def load_tokenizer(config: TokenizerConfig, directory: str | Path | None = None) -> Tokenizer:
    """The tokenizer of ``config``; a store's own copy when ``directory`` holds one.

    Args:
        config: which tokenizer.
        directory: a store (or its build directory) written with ``prepare_tokenizer``. Needed
            for bpe, which exists only once trained; optional for hf.

    Raises:
        DataError: a bpe tokenizer has not been trained in ``directory``, or an hf tokenizer
            cannot be loaded (hub unreachable and no local copy).
    """
    if config.kind == "bytes":
        return bytes_tokenizer()
    if config.kind == "bpe":
        path = Path(directory) / BPE_FILE if directory is not None else None
        if path is None or not path.is_file():
            raise DataError(
                f"no trained bpe tokenizer at {path}: bpe tokenizers are trained on the corpus "
                "when its store is prepared (raysim prepare)"
            )
        return _from_rust(_read_rust_tokenizer(path), f"bpe-{config.vocab_size}")
    assert config.name_or_path is not None  # kind hf: TokenizerConfig requires it
    local = Path(directory) / HF_DIR if directory is not None else None
    source = str(local) if local is not None and local.is_dir() else config.name_or_path
    return _from_auto(_load_auto_tokenizer(source), config.name_or_path)


def store_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer a text store was built with (recorded in its meta.json)."""
    meta = json.loads((Path(path) / META_FILE).read_text())
    if "tokenizer" not in meta:
        raise DataError(f"client store {path} is not a text store (no tokenizer in meta.json)")
    return load_tokenizer(TokenizerConfig(**meta["tokenizer"]["config"]), path)


def _read_rust_tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer as RustTokenizer

    return RustTokenizer.from_file(str(path))


def _from_rust(tokenizer: Any, name: str) -> Tokenizer:
    """Wraps a trained bpe ``tokenizers.Tokenizer`` (EOS and PAD are its first two tokens)."""

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    eos, pad = (tokenizer.token_to_id(t) for t in BPE_SPECIALS)
    return Tokenizer(name, tokenizer.get_vocab_size(), eos, pad, encode_batch, tokenizer.decode)


def _load_auto_tokenizer(name_or_path: str) -> Any:
    """``AutoTokenizer.from_pretrained`` with an error that says what to do offline."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise DataError(
            f"cannot load the hf tokenizer {name_or_path!r} ({type(e).__name__}: {e}). Offline "
            "(HF_HUB_OFFLINE) or without the hub, use tokenizer.kind=bpe or bytes, or set "
            "tokenizer.name_or_path to a local save_pretrained directory"
        ) from e


def _from_auto(tokenizer: Any, name: str) -> Tokenizer:
    """Wraps a transformers tokenizer; EOS falls back to SEP (BERT-style vocabularies)."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if eos is None:
        raise DataError(f"hf tokenizer {name!r} has neither an EOS nor a SEP token to end documents")
    # GPT-2 style vocabularies pad with EOS: treating it as padding would hide every EOS.
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id not in (None, eos) else None

    def encode_batch(texts: list[str]) -> list[list[int]]:
        # verbose=False: documents longer than the model's context are expected before packing.
        return tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    def encode_inputs(first: list[str], second: list[str] | None, max_length: int) -> list[list[int]]:
        return tokenizer(first, second, truncation=True, max_length=max_length)["input_ids"]

    return Tokenizer(name, len(tokenizer), int(eos), pad, encode_batch, decode, encode_inputs)
