"""The language-model path end to end: offline text, a tiny GPT-2, FedFish, LoRA adapters only."""

import math

from raysim.config import JobConfig
from raysim.engine.loop import run

BASE = {
    "name": "lm",
    "dataset": {"name": "pydoc_topics", "seq_len": 32, "tokenizer": {"kind": "bytes"}, "test_fraction": 0.5},
    "model": {"name": "hf_causal_lm", "arch": "gpt2", "preset": "tiny"},
    "algorithm": {"name": "fedfish", "local": {"epochs": 1, "batch_size": 4, "lr": 0.05}},
    "engine": {
        "num_rounds": 2,
        "cohort_size": 4,
        "max_client_examples": 8,
    },
    "evaluation": {"every": 1, "clients": 6, "probes": [{"name": "client_server_barrier"}]},
    "resources": {"backend": "serial"},
    "tracking": {"enabled": False, "progress": False},
}


def test_fedfish_trains_a_causal_lm_and_reports_next_token_metrics(tmp_path):
    result = run(JobConfig.from_dict(BASE), output_dir=tmp_path)
    final = result.final
    assert 0 < final["eval/clients/accuracy"] < 1
    # per-client perplexity is exp(loss): its mean over clients is at least exp(mean loss) (Jensen),
    # and a model that learned anything beats guessing among the 258 byte tokens
    assert math.exp(final["eval/clients/loss_mean"]) <= final["eval/clients/perplexity_mean"] + 1e-6
    assert final["eval/clients/perplexity_mean"] < 258
    assert final["barrier/local_loss"] < final["barrier/start_loss"]
    # the last round's server step helped its own cohort: the new global model's loss on the
    # cohort's round data is below the broadcast model's on the same data
    assert final["barrier/global_loss"] < final["barrier/start_loss"]


def test_lora_sends_adapter_weights_only(tmp_path):
    lora = {
        **BASE,
        "model": {**BASE["model"], "lora": {"r": 4}},
        "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 4, "lr": 0.05}},
    }
    result = run(JobConfig.from_dict(lora), output_dir=tmp_path)
    sent = result.state.params
    assert sent and all("lora_" in name for name in sent)  # the frozen base never travels
    adapter_bytes = sum(v.numel() * 4 for v in sent.values())
    first = result.history[0][1]
    assert first["sys/bytes_up"] == 4 * adapter_bytes  # 4 clients, one adapter delta each
    assert first["sys/bytes_down"] == 4 * adapter_bytes


def test_a_transfer_dataset_tokenized_differently_is_refused(tmp_path):
    import pytest

    from raysim.errors import ConfigError

    def text(min_frequency):
        return {
            "name": "pydoc_topics",
            "seq_len": 32,
            "test_fraction": 0.5,
            "tokenizer": {"kind": "bpe", "vocab_size": 600, "min_frequency": min_frequency},
        }

    job = {**BASE, "dataset": text(2), "evaluation": {"transfer": [{"name": "other", "dataset": text(3)}]}}
    with pytest.raises(ConfigError, match="'other' is tokenized differently"):
        run(JobConfig.from_dict(job), output_dir=tmp_path)
    same = {
        **job,
        "evaluation": {"transfer": [{"name": "same", "dataset": text(2)}]},
        "engine": {**BASE["engine"], "num_rounds": 1},
    }
    assert "eval/transfer/same/accuracy" in run(JobConfig.from_dict(same), output_dir=tmp_path).final


def test_prepare_builds_a_jobs_transfer_datasets(tmp_path, capsys):
    import yaml

    from raysim.cli.main import main

    other = {"name": "digits", "partition": {"kind": "iid", "num_clients": 7}}
    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **BASE,
                "dataset": {"name": "digits"},
                "model": {"name": "mlp"},
                "evaluation": {"transfer": [{"name": "t", "dataset": other}]},
            }
        )
    )
    assert main(["prepare", str(path)]) == 0
    out = capsys.readouterr().out
    assert "7 clients" in out and "100 clients" in out


def test_a_document_split_keeps_each_document_on_one_side(tmp_path):
    """Every document carries a unique marker; with bytes tokens each sequence decodes to text, so
    every marker found must be in the train sequences or the test sequences of its host, not both."""
    import json
    import re

    from raysim.data.prepare import open_dataset
    from raysim.registry import get

    lines = [
        {
            "url": f"https://host{d % 4}.org/{d}",
            "timestamp": "2019",
            "text": f"DOC{d:04d} lorem ipsum dolor " * 8,
        }
        for d in range(80)
    ]  # marker in every block
    corpus = tmp_path / "c4.jsonl"
    corpus.write_text("\n".join(json.dumps(line) for line in lines))
    config = get("dataset", "c4").config.model_validate(
        {
            "data_files": str(corpus),
            "seq_len": 32,
            "tokenizer": {"kind": "bytes"},
            "test_fraction": 0.5,
            "split_by": "document",
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    store = open_dataset("c4", config)
    decode = lambda rows: bytes(int(t) for t in rows.reshape(-1) if t < 256).decode()  # noqa: E731
    for client in range(store.num_clients):
        train, test = (
            set(re.findall(r"DOC\d{4}", decode(store.client_data(client, s).arrays["x"])))
            for s in ("train", "test")
        )
        assert train and test and not train & test, client
