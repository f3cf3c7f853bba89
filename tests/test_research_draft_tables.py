"""A backend built only where another setting selects it (issue 53): the caller walk must not
take it as built because of uses that build nothing. On a small SGLang-shaped tree and on the
real 0.5.23 wheel, where `--speculative-eagle-topk 4` on the seed deployment (Qwen3.5, triton,
NEXTN) was said to refuse at the DeepSeek-V4 backend's `assert self.topk in [0, 1]`
(deepseek_v4_backend.py:1338). Three uses kept that backend open:

- another backend's class body borrows its methods (`forward = DeepseekV4AttnBackend.forward`,
  deepseek_v4_backend_hip_radix.py:887): module-level code that only takes attributes of a class;
- the draft backend factory holds its builder in a table keyed like the attention registry
  (`"dsv4": self._create_dsv4_decode_backend`, draft_utils.py:112, selected by the attention
  backend at draft_utils.py:61-66), as `@register_attention_backend("dsv4")` is
  (attention_registry.py:177);
- a draft worker lists it among the classes of an `isinstance` test
  (`graph_supported_backend_types.append(DeepseekV4AttnBackend)`, eagle_worker_v2.py:586, read
  only at eagle_worker_v2.py:601)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.sglang_src import synthetic_tree
from tests.research_profiles import DATA, PROFILES, profile_argv, profile_facts
from tools.research.analysis import analyze_flag
from tools.research.index import load_index
from tools.research.startup.check import argv_of, flag_argv, startup_answer

SEED = "qwen35-rtx6000x4"
"""The seed deployment's profile; it launches NEXTN without the draft shape the seed unit sets."""

FILES = {
    "srt/server_args.py": """
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            attention_backend: str = None
            draft_attention_backend: str = None
            eagle_topk: int = 1
            tp_size: int = 1

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--attention-backend", default=ServerArgs.attention_backend)
                parser.add_argument("--draft-attention-backend", default=ServerArgs.draft_attention_backend)
                parser.add_argument("--eagle-topk", type=int, default=ServerArgs.eagle_topk)
                parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
        """,
    "srt/config.py": """
        def get_args():
            return _ARGS
        """,
    "srt/layers/attention/registry.py": """
        ATTENTION_BACKENDS = {}

        def register_attention_backend(name):
            def deco(fn):
                ATTENTION_BACKENDS[name] = fn
                return fn
            return deco

        @register_attention_backend("triton")
        def create_triton_backend(runner):
            from sglang.srt.layers.attention.triton_backend import TritonBackend
            return TritonBackend(runner)

        @register_attention_backend("fa3")
        def create_fa3_backend(runner):
            from sglang.srt.layers.attention.triton_backend import TritonBackend
            return TritonBackend(runner)

        @register_attention_backend("v4")
        def create_v4_backend(runner):
            from sglang.srt.layers.attention.v4_backend import V4Backend
            return V4Backend(runner)
        """,
    "srt/layers/attention/triton_backend.py": """
        from sglang.srt.config import get_args

        class TritonBackend:
            def __init__(self, runner):
                self.topk = get_args().eagle_topk
        """,
    "srt/layers/attention/v4_backend.py": """
        from sglang.srt.config import get_args

        class V4Backend:
            def __init__(self, runner):
                self.topk = get_args().eagle_topk
                assert self.topk in [0, 1], "topk > 1 not supported for V4"

            def forward(self, q):
                return q
        """,
    "srt/layers/attention/v4_hip_backend.py": """
        from sglang.srt.layers.attention.v4_backend import V4Backend

        class V4HipBackend:
            forward = V4Backend.forward
        """,
    "srt/speculative/draft_utils.py": """
        from sglang.srt.config import get_args

        class DraftBackendFactory:
            def __init__(self, runner):
                self.runner = runner

            def create_decode_backend(self):
                backend_map = {
                    "triton": self._create_triton_decode_backend,
                    "fa3": self._create_triton_decode_backend,
                    "hybrid": self._create_triton_decode_backend,
                    "v4": self._create_v4_decode_backend,
                }
                backend = get_args().draft_attention_backend or get_args().attention_backend
                return backend_map[backend]()

            def _create_triton_decode_backend(self):
                from sglang.srt.layers.attention.triton_backend import TritonBackend
                return TritonBackend(self.runner)

            def _create_v4_decode_backend(self):
                from sglang.srt.layers.attention.v4_backend import V4Backend
                return V4Backend(self.runner)
        """,
    "srt/speculative/eagle_worker.py": """
        from sglang.srt.speculative.draft_utils import DraftBackendFactory

        class EagleWorker:
            def __init__(self, runner):
                self.backend = DraftBackendFactory(runner).create_decode_backend()
                self.graphs = self.supports_graphs()

            def supports_graphs(self):
                from sglang.srt.layers.attention.triton_backend import TritonBackend
                from sglang.srt.layers.attention.v4_backend import V4Backend

                graph_types = [TritonBackend]
                graph_types.append(V4Backend)
                return isinstance(self.backend, tuple(graph_types))
        """,
    "srt/managers/scheduler.py": """
        from sglang.srt.layers.attention.registry import ATTENTION_BACKENDS
        from sglang.srt.speculative.eagle_worker import EagleWorker
        from sglang.srt.config import get_args

        def run_scheduler(runner):
            backend = ATTENTION_BACKENDS[get_args().attention_backend](runner)
            draft = EagleWorker(runner)
            return backend, draft
        """,
}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.54"))


