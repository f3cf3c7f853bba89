"""Step times from first principles: bytes over bandwidth, FLOPs over compute, all-reduces, launches.

Every flag acts through one of these terms (see `Plan`): CUDA graphs remove per-kernel launch cost,
the fused MoE sum removes a kernel and a round trip of the per-expert outputs, all-reduce fusion
shortens each all-reduce, speculative decoding trades extra tokens per forward for accepted tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.modelinfo import ModelInfo
from sim.plan import ATTN_EFFICIENCY, Plan
from sim.scenario import Scenario


def draft_tree(acceptance: float, steps: int, topk: int, draft_tokens: int) -> dict[tuple[int, ...], float]:
    """The nodes EAGLE verifies, each a path of candidate ranks (`(1, 2)`: the second candidate after
    the first), with its chance of lying on the accepted path.

    EAGLE-2's draft tree (`speculative/eagle_utils.py` `organize_draft_results`): each of `steps`
    draft passes expands the best `topk` candidates of every kept node, and the verify tree is the
    `draft_tokens - 1` nodes of highest path score. Here the draft's candidate of rank r at a node is
    the target's token with chance `a (1 - a)^(r - 1)` (rank 1: the acceptance `a`), a path's chance
    is the product along it, and the tree keeps the most likely nodes. With top-k 1 (draft tokens =
    steps + 1) it is the chain `(1,), (1, 1), ...`; a wider top-k adds branches only where the
    draft-token budget holds them."""
    import heapq

    a = acceptance
    rank = [a * (1 - a) ** r for r in range(max(1, topk))]
    frontier = [(-p, (r + 1,)) for r, p in enumerate(rank)]  # (-chance, path)
    heapq.heapify(frontier)
    tree: dict[tuple[int, ...], float] = {}
    while frontier and len(tree) < draft_tokens - 1:
        neg, path = heapq.heappop(frontier)
        tree[path] = -neg
        if len(path) < steps:
            for r, p in enumerate(rank):
                heapq.heappush(frontier, (neg * p, (*path, r + 1)))
    return tree


def tree_accept_length(acceptance: float, steps: int, topk: int, draft_tokens: int) -> float:
    """Expected tokens one verify step yields per request: the bonus token plus each node's chance
    (the nodes of one depth are disjoint events); with top-k 1 the chain's `1 + a + ... + a^steps`."""
    return 1.0 + sum(draft_tree(acceptance, steps, topk, draft_tokens).values())


@dataclass(frozen=True)
class DecodeCost:
    seconds: float
    tokens_per_request: float
    """Expected tokens each running request gains in this step (> 1 with speculative decoding)."""


