"""The language-model path end to end: offline text, a tiny GPT-2, FedFish, LoRA adapters only."""

import math


from raysim.config import JobConfig
from raysim.engine import run

BASE = {
    "name": "lm",
    "dataset": {"name": "pydoc_topics", "seq_len": 32, "tokenizer": {"kind": "bytes"},
                "test_fraction": 0.5},
    "model": {"name": "hf_causal_lm", "arch": "gpt2", "preset": "tiny"},
    "algorithm": {"name": "fedfish", "local": {"epochs": 1, "batch_size": 4, "lr": 0.05}},
    "engine": {"num_rounds": 2, "cohort_size": 4, "max_client_examples": 8, "eval_every": 1,
               "eval_clients": 6, "barrier_every": 1},
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
    assert result.history[0][1]["train/loss"] > result.history[-1][1]["train/loss"] - 1.0


def test_lora_sends_adapter_weights_only(tmp_path):
    lora = {**BASE, "model": {**BASE["model"], "lora": {"r": 4}},
            "algorithm": {"name": "fedavg", "local": {"epochs": 1, "batch_size": 4, "lr": 0.05}}}
    result = run(JobConfig.from_dict(lora), output_dir=tmp_path)
    sent = result.state.params
    assert sent and all("lora_" in name for name in sent)  # the frozen base never travels
    adapter_bytes = sum(v.numel() * 4 for v in sent.values())
    first = result.history[0][1]
    assert first["sys/bytes_up"] == 4 * adapter_bytes  # 4 clients, one adapter delta each
    assert first["sys/bytes_down"] == 4 * adapter_bytes
