"""The OpenAI-compatible path: a scripted chat-completions server on loopback drives a session.

Real openai client (through pydantic-ai's `OpenAIChatModel`), real HTTP, real tool-call messages;
only the model's answers are scripted. The first request gets a 429 (retried by the client), and
one tool call has malformed arguments (retried by pydantic-ai); the session still completes.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rich.console import Console

from agent.session import RunOptions, run_session
from agent.transcripts.load import load_transcript
from agent.transcripts.transcript import Transcript
from agent.ui import RunUI
from sim import host
from sim.scenario import SCENARIO_DIR
from tests.fixtures.sim import free_port
from tools.bench.objective import read_goal

FLAG = "--enable-fused-moe-sum-all-reduce"


def _tool_call(name: str, args: dict | str, n: int) -> dict:
    raw = args if isinstance(args, str) else json.dumps(args)
    return {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": raw}}


def _answer(body: dict) -> dict:
    """The scripted model: decides from the tools offered and the tool results so far."""
    tools = {t["function"]["name"] for t in body.get("tools", [])}
    results = [m for m in body["messages"] if m["role"] == "tool"]
    n = len(results)
    if "usage" in tools:  # the researcher
        if n == 0:
            calls = [_tool_call("usage", {"flag": FLAG}, 1)]
        else:
            found = json.loads(results[-1]["content"])
            reader = found["readers"][0]
            verdict = {
                "flag": FLAG,
                "verdict": "applies",
                "summary": "read by the Triton fused MoE kernel; topk 8 > 2",
                "evidence": [{"location": reader["location"], "quote": reader["text"]}],
                "conditions": [
                    {"condition": "topk > 2", "fact": "num_experts_per_tok = 8", "outcome": "pass"}
                ],
            }
            calls = [_tool_call("final_result", verdict, 2)]
        return {"role": "assistant", "content": None, "tool_calls": calls}
    script = [
        [_tool_call("list_candidates", {}, 10)],
        [
            _tool_call(
                "todo_write",
                {"items": [{"id": "fm", "content": f"research {FLAG}", "status": "in_progress"}]},
                11,
            ),
            _tool_call("research_flag", {"flag": FLAG}, 12),
        ],
        [_tool_call("run_trial", '{"changes": "not a list"', 13)],  # malformed: retried
        [_tool_call("run_trial", {"changes": [{"flag": FLAG}], "reason": "research says it applies"}, 14)],
    ]
    if n < 1:
        step = 0
    elif n < 3:
        step = 1
    elif not any("run_trial" in json.dumps(m.get("tool_calls", "")) for m in body["messages"]):
        step = 2
    elif n < 5:
        step = 3
    else:
        return {"role": "assistant", "content": f"Conclusion: {FLAG} would be trialled (dry run)."}
    return {"role": "assistant", "content": None, "tool_calls": script[step]}


class _Handler(BaseHTTPRequestHandler):
    requests: list[dict] = []
    throttled = threading.Event()

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path.endswith("/chat/completions"), self.path
        assert self.headers["Authorization"] == "Bearer sk-test-secret"
        if not _Handler.throttled.is_set():
            _Handler.throttled.set()
            self._send(
                429, {"error": {"message": "slow down", "type": "rate_limit"}}, {"retry-after-ms": "10"}
            )
            return
        _Handler.requests.append(body)
        message = _answer(body)
        reason = "tool_calls" if message.get("tool_calls") else "stop"
        self._send(
            200,
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": reason}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
            },
        )

    def _send(self, code: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)


def test_scripted_openai_endpoint_drives_a_dry_run(tmp_path: Path, sglang_0523, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    scenario = tmp_path / "fast.toml"
    scenario.write_text(
        re.sub(r"startup_s = [\d.]+", "startup_s = 2", (SCENARIO_DIR / "seed.toml").read_text())
    )
    config = host.ensure_up(tmp_path / "sim", scenario=scenario, port=free_port(), time_scale=0.25)
    config = config.model_copy(
        update={
            "research": config.research.model_copy(update={"source_dir": sglang_0523.root}),
            "bench": config.bench.model_copy(
                update={"concurrency": [1, 4], "input_len": 128, "output_len": 16, "warmup": 0, "reps": 2}
            ),
        }
    )
    unit_before = Path(config.target.remote_unit).read_text()
    transcript = Transcript.create(
        tmp_path / "tx", kind="run", goal="improve throughput", model="m", target="sim"
    )
    ui = RunUI(Console(width=120), transcript)
    opts = RunOptions(
        goal=read_goal("improve throughput"), model="scripted-model", base_url=base_url, dry_run=True
    )
    try:
        result = asyncio.run(run_session(config, opts, ui))
    finally:
        transcript.close({"status": "test"})
        host.down(tmp_path / "sim")
        server.shutdown()

    assert result.status == "completed", result.status
    assert _Handler.throttled.is_set()  # the 429 was answered and retried by the client
    assert "would be trialled" in result.conclusion
    assert Path(config.target.remote_unit).read_text() == unit_before  # dry run: nothing deployed
    # real tool-call messages went over the wire, tool results came back as role=tool messages
    planner = [r for r in _Handler.requests if "todo_write" in {t["function"]["name"] for t in r["tools"]}]
    assert planner[-1]["model"] == "scripted-model"
    returned = [m for m in planner[-1]["messages"] if m["role"] == "tool"]
    assert any("dry_run" in m["content"] for m in returned)
    assert any("json_invalid" in m["content"] for m in returned)  # the malformed call was sent back
    tx = load_transcript(transcript.path)
    verdict = tx.events_of("verdict")[0]["data"]
    assert verdict["verdict"] == "applies" and verdict["evidence"][0]["location"].startswith("sglang/")
    assert any(m["agent"].startswith("researcher:") and m["parent"] for m in tx.messages)
    assert "sk-test-secret" not in Path(transcript.path).read_text()


def test_base_url_sends_the_bare_model_name() -> None:
    """`--model openai:NAME --base-url URL` used to send "openai:NAME", which real endpoints reject,
    and label the run `openai:openai:NAME`."""
    from agent.policy.models import choose_model, make_models

    assert choose_model("openai:qwen3", "http://127.0.0.1:30000/v1") == ("qwen3", "http://127.0.0.1:30000/v1")
    choice = make_models("openai:qwen3", "http://127.0.0.1:30000/v1")
    assert choice.planner.model_name == "qwen3" and choice.label == "qwen3 @ http://127.0.0.1:30000/v1"
    assert choose_model("openai:gpt-4.1", None) == ("openai:gpt-4.1", None)  # a provider name stays
