"""Construction reach (tools.research.callers) on a small SGLang-shaped tree: a reader inside a class
runs only where the class is built, and a value that travels through a local into a module global
is followed as a store. Checked against the real 0.5.23 tree for a flag only DeepSeek attention
reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.sglang_src import synthetic_tree
from tests.research_profiles import profile_facts
from tools.research.analysis import analyze_flag
from tools.research.index import load_index

FILES = {
    "srt/server_args.py": """
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            attention_backend: str = None
            kv_splits: int = 8
            decode_steps: int = 1
            page_hint: int = 0
            trace_modules: str = None
            gemm_backend: str = "auto"
            quiet_mode: bool = False
            disagg_mode: str = "null"
            prealloc_reserve: int = 0
            load_format: str = "auto"
            verify_weights: bool = False
            disable_custom_ar: bool = False
            disable_warm_ar: bool = False
            tp_size: int = 1
            pp_size: int = 1
            dp_size: int = 1
            speculative_algorithm: str = None
            fp8_runner: str = "auto"
            pool_ratio: float = None  # resolved later (0.8), as SGLang 0.5.23 does
            hybrid_pools: bool = False
            _pool_ratio_explicit: bool = None

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--attention-backend", default=ServerArgs.attention_backend)
                parser.add_argument("--kv-splits", type=int, default=ServerArgs.kv_splits)
                parser.add_argument("--decode-steps", type=int, default=ServerArgs.decode_steps)
                parser.add_argument("--page-hint", type=int, default=ServerArgs.page_hint)
                parser.add_argument("--trace-modules", default=ServerArgs.trace_modules)
                parser.add_argument("--gemm-backend", default=ServerArgs.gemm_backend)
                parser.add_argument("--quiet-mode", action="store_true")
                parser.add_argument("--disagg-mode", default=ServerArgs.disagg_mode)
                parser.add_argument("--prealloc-reserve", type=int, default=ServerArgs.prealloc_reserve)
                parser.add_argument("--load-format", default=ServerArgs.load_format)
                parser.add_argument("--verify-weights", action="store_true")
                parser.add_argument("--disable-custom-ar", action="store_true")
                parser.add_argument("--disable-warm-ar", action="store_true")
                parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
                parser.add_argument("--pp-size", type=int, default=ServerArgs.pp_size)
                parser.add_argument("--dp-size", type=int, default=ServerArgs.dp_size)
                parser.add_argument("--speculative-algorithm", default=ServerArgs.speculative_algorithm)
                parser.add_argument("--fp8-runner", default=ServerArgs.fp8_runner)
                parser.add_argument("--pool-ratio", type=float, default=ServerArgs.pool_ratio)
                parser.add_argument("--hybrid-pools", action="store_true")
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
            from sglang.srt.layers.attention.fa3_backend import Fa3Backend
            return Fa3Backend(runner)
        """,
    "srt/layers/attention/triton_backend.py": """
        from sglang.srt.config import get_args

        class TritonBackend:
            def __init__(self, runner):
                self.splits = get_args().kv_splits
                self.runner = runner

            def forward(self, q):
                if get_args().decode_steps > 1:
                    return launch_steps(q, self.splits)
                return launch(q, self.splits)
        """,
    "srt/layers/attention/fa3_backend.py": """
        from sglang.srt.config import get_args

        class BaseBackend:
            def __init__(self, runner):
                self.page = get_args().page_hint
                self.runner = runner

        class Fa3Backend(BaseBackend):
            def forward(self, q):
                return flash(q, self.page)
        """,
    "srt/models/gemma_mm.py": """
        from sglang.srt.layers.attention.triton_backend import TritonBackend

        class GemmaForConditionalGeneration:
            def prepare(self, backend):
                if not isinstance(backend, TritonBackend):
                    raise ValueError("bidirectional attention needs the triton backend")

        EntryClass = GemmaForConditionalGeneration
        """,
    "srt/speculative/spec_info.py": """
        from enum import Enum, auto

        class SpeculativeAlgorithm(Enum):
            EAGLE = auto()
            NONE = auto()

            @classmethod
            def from_string(cls, name):
                if name is None:
                    return cls.NONE
                return cls[name.upper()]

            def is_none(self) -> bool:
                return self == SpeculativeAlgorithm.NONE

            def create_worker(self):
                from sglang.srt.speculative.eagle_worker import EagleWorker
                return EagleWorker
        """,
    "srt/speculative/eagle_worker.py": """
        from sglang.srt.layers.attention.triton_backend import TritonBackend

        class DraftBackendFactory:
            def __init__(self, runner):
                self.runner = runner

            def create_decode_backend(self):
                return TritonBackend(self.runner)

        class DraftWorker:
            def __init__(self, runner):
                self.runner = runner

            def init_attention_backend(self):
                self.backend = DraftBackendFactory(self.runner).create_decode_backend()

        class EagleWorker:
            def __init__(self, runner):
                from sglang.srt.speculative.standalone import StandaloneDraftWorker

                self.draft = StandaloneDraftWorker(runner)
        """,
    "srt/speculative/standalone.py": """
        from sglang.srt.speculative.eagle_worker import DraftWorker as BaseDraftWorker

        class StandaloneDraftWorker(BaseDraftWorker):
            def __init__(self, runner):
                self.runner = runner
                self.init_attention_backend()
        """,
    "srt/managers/scheduler.py": """
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        class SpecScheduler:
            def __init__(self, server_args):
                self.server_args = server_args
                self.spec_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)

            def maybe_init_draft_worker(self, runner):
                if self.spec_algorithm.is_none():
                    self.draft_worker = None
                    return
                worker_class = self.spec_algorithm.create_worker()
                self.draft_worker = worker_class(runner)
        """,
    "srt/layers/quantization/__init__.py": """
        from sglang.srt.layers.quantization.fp8 import Fp8Config

        BASE_METHODS = {"fp8": Fp8Config}
        QUANT_METHODS = {**BASE_METHODS}

        def get_quantization_config(name):
            if name not in QUANT_METHODS:
                raise ValueError("unknown quantization method")
            return QUANT_METHODS[name]
        """,
    "srt/layers/quantization/fp8.py": """
        from sglang.srt.config import get_args

        class Fp8LinearMethod:
            def __init__(self, config: "Fp8Config"):
                self.runner = get_args().fp8_runner
                self.ue8m0 = isinstance(config, Fp8Config)

            def apply(self, x):
                return gemm(x, self.runner)

        class Fp8Config:
            def __init__(self, block):
                self.block = block

            @classmethod
            def from_config(cls, cfg):
                return cls(cfg.get("block"))

            @classmethod
            def override_quantization_method(cls, cfg):
                return None

            def get_quant_method(self, layer):
                return Fp8LinearMethod(self)
        """,
    "srt/model_loader/quant.py": """
        from sglang.srt.layers.quantization import QUANT_METHODS, get_quantization_config
        from sglang.srt.layers.quantization.fp8 import Fp8LinearMethod

        def get_quant_config(model_config):
            quant_cls = get_quantization_config(model_config.quantization)
            return quant_cls.from_config({})

        def load_quant(model_config):
            if model_config.quantization is not None:
                return get_quant_config(model_config)
            return None

        def is_known(name):
            return name in QUANT_METHODS

        def verify_quantization(model_config):
            supported = [*QUANT_METHODS]
            for _, method in QUANT_METHODS.items():
                if method.override_quantization_method(model_config):
                    return supported

        def is_fp8_layer(layer):
            return isinstance(layer.quant_method, Fp8LinearMethod)
        """,
    "srt/arg_groups/pool_hook.py": """
        def resolve_pools(args):
            if args._pool_ratio_explicit is None:
                declare_resolution(args, "pools", _pool_ratio_explicit=args.pool_ratio is not None)
        """,
    "srt/model_executor/pools.py": """
        from sglang.srt.config import get_args

        class BasePool:
            def __init__(self, runner):
                self.runner = runner

        class HybridPool(BasePool):
            def __init__(self, runner):
                self.ratio = get_args().pool_ratio
                self.explicit = get_args()._pool_ratio_explicit
                self.runner = runner

        class CappedPool(HybridPool):
            def __init__(self, runner):
                super().__init__(runner)

            @staticmethod
            def is_applicable(runner):
                return runner.small

        def create_pool(runner):
            if get_args().hybrid_pools:
                if CappedPool.is_applicable(runner):
                    return CappedPool(runner)
                return HybridPool(runner)
            return BasePool(runner)
        """,
    "srt/disagg/decode.py": """
        from enum import Enum

        from sglang.srt.config import get_args

        class DisaggMode(Enum):
            NULL = "null"
            PREFILL = "prefill"
            DECODE = "decode"

        class DecodeQueue:
            def __init__(self):
                self.reserve = get_args().prealloc_reserve

        class Scheduler:
            def init_disagg(self):
                self.mode = DisaggMode(get_args().disagg_mode)
                if self.mode == DisaggMode.DECODE:
                    self.queue = DecodeQueue()
        """,
    "srt/model_loader/loader.py": """
        from sglang.srt.config import get_args

        class DiskLoader:
            def __init__(self):
                self.path = "/weights"

            def load_model(self, verify):
                return read_weights(self.path, verify)

        class RemoteLoader:
            def __init__(self):
                self.peer = "peer"

            def load_model(self, verify):
                assert not verify, "remote loading cannot verify weights"
                return fetch_weights(self.peer)

        def get_loader():
            if get_args().load_format == "remote":
                return RemoteLoader()
            return DiskLoader()

        def load(loader):
            return loader.load_model(get_args().verify_weights)
        """,
    "srt/distributed/groups.py": """
        from sglang.srt.config import get_args

        _ENABLE_CUSTOM_AR = True

        def set_custom_ar(enable):
            global _ENABLE_CUSTOM_AR
            _ENABLE_CUSTOM_AR = enable

        class Group:
            def __init__(self, ranks, use_custom_ar):
                self.world_size = len(ranks)
                self.use_custom_ar = use_custom_ar
                if use_custom_ar and self.world_size > 1:
                    self.comm = build_comm(ranks)

        def init_group(ranks, use_custom_ar=None):
            if use_custom_ar is None:
                use_custom_ar = _ENABLE_CUSTOM_AR
            return Group(ranks, use_custom_ar=use_custom_ar)

        _WARM_AR = True

        def set_warm_ar(enable):
            global _WARM_AR
            _WARM_AR = enable

        def init_warm_group(ranks, use_warm=None):
            if use_warm is None:
                use_warm = _WARM_AR
            if use_warm:
                warm_up(ranks)
            return Group(ranks, use_custom_ar=use_warm)

        def init_distributed():
            set_custom_ar(not get_args().disable_custom_ar)
            set_warm_ar(not get_args().disable_warm_ar)
            init_warm_group([0])
            return init_group([0])
        """,
    "srt/models/llama.py": """
        class LlamaForCausalLM:
            pass

        EntryClass = LlamaForCausalLM
        """,
    "srt/observability/trace.py": """
        from sglang.srt.config import get_args

        try:
            import zmq

            _zmq_ok = True
        except ImportError:
            _zmq_ok = False

        class Exporter:
            def __init__(self):
                self.modules = get_args().trace_modules
                start_process(self.modules)

        def start_exporter():
            if not _zmq_ok:
                return False
            Exporter()
            return True
        """,
    "srt/layers/gemm.py": """
        from sglang.srt.config import get_args

        GEMM_BACKEND = None

        def init_gemm_config():
            global GEMM_BACKEND
            backend = get_args().gemm_backend
            if backend == "auto":
                backend = "cutlass"
            GEMM_BACKEND = Backend(backend)

        def get_gemm_backend():
            return GEMM_BACKEND
        """,
    "srt/model_executor/runner.py": """
        import logging

        from sglang.srt.config import get_args
        from sglang.srt.layers.attention.registry import ATTENTION_BACKENDS
        from sglang.srt.layers.attention.triton_backend import TritonBackend
        from sglang.srt.layers.gemm import init_gemm_config
        from sglang.srt.observability.trace import start_exporter

        logger = logging.getLogger(__name__)

        class Runner:
            def __init__(self):
                init_gemm_config()
                start_exporter()
                self.backend = ATTENTION_BACKENDS[get_args().attention_backend](self)
                if not get_args().quiet_mode:
                    logger.info("runner ready")

            def describe(self, backend: TritonBackend) -> str:
                return "runner"
        """,
}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.7"))


def _facts(backend: str) -> dict[str, object]:
    return {
        "gpu.sm": 90,
        "gpu.count": 1,
        "server.tp_size": 1,
        "server.attention_backend": backend,
        "model.architecture": "LlamaForCausalLM",
        "server.speculative_algorithm": None,  # as a live server reports it
    }


def test_a_backend_the_registry_does_not_select_is_never_built(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--kv-splits", _facts("fa3"), value="16")
    assert v.verdict == "no-op", v.summary
    [reader] = [f for f in v.findings if f.location.endswith("triton_backend.py:6")]
    assert reader.state == "off"
    assert "attention_backend is 'triton'" in reader.why and "registry.py" in reader.why, reader.why
    # the isinstance check in another architecture's model file builds nothing
    assert "runs only when" in v.summary


def test_the_selected_backend_is_built(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--kv-splits", _facts("triton"), value="16")
    assert v.verdict == "applies", v.summary


def test_a_method_runs_only_where_its_class_is_built(index) -> None:  # type: ignore[no-untyped-def]
    """`forward` has callers nobody can resolve (any backend's forward); its class decides."""
    off = analyze_flag(index, "--decode-steps", _facts("fa3"), value="2")
    assert off.verdict == "no-op", off.summary
    assert "TritonBackend is not built here" in off.summary, off.summary
    on = analyze_flag(index, "--decode-steps", _facts("triton"), value="2")
    assert on.verdict == "applies", on.summary


def test_a_backend_built_only_by_draft_workers_needs_speculative_decoding(index) -> None:  # type: ignore[no-untyped-def]
    """Besides the registry, the draft worker's factory builds TritonBackend; that worker is a base
    class (imported under an alias) built through a subclass, which the class `create_worker`
    returns builds, which the scheduler asks for only when `SpeculativeAlgorithm.from_string(...)`
    is not NONE. Each answer is the deployment's own, whichever was researched first."""
    spec = {**_facts("fa3"), "server.speculative_algorithm": "eagle"}
    for _ in range(2):
        on = analyze_flag(index, "--kv-splits", spec, value="16")
        assert on.verdict == "applies", on.summary
        off = analyze_flag(index, "--kv-splits", _facts("fa3"), value="16")
        assert off.verdict == "no-op", off.summary
        # both reasons: the registry does not select triton, and no draft worker is built
        assert "attention_backend is 'triton'" in off.summary and "spec_algorithm.is_none()" in off.summary


def test_a_quantization_method_is_built_only_for_a_model_quantized_with_it(index) -> None:  # type: ignore[no-untyped-def]
    """Fp8LinearMethod is built by Fp8Config, which only its own classmethod builds (`cls(...)`);
    the class is held in a table (copied into another) whose entry `get_quantization_config` takes
    out, called only when the model is quantized. A membership test on the table, its keys
    (`[*TABLE]`), a loop that only calls its entries' classmethods that build nothing
    (`method.override_quantization_method(cfg)`, as ModelConfig._verify_quantization does), an
    `isinstance` and a type annotation build nothing."""
    plain = {**_facts("fa3"), "model_config.quantization": None}
    off = analyze_flag(index, "--fp8-runner", plain, value="triton")
    assert off.verdict == "no-op", off.summary
    assert "model_config.quantization" in off.summary, off.summary
    fp8 = {**_facts("fa3"), "model_config.quantization": "fp8"}
    on = analyze_flag(index, "--fp8-runner", fp8, value="triton")
    assert on.verdict == "applies", on.summary


def test_an_enum_method_is_evaluated_for_each_member_it_is_called_on(index) -> None:  # type: ignore[no-untyped-def]
    """The method's body is bound to its receiver afresh on every call (not once for all)."""
    from tools.research.callers import env_of
    from tools.research.facts import default_facts, deployment_facts
    from tools.research.guard_eval import evaluate

    facts = deployment_facts(index, _facts("fa3"), None, default_facts(index.catalog))
    where = index.func("sglang/srt/managers/scheduler.py", "SpecScheduler.maybe_init_draft_worker")
    env = env_of(index, where, facts, {}, {})
    assert evaluate("SpeculativeAlgorithm.EAGLE.is_none()", env).truth is False
    assert evaluate("SpeculativeAlgorithm.NONE.is_none()", env).truth is True
    assert evaluate("SpeculativeAlgorithm.from_string(None).is_none()", env).truth is True


def test_a_static_helper_called_on_a_class_does_not_build_it(index) -> None:  # type: ignore[no-untyped-def]
    """The factory asks `CappedPool.is_applicable(...)` (a static method) before building either
    hybrid pool; only a hybrid deployment builds one (issue 25's example 1: the SWA ratio on a
    model that is not hybrid-SWA)."""
    from tools.research.startup.check import StartupAnswer

    startup = StartupAnswer(kind="changed", changed={"pool_ratio": (0.8, 0.5)})  # nothing else
    off = analyze_flag(index, "--pool-ratio", _facts("fa3"), value="0.5", startup=startup)
    assert off.verdict == "no-op", off.summary
    hybrid = {**_facts("fa3"), "server.hybrid_pools": True}
    on = analyze_flag(index, "--pool-ratio", hybrid, value="0.5", startup=startup)
    assert on.verdict == "applies", on.summary


def test_argument_code_that_only_marks_a_setting_nothing_running_reads_is_off(index) -> None:  # type: ignore[no-untyped-def]
    """SGLang's own resolution ran the hook: it set `_pool_ratio_explicit` besides the ratio, and
    only a hybrid pool reads that mark, which this deployment never builds (0.5.23's
    `_swa_full_tokens_ratio_explicitly_set`)."""
    from tools.research.startup.check import StartupAnswer

    changed = {"pool_ratio": (0.8, 0.5), "_pool_ratio_explicit": (False, True)}
    startup = StartupAnswer(kind="changed", changed=changed)
    off = analyze_flag(index, "--pool-ratio", _facts("fa3"), value="0.5", startup=startup)
    assert off.verdict == "no-op", off.summary
    [hook] = [f for f in off.findings if "pool_hook.py" in f.location]
    assert hook.state == "off" and "_pool_ratio_explicit" in hook.why, hook.why
    hybrid = {**_facts("fa3"), "server.hybrid_pools": True}
    on = analyze_flag(index, "--pool-ratio", hybrid, value="0.5", startup=startup)
    assert on.verdict == "applies", on.summary


def test_a_base_class_runs_through_its_subclasses(index) -> None:  # type: ignore[no-untyped-def]
    """Nobody calls `BaseBackend(...)`, but `Fa3Backend(...)` runs its `__init__`."""
    v = analyze_flag(index, "--page-hint", _facts("fa3"), value="4")
    assert v.verdict == "applies", v.summary


def test_a_name_set_in_try_and_except_is_the_value_where_the_import_worked(index) -> None:  # type: ignore[no-untyped-def]
    """`_zmq_ok` is True where zmq imports (a serving host); the early return does not fire."""
    v = analyze_flag(index, "--trace-modules", _facts("fa3"), value="scheduler")
    assert v.verdict == "applies", v.summary
    assert "_zmq_ok" not in index.modules["sglang/srt/observability/trace.py"].consts or (
        index.modules["sglang/srt/observability/trace.py"].consts["_zmq_ok"] == "True"
    )


def test_a_value_that_travels_through_a_local_into_a_global_is_a_store(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--gemm-backend", _facts("fa3"), value="triton")
    [reader] = [f for f in v.findings if f.location.endswith("gemm.py:8")]
    assert "stores the value" in reader.why and "GEMM_BACKEND" in reader.why, reader.why
    assert v.certainty <= 0.6, (v.verdict, v.certainty, v.summary)  # its use is not settled here


def test_a_branch_that_only_logs_is_no_effect(index) -> None:  # type: ignore[no-untyped-def]
    v = analyze_flag(index, "--quiet-mode", _facts("fa3"))
    assert v.verdict == "dead", v.summary
    assert "only logged" in v.summary


def test_a_mode_held_as_an_enum_member_decides_what_is_built(index) -> None:  # type: ignore[no-untyped-def]
    """`self.mode = DisaggMode(cfg.disagg_mode)` then `if self.mode == DisaggMode.DECODE:` builds
    the queue that reads the flag: off unless the server runs in decode mode."""
    facts = _facts("fa3")
    off = analyze_flag(index, "--prealloc-reserve", {**facts, "server.disagg_mode": "null"}, value="64")
    assert off.verdict == "no-op", off.summary
    assert "DisaggMode.DECODE" in off.summary, off.summary
    on = analyze_flag(index, "--prealloc-reserve", {**facts, "server.disagg_mode": "decode"}, value="64")
    assert on.verdict == "applies", on.summary


def test_a_refusal_in_a_class_not_built_here_cannot_fire(index) -> None:  # type: ignore[no-untyped-def]
    """`loader.load_model(...)` names both loaders' methods; the remote one, which refuses the
    flag, is built only for `--load-format remote`."""
    facts = _facts("fa3")
    disk = analyze_flag(index, "--verify-weights", {**facts, "server.load_format": "auto"})
    assert disk.verdict == "applies", disk.summary
    remote = analyze_flag(index, "--verify-weights", {**facts, "server.load_format": "remote"})
    assert remote.verdict == "refuses-to-start", remote.summary
    assert "remote loading cannot verify weights" in remote.summary


def test_a_value_passed_to_a_constructor_that_uses_it_only_for_several_ranks(index) -> None:  # type: ignore[no-untyped-def]
    """The switch goes into a module global, back out into a local, into `Group(...)`, whose
    `__init__` uses it only under `world_size > 1` (and stores it in an attribute nothing reads):
    a no-op on one rank, open on four."""
    one = analyze_flag(index, "--disable-custom-ar", _facts("fa3"))
    assert one.verdict == "no-op", one.summary
    assert "use_custom_ar and self.world_size > 1" in one.summary or any(
        "self.world_size > 1" in f.why for f in one.findings
    ), (one.summary, [f.why for f in one.findings])
    four = analyze_flag(index, "--disable-custom-ar", {**_facts("fa3"), "server.tp_size": 4, "gpu.count": 4})
    assert four.verdict == "applies", four.summary


def test_a_value_that_also_steers_its_own_function_is_not_passed_on_only(index) -> None:  # type: ignore[no-untyped-def]
    """The same hand-off, but the function also warms up under the value: work on one rank too."""
    v = analyze_flag(index, "--disable-warm-ar", _facts("fa3"))
    assert v.verdict != "no-op", v.summary


def test_dsa_indexer_flags_are_no_ops_on_llama(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """0.5.23: `--dsa-paged-mqa-logits-backend` is read in `Indexer.__init__`
    (layers/attention/dsa/dsa_indexer.py:419-421), built only by DeepSeek and dots3 attention:
    on Llama-3.1-8B it is a no-op, not the 'applies' a loaded module suggests."""
    v = analyze_flag(
        load_index(sglang_0523),
        "--dsa-paged-mqa-logits-backend",
        profile_facts("llama8b-h100"),
        value="tilelang",
    )
    assert v.verdict == "no-op", v.summary
    assert "dsa_indexer.py:421" in v.summary and "deepseek_v2.py" in v.summary, v.summary
    assert "not loaded here" in v.summary, v.summary


def test_a_mode_converted_from_an_argument_group_s_accessor_is_a_config_attribute() -> None:
    """0.5.23 reads its arguments through group accessors: `self.spec_algorithm =
    SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)` converts one server
    argument as `from_string(server_args.x)` did before; a call on anything else does not."""
    from types import SimpleNamespace

    from tools.research.index_tables import config_attrs

    def module(*attrs: tuple[str, str, str]) -> SimpleNamespace:
        return SimpleNamespace(attrs=list(attrs))

    accessor = "SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)"
    got = config_attrs([
        module(("Scheduler", "spec_algorithm", accessor), ("Scheduler", "mode", "Mode.parse(self.load())")),
        module(("ModelRunner", "spec_algorithm", accessor), ("Chunker", "spec_algorithm", "spec_algorithm")),
        module(("Runner", "old", "Mode.from_string(server_args.old_mode)")),
    ])  # fmt: skip
    assert got["spec_algorithm"] == (accessor, frozenset({"Chunker"}))
    assert got["old"] == ("Mode.from_string(server_args.old_mode)", frozenset())
    assert "mode" not in got


def test_draft_backends_need_speculation_on_the_real_0523_tree(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """0.5.23's scheduler builds a draft worker after `if self.spec_algorithm.is_none(): return`
    (managers/scheduler.py:1036), its mode set from `get_spec()` (:509). On Llama-3.1-8B/H100 with
    fa3 and no speculation, TritonAttnBackend (which reads --triton-attention-split-tile-size at
    triton_backend.py:367) is built neither by the registry nor by a draft worker."""
    from tests.research_profiles import case_startup
    from tools.research.callers import env_of
    from tools.research.facts import default_facts, deployment_facts
    from tools.research.guard_eval import evaluate

    index = load_index(sglang_0523)
    case = {"version": "0.5.23", "profile": "llama8b-h100", "flag": "--triton-attention-split-tile-size"}
    startup = case_startup(sglang_0523, {**case, "value": "256"})  # SGLang's own resolution: fa3
    where = index.func("sglang/srt/managers/scheduler.py", "Scheduler.maybe_init_draft_worker")
    for algorithm in (None, "EAGLE"):  # EAGLE: `cls[name.upper()]` after a `try:` is not followed (open)
        given = {**profile_facts("llama8b-h100"), "server.speculative_algorithm": algorithm}
        facts = deployment_facts(index, given, startup, default_facts(index.catalog))
        env = env_of(index, where, facts, {}, {})
        assert (evaluate("self.spec_algorithm.is_none()", env).truth is True) is (algorithm is None)
    facts = profile_facts("llama8b-h100")
    v = analyze_flag(index, case["flag"], facts, value="256", startup=startup)
    assert v.verdict == "no-op", v.summary
    assert "attention_backend is 'triton'" in v.summary, v.summary


def test_parallel_researchers_do_not_share_answers(index) -> None:  # type: ignore[no-untyped-def]
    """Researcher subagents run `analyze_flag` in parallel threads: what one learns about callers
    on its facts must not answer another's question on other facts."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    cases = [("fa3", "no-op"), ("triton", "applies")] * 40
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave the threads as much as the interpreter allows
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            got = list(
                pool.map(
                    lambda c: analyze_flag(index, "--decode-steps", _facts(c[0]), value="2").verdict, cases
                )
            )
    finally:
        sys.setswitchinterval(old)
    assert got == [want for _, want in cases]
