"""Model facts the performance model needs, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.quant import PLAIN, Quant, QuantConfigError, parse_quant

BUNDLED_MODELS = Path(__file__).with_name("models")


class ModelConfigError(Exception):
    """A config.json that is missing or lacks a field the simulator needs."""


@dataclass(frozen=True)
class ModelInfo:
    """Sizes of one model, in parameters, and how its checkpoint stores them (`quant`)."""

    name: str
    architecture: str
    hidden: int
    layers: int
    full_attn_layers: int
    """Layers attending to the whole context (not linear, not sliding-window)."""
    linear_attn_layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    num_experts: int
    experts_per_tok: int
    expert_params: int
    """Parameters of one routed expert in one layer."""
    dense_params_per_layer: int
    """Attention + shared expert / dense MLP + router of one average layer."""
    lm_head_params: int
    linear_state_bytes_per_layer: int
    """Recurrent state of one request in one linear-attention layer (fp32)."""
    mtp_layers: int
    max_context: int
    eos_token_id: int
    sliding_attn_layers: int = 0
    """Sliding-window layers: they keep and read at most `sliding_window` tokens per request."""
    sliding_window: int = 0
    mla_kv_dim: int = 0
    """Multi-head latent attention: compressed KV width per token and layer (0 = plain MHA/GQA)."""
    moe_layers: int = 0
    """Layers with routed experts (DeepSeek keeps its first layers dense)."""
    attention_sinks: bool = False
    quant: Quant = PLAIN

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def total_params(self) -> int:
        experts = self.moe_layers * self.num_experts * self.expert_params
        return self.layers * self.dense_params_per_layer + experts + 2 * self.lm_head_params

    @property
    def active_params(self) -> int:
        experts = self.moe_layers * self.experts_per_tok * self.expert_params
        return self.layers * self.dense_params_per_layer + experts + self.lm_head_params

    @property
    def moe_fraction(self) -> float:
        """Share of the layers that carry routed experts."""
        return self.moe_layers / self.layers

    def weight_bytes(self, *, extra_dense_layers: int = 0, bf16_scale: float = 1.0) -> float:
        """Bytes of all weights as stored (quantized parts at their packed size).

        `bf16_scale` scales the unquantized parts (2.0 for `--dtype float32`).
        """
        q = self.quant
        dense = q.dense_bytes * (bf16_scale if q.dense_bytes >= 2 else 1.0)
        expert = q.expert_bytes * (bf16_scale if q.expert_bytes >= 2 else 1.0)
        layers = (self.layers + extra_dense_layers) * self.dense_params_per_layer * dense
        experts = self.moe_layers * self.num_experts * self.expert_params * expert
        return layers + experts + 2 * self.lm_head_params * 2.0 * bf16_scale


def _need(cfg: dict[str, Any], key: str, path: str) -> Any:
    if key not in cfg:
        raise ModelConfigError(f"{path}: config.json has no {key!r}")
    return cfg[key]


def _attention_params(cfg: dict[str, Any], hidden: int, q_heads: int, kv_heads: int, head_dim: int) -> int:
    """Parameters of one full-attention layer (GQA, gated GQA, or DeepSeek's latent attention)."""
    if cfg.get("kv_lora_rank"):
        rope, nope = int(cfg.get("qk_rope_head_dim", 64)), int(cfg.get("qk_nope_head_dim", 128))
        v_dim, kv_rank = int(cfg.get("v_head_dim", 128)), int(cfg["kv_lora_rank"])
        q_rank = int(cfg.get("q_lora_rank") or 0)
        q = hidden * q_rank + q_rank * q_heads * (nope + rope) if q_rank else hidden * q_heads * (nope + rope)
        kv = hidden * (kv_rank + rope) + kv_rank * q_heads * (nope + v_dim)
        return q + kv + q_heads * v_dim * hidden
    gate = 2 if cfg.get("attn_output_gate") else 1
    return hidden * q_heads * head_dim * gate + 2 * hidden * kv_heads * head_dim + q_heads * head_dim * hidden


def model_info(config: dict[str, Any], *, name: str = "model", path: str = "config.json") -> ModelInfo:
    """Derive `ModelInfo` from a config dict (plain or with a nested `text_config`). One piece because
    it reads the config once, key by key, each size feeding the next (layer kinds, attention, MoE);
    a third of it is the constructor call."""
    arch = (config.get("architectures") or ["unknown"])[0]
    cfg = config.get("text_config") or config
    hidden = int(_need(cfg, "hidden_size", path))
    layers = int(_need(cfg, "num_hidden_layers", path))
    q_heads = int(_need(cfg, "num_attention_heads", path))
    kv_heads = int(cfg.get("num_key_value_heads") or q_heads)
    mla = int(cfg.get("kv_lora_rank") or 0)
    if mla:
        head_dim = int(cfg.get("qk_nope_head_dim", 128)) + int(cfg.get("qk_rope_head_dim", 64))
    else:
        head_dim = int(cfg.get("head_dim") or hidden // q_heads)
    vocab = int(_need(cfg, "vocab_size", path))
    kinds = cfg.get("layer_types") or ["full_attention"] * layers
    linear = sum(1 for k in kinds if k == "linear_attention")
    # Sliding-window layers (gpt-oss alternates them) hold a bounded window, not the context.
    sliding = sum(1 for k in kinds if k in ("sliding_attention", "sliding_window_attention"))
    full = layers - linear - sliding
    full_attn = _attention_params(cfg, hidden, q_heads, kv_heads, head_dim)
    lk, lv = int(cfg.get("linear_key_head_dim", 128)), int(cfg.get("linear_value_head_dim", 128))
    lkh, lvh = int(cfg.get("linear_num_key_heads", 16)), int(cfg.get("linear_num_value_heads", 32))
    lin_attn = hidden * (2 * lkh * lk + 3 * lvh * lv) + lvh * lv * hidden
    attn = ((full + sliding) * full_attn + linear * lin_attn) // layers
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    moe_layers = 0
    if experts:
        topk = int(cfg.get("num_experts_per_tok") or _need(cfg, "experts_per_token", path))
        # Mixtral and gpt-oss size each expert with `intermediate_size`; Qwen/DeepSeek have a separate key.
        inter = int(cfg.get("moe_intermediate_size") or _need(cfg, "intermediate_size", path))
        expert = 3 * hidden * inter
        shared_inter = int(cfg.get("shared_expert_intermediate_size") or 0)
        shared_inter = shared_inter or int(cfg.get("n_shared_experts") or 0) * inter
        dense_first = int(cfg.get("first_k_dense_replace") or 0)
        moe_layers = layers - dense_first
        dense_mlp = dense_first * 3 * hidden * int(cfg.get("intermediate_size") or 0)
        mlp = (moe_layers * (3 * hidden * shared_inter + hidden * experts) + dense_mlp) // layers
    else:
        topk, expert = 0, 0
        mlp = 3 * hidden * int(_need(cfg, "intermediate_size", path))
    mtp = int(cfg.get("mtp_num_hidden_layers") or cfg.get("num_nextn_predict_layers") or 0)
    eos = cfg.get("eos_token_id", config.get("eos_token_id", 2))
    try:
        quant = parse_quant(config, path)
    except QuantConfigError as e:
        raise ModelConfigError(str(e)) from e
    return ModelInfo(
        name=name,
        architecture=arch,
        hidden=hidden,
        layers=layers,
        full_attn_layers=full,
        linear_attn_layers=linear,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        num_experts=experts,
        experts_per_tok=topk,
        expert_params=expert,
        dense_params_per_layer=attn + mlp,
        lm_head_params=vocab * hidden,
        linear_state_bytes_per_layer=lvh * lk * lv * 4,
        mtp_layers=mtp,
        max_context=int(cfg.get("max_position_embeddings", 32768)),
        eos_token_id=int(eos[0] if isinstance(eos, list) else eos),
        sliding_attn_layers=sliding,
        sliding_window=int(cfg.get("sliding_window") or 0) if sliding else 0,
        mla_kv_dim=mla + int(cfg.get("qk_rope_head_dim", 64)) if mla else 0,
        moe_layers=moe_layers,
        attention_sinks=arch == "GptOssForCausalLM",  # learned per-head sinks
        quant=quant,
    )


def load_model_info(model_path: str) -> ModelInfo:
    """Read `config.json` in `model_path`; a bare bundled name (`Qwen3-30B-A3B`) also works."""
    path = Path(model_path)
    candidates = [path / "config.json", BUNDLED_MODELS / path.name / "config.json"]
    for cfg_path in candidates:
        if cfg_path.is_file():
            try:
                config = json.loads(cfg_path.read_text())
            except json.JSONDecodeError as e:
                raise ModelConfigError(f"{cfg_path}: not valid JSON: {e}") from e
            return model_info(config, name=path.name, path=str(cfg_path))
    raise ModelConfigError(
        f"Can't load the configuration of '{model_path}'. It is not a local folder with a "
        "config.json, and the simulator has no bundled model of that name."
    )