def _facts(backend: str, draft: str | None = None) -> dict[str, object]:
    return {
        "gpu.sm": 90,
        "gpu.count": 1,
        "server.tp_size": 1,
        "server.attention_backend": backend,
        "server.draft_attention_backend": draft,
    }


def test_a_backend_only_a_table_of_another_key_holds_does_not_refuse(index) -> None:  # type: ignore[no-untyped-def]
    """V4Backend's refusal is reached only where V4Backend is built: by the registry and the draft
    factory's table under "v4". Another backend borrowing its method, and a worker listing it for
    an `isinstance` test, build nothing; on triton the topk applies. Selected by the attention
    backend or by the draft's own setting, the entry runs and refuses."""
    v = analyze_flag(index, "--eagle-topk", _facts("triton"), value="4")
    assert v.verdict == "applies", v.summary
    [reader] = [f for f in v.findings if f.function == "V4Backend.__init__"]
    assert reader.state == "off", reader.why
    assert "under 'v4' in a table keyed by attention_backend" in reader.why, reader.why
    for backend, draft in (("v4", None), ("triton", "v4")):
        v = analyze_flag(index, "--eagle-topk", _facts(backend, draft), value="4")
        assert v.verdict == "refuses-to-start", (backend, draft, v.summary)
        assert "v4_backend.py:7" in v.summary, v.summary


def test_each_use_that_builds_nothing_is_recorded_for_what_it_is(index) -> None:  # type: ignore[no-untyped-def]
    """The index keeps what each use does: a class body taking a method, a table entry and its
    key, a class put into a list only an `isinstance` test reads."""
    hip = index.modules["sglang/srt/layers/attention/v4_hip_backend.py"]
    assert hip.held == {"V4Backend": ["forward"]}
    factory = index.func("sglang/srt/speculative/draft_utils.py", "DraftBackendFactory.create_decode_backend")
    [(key, keys, _line)] = factory.entries["_create_v4_decode_backend"]
    assert (key, keys) == ("v4", ("triton", "fa3", "hybrid", "v4"))
    worker = index.func("sglang/srt/speculative/eagle_worker.py", "EagleWorker.supports_graphs")
    assert {"TritonBackend", "V4Backend"} <= set(worker.typed)


def test_speculative_eagle_topk_on_the_seed_deployment_in_0523(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """0.5.23, Qwen3.5-122B-A10B on triton with NEXTN (3 steps, 4 draft tokens): no DeepSeek-V4
    backend is built, so its `MTP Topk > 1` assertion (deepseek_v4_backend.py:1338) cannot fire;
    SGLang's own resolution accepts topk 4, which widens the draft tree the speculative
    allocation sizes (allocation_sizing.py:40: `spec.speculative_eagle_topk or 1`)."""
    index = load_index(sglang_0523)
    spec = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    facts = {**profile_facts(SEED), **{f"server.{k}": v for k, v in spec.items()}}
    startup = startup_answer(
        sglang_0523,
        facts,
        flag_argv("--speculative-eagle-topk", "4", takes_value=True),
        base_argv=[*profile_argv(SEED), *argv_of(spec)],
        model_config=DATA / "model-configs" / PROFILES[SEED]["config"],
    )
    assert startup.kind == "changed", startup.message  # SGLang starts, with topk 4
    v = analyze_flag(index, "--speculative-eagle-topk", facts, value="4", startup=startup)
    assert v.verdict == "applies", v.summary
    [v4] = [f for f in v.findings if f.function == "DeepseekV4AttnBackend.__init__"]
    assert v4.state == "off", v4.why
