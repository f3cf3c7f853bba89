"""Model facts from a Hugging Face `config.json`: MoE shape, attention kinds, dtype, parameter counts.

The config comes from a local file or directory, from the target host through a transport (the
`--model-path` directory of the unit file), or from the Hugging Face hub over httpx. Multimodal
configs keep the language model under `text_config`; the facts describe that part.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class ModelConfigError(Exception):
    """A config.json that cannot be found, fetched or read."""


@dataclass
class ModelFacts:
    """What research needs to know about the served model (parameter counts are estimates)."""

    architecture: str | None
    model_type: str | None
    is_moe: bool
    num_experts: int
    experts_per_tok: int
    shared_experts: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    attention_kinds: list[str]
    layer_kinds: dict[str, int] = field(default_factory=dict)
    dtype: str | None = None
    quantization: str | None = None
    mtp_layers: int = 0
    vocab_size: int = 0
    total_params: int = 0
    active_params: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    def summary(self) -> str:
        """One line: `Qwen3MoeForCausalLM, MoE 128 experts top-8, 94 layers, 235B total / 22B active`."""
        shape = f"MoE {self.num_experts} experts top-{self.experts_per_tok}" if self.is_moe else "dense"
        if self.shared_experts:
            shape += f" +{self.shared_experts} shared"
        return (
            f"{self.architecture}, {shape}, {self.num_layers} layers, attention {'+'.join(self.attention_kinds)}, "
            f"{self.num_kv_heads} KV heads, {self.dtype}{f' {self.quantization}' if self.quantization else ''}, "
            f"~{self.total_params / 1e9:.1f}B total / ~{self.active_params / 1e9:.1f}B active"
            + (f", {self.mtp_layers} MTP layer(s)" if self.mtp_layers else "")
        )


_KIND_NAMES = {"full_attention": "full", "linear_attention": "linear", "sliding_attention": "sliding"}


def _int(cfg: dict[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return default


def model_facts(config: dict[str, Any]) -> ModelFacts:
    """Derive `ModelFacts` from a parsed config.json (top level or its `text_config`)."""
    if not isinstance(config, dict):
        raise ModelConfigError("config.json must hold a JSON object")
    cfg = {**config, **config["text_config"]} if isinstance(config.get("text_config"), dict) else config
    hidden = _int(cfg, "hidden_size", "d_model", "n_embd")
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    if not hidden or not layers:
        raise ModelConfigError(
            "config.json has no hidden_size / num_hidden_layers: not a language model config"
        )
    heads = _int(cfg, "num_attention_heads", "n_head", default=1)
    kv_heads = _int(cfg, "num_key_value_heads", default=heads)
    head_dim = _int(cfg, "head_dim", default=hidden // max(heads, 1))
    experts = _int(cfg, "num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
    topk = _int(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk", "top_k") if experts else 0
    shared = _int(cfg, "n_shared_experts", "num_shared_experts")
    if not shared and _int(cfg, "shared_expert_intermediate_size"):
        shared = 1
    kinds: dict[str, int] = {}
    for kind in cfg.get("layer_types") or []:
        name = _KIND_NAMES.get(kind, kind)
        kinds[name] = kinds.get(name, 0) + 1
    if not kinds:
        kinds = {"mla" if cfg.get("kv_lora_rank") else "full": layers}
    elif cfg.get("kv_lora_rank") and "full" in kinds:
        kinds["mla"] = kinds.pop("full")
    quant = cfg.get("quantization_config") or {}
    total, active = _param_estimate(
        cfg, hidden, layers, heads, kv_heads, head_dim, kinds, experts, topk, shared
    )
    return ModelFacts(
        architecture=(cfg.get("architectures") or [None])[0],
        model_type=cfg.get("model_type"),
        is_moe=experts > 1,
        num_experts=experts,
        experts_per_tok=topk,
        shared_experts=shared,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        attention_kinds=sorted(kinds),
        layer_kinds=kinds,
        dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        quantization=quant.get("quant_method") if isinstance(quant, dict) else None,
        mtp_layers=_int(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers"),
        vocab_size=_int(cfg, "vocab_size"),
        total_params=total,
        active_params=active,
    )


def _attention_params(
    cfg: dict[str, Any], kind: str, hidden: int, heads: int, kv_heads: int, head_dim: int
) -> int:
    if kind == "mla":
        rope, nope = _int(cfg, "qk_rope_head_dim"), _int(cfg, "qk_nope_head_dim")
        v_dim, kv_rank, q_rank = _int(cfg, "v_head_dim"), _int(cfg, "kv_lora_rank"), _int(cfg, "q_lora_rank")
        q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        return q + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * hidden
    if kind == "linear":
        k_dim = _int(cfg, "linear_num_key_heads") * _int(cfg, "linear_key_head_dim")
        v_dim = _int(cfg, "linear_num_value_heads") * _int(cfg, "linear_value_head_dim")
        return hidden * (2 * k_dim + 2 * v_dim) + v_dim * hidden
    q = hidden * heads * head_dim * (2 if cfg.get("attn_output_gate") else 1)
    return q + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden


def _param_estimate(
    cfg: dict[str, Any],
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    kinds: dict[str, int],
    experts: int,
    topk: int,
    shared: int,
) -> tuple[int, int]:
    """Total and per-token active parameters of the main model (MTP layers excluded)."""
    attn = sum(n * _attention_params(cfg, k, hidden, heads, kv_heads, head_dim) for k, n in kinds.items())
    dense_inter = _int(cfg, "intermediate_size")
    dense_mlp = 3 * hidden * dense_inter
    if experts > 1:
        expert_inter = _int(cfg, "moe_intermediate_size", default=dense_inter)
        shared_inter = _int(cfg, "shared_expert_intermediate_size", default=shared * expert_inter)
        dense_layers = _int(cfg, "first_k_dense_replace") + len(cfg.get("mlp_only_layers") or [])
        moe_layers = layers - dense_layers
        expert = 3 * hidden * expert_inter
        common = 3 * hidden * shared_inter + hidden * experts
        mlp_total = moe_layers * (experts * expert + common) + dense_layers * dense_mlp
        mlp_active = moe_layers * (topk * expert + common) + dense_layers * dense_mlp
    else:
        mlp_total = mlp_active = layers * dense_mlp
    vocab = _int(cfg, "vocab_size")
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return attn + mlp_total + embed, attn + mlp_active + embed


def load_model_config(path: Path | str) -> dict[str, Any]:
    """Read `config.json` from a file or a model directory."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ModelConfigError(f"{path}: no such file") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path}: config.json must hold a JSON object")
    return data