class PerfModel:
    """Time of one forward pass, decode step or prefill chunk for a plan on a scenario's hardware."""

    def __init__(self, plan: Plan, model: ModelInfo, scenario: Scenario) -> None:
        self.plan, self.model, self.hw, self.cal = plan, model, scenario.hardware, scenario.calibration
        self.acceptance = scenario.model.draft_acceptance
        self.tree = (
            draft_tree(self.acceptance, plan.spec_steps, plan.spec_topk, plan.spec_draft_tokens)
            if plan.spec_steps
            else {}
        )
        """The verify tree's nodes (`draft_tree`): what a request's accepted tokens are drawn from."""
        heads_per_gpu = max(1, math.ceil(model.kv_heads / plan.tp))
        # One layer's K+V of one token on one GPU; MLA keeps one latent vector, replicated per rank.
        layer_kv = model.mla_kv_dim or 2 * heads_per_gpu * model.head_dim
        self.kv_bytes_per_token = model.full_attn_layers * layer_kv * plan.kv_dtype_bytes
        # Sliding-window layers: their pool holds swa_full_tokens_ratio (0.8) x the full pool's tokens
        # (model_executor/pool_configurator.py), and a step reads at most the window per request.
        self.swa_bytes_per_token = model.sliding_attn_layers * layer_kv * plan.kv_dtype_bytes
        self.state_bytes_per_request = (
            model.linear_attn_layers * model.linear_state_bytes_per_layer / plan.tp
            + model.linear_attn_layers * 4 * model.hidden * 2 * 3 / plan.tp  # conv state
        )

    # -- capacity ------------------------------------------------------------------------------
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache that fit, after per-request recurrent state for the default batch."""
        budget = self.plan.kv_budget_bytes
        if self.state_bytes_per_request:
            budget *= 0.5  # hybrid models split the pool between KV and recurrent (mamba) state
        return int(budget / (self.kv_bytes_per_token + 0.8 * self.swa_bytes_per_token))

    def max_running_default(self) -> int:
        """SGLang's default cap: what the KV pool (and the recurrent-state pool) can hold."""
        cap = self.kv_capacity_tokens() // 512
        if self.state_bytes_per_request:
            cap = min(cap, int(self.plan.kv_budget_bytes * 0.5 / self.state_bytes_per_request))
        return max(1, min(cap, 4096))

    # -- one forward pass ----------------------------------------------------------------------
    def _distinct_experts(self, tokens: int) -> float:
        m = self.model
        if not m.is_moe:
            return 0.0
        return m.num_experts * (1.0 - (1.0 - m.experts_per_tok / m.num_experts) ** tokens)

    def forward_s(self, tokens: int, batch: int, ctx_tokens: int, *, layers: int, graphed: bool) -> float:
        """Seconds for one forward of `tokens` tokens of `batch` requests holding `ctx_tokens` of KV."""
        m, p, hw, cal = self.model, self.plan, self.hw, self.cal
        tp = p.tp
        experts = self._distinct_experts(tokens) * m.moe_fraction
        dense_b, expert_b = p.dense_weight_bytes, p.expert_weight_bytes
        weight_bytes = (
            layers * (m.dense_params_per_layer * dense_b + experts * m.expert_params * expert_b) / tp
        )
        weight_bytes += m.lm_head_params * 2 / tp
        frac_full = m.full_attn_layers / m.layers
        kv_bytes = ctx_tokens * self.kv_bytes_per_token * layers / m.layers
        if m.sliding_attn_layers:
            window = min(ctx_tokens / max(batch, 1), m.sliding_window) * batch
            kv_bytes += window * self.swa_bytes_per_token * layers / m.layers
        state_bytes = batch * self.state_bytes_per_request * layers / m.layers
        act_bytes = tokens * m.hidden * 2 * 8 * layers
        if m.is_moe and not p.fused_moe_sum:
            act_bytes += tokens * m.experts_per_tok * m.hidden * 2 * 2 * layers  # moe_sum_reduce round trip
        bw = hw.memory_bandwidth_gbps * 1e9 * cal.bw_efficiency
        attn_eff = ATTN_EFFICIENCY.get(p.attention_backend, 0.8)
        mem_t = (weight_bytes + act_bytes + state_bytes) / bw + kv_bytes / (bw * attn_eff)
        # FLOPs at each part's tensor-core rate: FP8/FP4 GEMMs run 2-4x the BF16 rate.
        dense = layers * m.dense_params_per_layer / p.dense_speedup + m.lm_head_params
        routed = layers * m.moe_fraction * m.experts_per_tok * m.expert_params / p.expert_speedup
        avg_ctx = ctx_tokens / max(batch, 1)
        attn_flops = 4 * tokens * avg_ctx * m.q_heads * m.head_dim * layers * frac_full
        if m.sliding_attn_layers:
            swa_ctx = min(avg_ctx, m.sliding_window)
            attn_flops += (
                4 * tokens * swa_ctx * m.q_heads * m.head_dim * layers * m.sliding_attn_layers / m.layers
            )
        comp_t = (
            (2 * (dense + routed) * tokens + attn_flops)
            / tp
            / (hw.bf16_tflops * 1e12 * cal.compute_efficiency)
        )
        gpu_t = max(mem_t, comp_t) + 0.15 * min(mem_t, comp_t)
        kernels = cal.kernels_per_layer * layers
        if m.is_moe and p.fused_moe_sum:
            kernels -= layers
        ar_t = 0.0
        if tp > 1:
            latency = hw.interconnect.latency_us * 1e-6 * (0.6 if p.ar_fusion and tokens <= 2048 else 1.0)
            volume = tokens * m.hidden * 2 * 2 * (tp - 1) / tp
            ar_t = 2 * layers * (latency + volume / (hw.interconnect.bandwidth_gbps * 1e9))
            if p.ar_fusion:
                kernels -= 2 * layers  # residual add + RMSNorm fused into the all-reduce
        if p.torch_compile_max_bs and batch <= p.torch_compile_max_bs:
            kernels = int(kernels * 0.7)
            gpu_t *= 0.97
        launch_t = cal.graph_launch_us * 1e-6 if graphed else kernels * cal.launch_overhead_us * 1e-6
        return gpu_t + ar_t + launch_t

    # -- scheduler-level costs ----------------------------------------------------------------
    def decode_cost(self, batch: int, ctx_tokens: int) -> DecodeCost:
        """One decode iteration of `batch` running requests (with speculative drafting if enabled)."""
        p, m = self.plan, self.model
        graphed = 0 < batch <= p.cuda_graph_max_bs
        overhead = self.cal.step_overhead_ms * 1e-3
        if not p.spec_steps:
            t = self.forward_s(batch, batch, ctx_tokens, layers=m.layers, graphed=graphed)
            return DecodeCost(t + overhead, 1.0)
        draft_layers = max(1, m.mtp_layers)
        draft = p.spec_steps * self.forward_s(
            batch * p.spec_topk, batch, ctx_tokens, layers=draft_layers, graphed=graphed
        )
        verify_tokens = batch * p.spec_draft_tokens
        verify = self.forward_s(verify_tokens, batch, ctx_tokens, layers=m.layers, graphed=graphed)
        extend = self.forward_s(verify_tokens, batch, ctx_tokens, layers=draft_layers, graphed=graphed)
        gained = 1.0 + sum(self.tree.values())
        spec_work = batch * self.cal.spec_overhead_us_per_req * 1e-6
        return DecodeCost(draft + verify + extend + overhead * 1.5 + spec_work, gained)

    def prefill_s(self, tokens: int, requests: int, ctx_tokens: int, *, decode_batch: int = 0) -> float:
        """A prefill chunk of `tokens` new tokens (optionally mixed with a decode batch)."""
        m = self.model
        t = self.forward_s(
            tokens + decode_batch, requests + decode_batch, ctx_tokens, layers=m.layers, graphed=False
        )
        if self.plan.spec_steps:
            t += self.forward_s(tokens, requests, ctx_tokens, layers=max(1, m.mtp_layers), graphed=False)
        return t + self.cal.step_overhead_ms * 1e-3
