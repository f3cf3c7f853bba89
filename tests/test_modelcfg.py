"""Model facts from the real config.json files of tests/data/model-configs (copied from shared/data)."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tools.deploy.remote import LocalTransport
from tools.research.target.modelcfg import (
    ModelConfigError,
    fetch_model_config,
    load_model_config,
    model_facts,
)

CONFIGS = Path(__file__).parent / "data" / "model-configs"

# file stem: (is_moe, experts, topk, shared, attention kinds, mtp, total B, active B) — sizes from the names.
EXPECTED = {
    "Qwen--Qwen3-235B-A22B": (True, 128, 8, 0, ["full"], 0, 235, 22),
    "Qwen--Qwen3-30B-A3B": (True, 128, 8, 0, ["full"], 0, 30.5, 3.3),
    "Qwen--Qwen3-32B": (False, 0, 0, 0, ["full"], 0, 32.8, 32.8),
    "Qwen--Qwen3.5-122B-A10B": (True, 256, 8, 1, ["full", "linear"], 1, 122, 10),
    "Qwen--Qwen3.5-35B-A3B": (True, 256, 8, 1, ["full", "linear"], 1, 35, 3),
    "Qwen--Qwen3.5-397B-A17B": (True, 512, 10, 1, ["full", "linear"], 1, 397, 17),
    "deepseek-ai--DeepSeek-V3": (True, 256, 8, 1, ["mla"], 1, 671, 37),
    "meta-llama--Llama-3.3-70B-Instruct": (False, 0, 0, 0, ["full"], 0, 70.6, 70.6),
    "meta-llama--Meta-Llama-3.1-70B": (False, 0, 0, 0, ["full"], 0, 70.6, 70.6),
    "meta-llama--Meta-Llama-3.1-8B": (False, 0, 0, 0, ["full"], 0, 8.0, 8.0),
    "mistralai--Mixtral-8x7B-v0.1": (True, 8, 2, 0, ["full"], 0, 46.7, 12.9),
    "openai--gpt-oss-120b": (True, 128, 4, 0, ["full", "sliding"], 0, 117, 5.1),
}


def test_every_shared_config_is_covered():
    assert {p.name.removesuffix("_config.json") for p in CONFIGS.glob("*_config.json")} == set(EXPECTED)


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_facts_of_real_configs(stem):
    facts = model_facts(load_model_config(CONFIGS / f"{stem}_config.json"))
    is_moe, experts, topk, shared, kinds, mtp, total_b, active_b = EXPECTED[stem]
    assert (facts.is_moe, facts.num_experts, facts.experts_per_tok) == (is_moe, experts, topk)
    assert (facts.shared_experts, facts.attention_kinds, facts.mtp_layers) == (shared, kinds, mtp)
    assert facts.total_params / 1e9 == pytest.approx(total_b, rel=0.12)
    assert facts.active_params / 1e9 == pytest.approx(active_b, rel=0.15)
    assert facts.hidden_size > 0 and facts.num_layers > 0 and facts.num_kv_heads > 0
    assert facts.architecture and facts.architecture.endswith(("ForCausalLM", "ForConditionalGeneration"))


def test_nested_text_config_dtype_quantization_layers():
    qwen = model_facts(load_model_config(CONFIGS / "Qwen--Qwen3.5-122B-A10B_config.json"))
    assert qwen.architecture == "Qwen3_5MoeForConditionalGeneration"  # top level
    assert (qwen.hidden_size, qwen.num_layers, qwen.num_kv_heads) == (3072, 48, 2)  # text_config
    assert qwen.layer_kinds == {"linear": 36, "full": 12} and qwen.dtype == "bfloat16"
    assert "top-8" in qwen.summary()
    deepseek = model_facts(load_model_config(CONFIGS / "deepseek-ai--DeepSeek-V3_config.json"))
    assert deepseek.quantization == "fp8"
    assert (
        model_facts(load_model_config(CONFIGS / "openai--gpt-oss-120b_config.json")).quantization == "mxfp4"
    )


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ModelConfigError, match="no such file"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        load_model_config(tmp_path)
    with pytest.raises(ModelConfigError, match="not a language model"):
        model_facts({"architectures": ["CLIPModel"]})


def test_fetch_from_the_host_through_the_transport(tmp_path):
    model_dir = tmp_path / "models" / "qwen"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text((CONFIGS / "Qwen--Qwen3-30B-A3B_config.json").read_text())
    config = asyncio.run(fetch_model_config(str(model_dir), LocalTransport()))
    assert model_facts(config).experts_per_tok == 8
    with pytest.raises(ModelConfigError, match="not a hub id"):
        asyncio.run(fetch_model_config(str(tmp_path / "missing"), LocalTransport()))


class _Hub(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server API)
        if self.path == "/Qwen/Qwen3-32B/resolve/main/config.json":
            status = 200 if self.headers.get("Authorization") == "Bearer hf_test" else 401
            body = (CONFIGS / "Qwen--Qwen3-32B_config.json").read_bytes() if status == 200 else b"{}"
        else:
            status, body = 404, b"{}"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_fetch_from_the_hub_with_a_token_and_offline(monkeypatch):
    server = HTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    try:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
        with pytest.raises(ModelConfigError, match="needs HF_TOKEN"):
            asyncio.run(fetch_model_config("Qwen/Qwen3-32B"))
        monkeypatch.setenv("HF_TOKEN", "hf_test")
        config = asyncio.run(fetch_model_config("Qwen/Qwen3-32B"))
        assert json.dumps(config) and model_facts(config).num_layers == 64
        with pytest.raises(ModelConfigError, match="HTTP 404"):
            asyncio.run(fetch_model_config("Qwen/Nope"))
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ModelConfigError, match="offline"):
        asyncio.run(fetch_model_config("Qwen/Qwen3-32B", hub_endpoint=endpoint))