async def fetch_model_config(
    model_path: str, transport: Any = None, *, hub_endpoint: str | None = None, revision: str = "main"
) -> dict[str, Any]:
    """config.json of `--model-path`: on the host (via `transport`), locally, or from the HF hub.

    The hub is asked only when the path is not a directory there; `HF_TOKEN` authenticates and
    `HF_ENDPOINT` (or `hub_endpoint`) names a mirror.
    """
    candidate = model_path.rstrip("/") + "/config.json"
    if transport is not None and await transport.exists(candidate):
        try:
            return json.loads(await transport.read_file(candidate))
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"{candidate} on the host: not valid JSON: {e}") from e
    if transport is None and Path(model_path).expanduser().exists():
        return load_model_config(model_path)
    if model_path.startswith(("/", ".", "~")) or model_path.count("/") != 1:
        raise ModelConfigError(f"{model_path}: no config.json there, and it is not a hub id (org/name)")
    return await _fetch_hub(model_path, hub_endpoint or os.environ.get("HF_ENDPOINT"), revision)


async def _fetch_hub(repo_id: str, endpoint: str | None, revision: str) -> dict[str, Any]:
    import httpx

    base = (endpoint or "https://huggingface.co").rstrip("/")
    url = f"{base}/{repo_id}/resolve/{revision}/config.json"
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with httpx.AsyncClient(timeout=20.0, follow_redirects=True) as client:
            resp = await client.get(url, headers=headers)
    except httpx.HTTPError as e:
        raise ModelConfigError(f"cannot reach {base} for {repo_id} (offline? set HF_ENDPOINT): {e}") from e
    if resp.status_code in (401, 403):
        raise ModelConfigError(f"{url}: HTTP {resp.status_code}; a gated model needs HF_TOKEN")
    if resp.status_code != 200:
        raise ModelConfigError(f"{url}: HTTP {resp.status_code}")
    try:
        return resp.json()
    except ValueError as e:
        raise ModelConfigError(f"{url}: not JSON") from e
