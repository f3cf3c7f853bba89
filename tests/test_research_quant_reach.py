"""A backend only quantization methods read (issue 53, item 3): followed from the registry of
quantization configs into the linear methods their `get_quant_method` builds, on a small
SGLang-shaped tree and on the real 0.5.23 wheel. What kept it open before: config and method
naming each other (a cycle the caller walk ran around until its depth ran out), a config's own
classmethod building it (`cls(...)` beside `QuarkConfig._parse(...)`), a subclass with no
`__init__` of its own, an exact type test (`type(m) is Fp8LinearMethod`), and a reader six helper
calls below the method that builds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.sglang_src import synthetic_tree
from tests.research_profiles import case_startup, profile_facts
from tools.research.analysis import analyze_flag
from tools.research.index import load_index

FILES = {
    "srt/server_args.py": """
        from dataclasses import dataclass

        @dataclass
        class ServerArgs:
            fp8_runner: str = "auto"
            tp_size: int = 1

            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--fp8-runner", default=ServerArgs.fp8_runner)
                parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size)
        """,
    "srt/config.py": """
        def get_args():
            return _ARGS
        """,
    "srt/layers/quantization/__init__.py": """
        from sglang.srt.layers.quantization.fp8 import Fp8Config
        from sglang.srt.layers.quantization.quark import QuarkConfig
        from sglang.srt.layers.quantization.online import OnlineConfig

        QUANT_METHODS = {"fp8": Fp8Config, "quark": QuarkConfig, "online": OnlineConfig}

        def get_quantization_config(name):
            return QUANT_METHODS[name]
        """,
    "srt/layers/quantization/fp8_utils.py": """
        from sglang.srt.config import get_args

        def runner_name():
            return get_args().fp8_runner

        def pick_runner(block):
            if block is None:
                return None
            return runner_name()

        def dispatch_block(block):
            return pick_runner(block)

        def dispatch_auto(block):
            return dispatch_block(block)

        def dispatch_linear(block):
            return dispatch_auto(block)

        def dispatch(block):
            return dispatch_linear(block)
        """,
    "srt/layers/quantization/fp8.py": """
        from sglang.srt.layers.quantization.fp8_utils import dispatch

        class Fp8LinearMethod:
            def __init__(self, config):
                self.config = config
                self.gemm = dispatch(config.block)
                self.ue8m0 = Fp8Config.wants_ue8m0(config)

        class Fp8Config:
            def __init__(self, block):
                self.block = block

            @classmethod
            def from_config(cls, cfg):
                return cls(cfg.get("block"))

            @classmethod
            def wants_ue8m0(cls, cfg):
                return cls is Fp8Config and cfg.block is not None

            def get_quant_method(self, layer):
                return Fp8LinearMethod(self)
        """,
    "srt/layers/quantization/quark.py": """
        from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod

        class QuarkConfig:
            def __init__(self, opts):
                self.opts = opts
                self.fp8 = Fp8Config.from_config(opts)

            @classmethod
            def from_config(cls, cfg):
                return cls(QuarkConfig._parse(cfg))

            @staticmethod
            def _parse(cfg):
                return dict(cfg)

            def layer_config(self, prefix):
                return QuarkLayerConfig(self.opts, prefix)

            def get_quant_method(self, layer):
                return Fp8LinearMethod(self.fp8)

        class QuarkLayerConfig(QuarkConfig):
            def __init__(self, opts, prefix):
                self.opts = opts
                self.prefix = prefix
        """,
    "srt/layers/quantization/online.py": """
        from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod

        class OnlineConfig:
            def __init__(self, serialized):
                self.serialized = serialized

            @classmethod
            def from_config(cls, cfg):
                return cls(cfg.get("serialized"))

            def get_quant_method(self, layer):
                return Fp8LinearMethod(Fp8Config(None))

        class _ModelOptOnlineConfig(OnlineConfig):
            @classmethod
            def get_name(cls):
                return "modelopt_online"

        def make_modelopt_online_config(model_config):
            return _ModelOptOnlineConfig(True)
        """,
    "srt/layers/activation.py": """
        class SiluAndMulQuant:
            def __init__(self, linear):
                method = linear.quant_method
                from sglang.srt.layers.quantization.fp8 import Fp8LinearMethod

                self.fused = type(method) is Fp8LinearMethod
        """,
    "srt/model_loader/loader.py": """
        from sglang.srt.layers.quantization import get_quantization_config
        from sglang.srt.layers.quantization.online import make_modelopt_online_config

        def get_quant_config(model_config):
            quant_cls = get_quantization_config(model_config.quantization)
            return quant_cls.from_config({})

        def load_quant(model_config):
            if model_config.quantization == "modelopt_online":
                return make_modelopt_online_config(model_config)
            if model_config.quantization is not None:
                return get_quant_config(model_config)
            return None
        """,
    "srt/models/llama.py": """
        from sglang.srt.layers.activation import SiluAndMulQuant

        class LlamaMLP:
            def __init__(self, linear):
                self.act = SiluAndMulQuant(linear)

        class LlamaForCausalLM:
            def __init__(self, linear):
                self.mlp = LlamaMLP(linear)
        """,
}


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    return load_index(synthetic_tree(tmp_path, monkeypatch, FILES, "9.9.53"))


def _facts(quantization: str | None) -> dict[str, object]:
    return {
        "gpu.sm": 90,
        "gpu.count": 1,
        "server.tp_size": 1,
        "model.architecture": "LlamaForCausalLM",
        "model_config.quantization": quantization,
    }


def test_a_backend_only_fp8_linear_methods_read_acts_only_on_a_model_quantized_for_them(index) -> None:  # type: ignore[no-untyped-def]
    """Every config that builds `Fp8LinearMethod` comes out of the registry (or a factory) only
    for a quantized model; the cycles between them, their own classmethods, the subclass without
    an `__init__` and the exact type test in the activation build nothing on their own. Each of
    the three configs that builds the method, once selected, makes the backend apply."""
    v = analyze_flag(index, "--fp8-runner", _facts(None), value="triton")
    assert v.verdict == "no-op", v.summary
    assert "model_config.quantization" in v.summary, v.summary
    for quantization in ("fp8", "quark", "modelopt_online"):
        on = analyze_flag(index, "--fp8-runner", _facts(quantization), value="triton")
        assert on.verdict == "applies", (quantization, on.summary)


def test_fp8_gemm_backend_is_a_no_op_on_unquantized_llama_in_0523(sglang_0523) -> None:  # type: ignore[no-untyped-def]
    """0.5.23: the backend is stored by `initialize_fp8_gemm_config` (fp8_utils.py:1211) and read
    back through `get_fp8_gemm_runner_backend` by the block-FP8/MXFP8 dispatchers that
    `Fp8LinearMethod.__init__` (fp8.py:540-559) and the compressed-tensors FP8 scheme call; those
    are built only by quantization configs, which `_get_quantization_config` builds only for a
    quantized model (model_loader/loader.py:215). On a bf16 Llama-3.1-8B: a no-op; on an FP8
    checkpoint it applies."""
    index = load_index(sglang_0523)
    case = {"version": "0.5.23", "profile": "llama8b-h100", "flag": "--fp8-gemm-backend", "value": "triton"}
    startup = case_startup(sglang_0523, case)  # SGLang's own ModelConfig: quantization None
    facts = profile_facts("llama8b-h100")
    v = analyze_flag(index, "--fp8-gemm-backend", facts, value="triton", startup=startup)
    assert v.verdict == "no-op", v.summary
    assert "loader.py:215" in v.summary, v.summary
    fp8 = {**facts, "server.quantization": "fp8", "model_config.quantization": "fp8"}
    on = analyze_flag(index, "--fp8-gemm-backend", fp8, value="triton", startup=startup)
    assert on.verdict == "applies", on.summary
