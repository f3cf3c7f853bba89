"""The transcript writer and reader: format, numbering, resume, redaction, damage and old versions."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent.transcripts.load import TranscriptNotFound, find_transcript, load_transcript
from agent.transcripts.transcript import Transcript
from tools.redact import REDACTED, redact_text


def _planner() -> Agent:
    """A real pydantic-ai agent with one tool, driven by a scripted function model."""

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[ToolCallPart("todo_write", {"items": ["--enable-torch-compile"]}, "c1")]
            )
        return ModelResponse(parts=[TextPart("done: 1 item")])

    agent = Agent(FunctionModel(reply), name="planner")

    @agent.tool_plain
    def todo_write(items: list[str]) -> str:
        """Replace the todo list."""
        return f"{len(items)} items"

    return agent


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_round_trip_numbering_and_history_reload(tmp_path: Path) -> None:
    agent = _planner()
    result = agent.run_sync("improve throughput")
    t = Transcript.create(tmp_path, kind="run", goal="improve throughput", model="builtin", target="sim")
    nums = t.add_messages(result.new_messages())
    assert nums == [1, 2, 3, 4]
    sub = t.add_messages(result.new_messages()[:2], agent="researcher:--enable-torch-compile", parent=2)
    assert sub == [5, 6]
    t.event("todo", {"items": [{"content": "x", "status": "pending"}]}, msg=2)
    t.close({"kept": [], "gain": {}, "status": "done"})

    recs = _records(t.path)
    assert recs[0]["type"] == "header" and recs[0]["format"] == 1 and recs[0]["id"] == t.id
    assert [r["role"] for r in recs[1:5]] == ["user", "assistant", "tool", "assistant"]
    assert recs[2]["parts"][0]["tool_name"] == "todo_write"
    assert recs[5]["parent"] == 2 and recs[5]["agent"].startswith("researcher:")
    assert recs[-1]["type"] == "end" and recs[-1]["outcome"]["status"] == "done"

    loaded = load_transcript(t.path)
    assert loaded.error is None and loaded.end is not None
    history = loaded.model_messages()
    assert len(history) == 4
    # the reloaded history continues a real conversation
    again = agent.run_sync("and now?", message_history=history)
    assert again.output == "done: 1 item"
    assert len(again.all_messages()) == 6


def test_resume_continues_numbering_and_repairs_a_cut_tail(tmp_path: Path) -> None:
    t = Transcript.create(tmp_path, kind="chat", goal="g", model="builtin", target="sim")
    t.add_messages(_planner().run_sync("hi").new_messages())
    t.close({"status": "interrupted"})
    with t.path.open("a") as f:
        f.write('{"type": "message", "msg": 5, "ag')  # a crash mid-write

    r = Transcript.resume(t.path)
    assert r.id == t.id
    assert r.add_messages(_planner().run_sync("again").new_messages())[0] == 5
    r.close({"status": "done"})
    loaded = load_transcript(t.path)
    assert loaded.error is None
    assert [m["msg"] for m in loaded.messages] == list(range(1, 9))
    assert any(e["kind"] == "note" and e["data"]["resumed"] for e in loaded.events)
    assert Path(str(t.path) + ".bak").read_text().endswith('"ag')  # nothing lost


def test_truncated_and_corrupt_files_keep_what_came_before(tmp_path: Path) -> None:
    t = Transcript.create(tmp_path, kind="run", goal="g", model="m", target="sim")
    t.add_messages(_planner().run_sync("hi").new_messages())
    t.event("trial", {"flag": "--x"})
    text = t.path.read_text()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text[: len(text) - 10])
    loaded = load_transcript(cut)
    assert loaded.error == "cut.jsonl: line 6: truncated line"
    assert loaded.error_line == 6 and len(loaded.messages) == 4 and loaded.events == []

    lines = text.splitlines()
    lines[2] = "{not json"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    loaded = load_transcript(bad)
    assert loaded.error_line == 3 and "invalid JSON" in loaded.error
    assert loaded.header["id"] == t.id and len(loaded.messages) == 1

    not_ours = tmp_path / "other.jsonl"
    not_ours.write_text('{"a": 1}\n')
    assert load_transcript(not_ours).header is None
    with pytest.raises(ValueError, match="not a transcript"):
        Transcript.resume(not_ours)


def test_secrets_are_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "very-secret-value-123")
    monkeypatch.setenv("HF_TOKEN", "tok-abcdef-999")
    t = Transcript.create(
        tmp_path,
        kind="run",
        goal="g",
        model="m",
        target="ssh://deploy:hunter2@10.0.0.5",
        config={"agent": {"api_key": "plain-in-config"}, "usage": {"input_tokens": 12}},
    )
    t.event(
        "note",
        {
            "text": "curl -H 'Authorization: Bearer abc.def.ghi123' key very-secret-value-123",
            "cmd": "launch_server --api-key s3cr3t-k --port 30000 sk-proj-ABCDEFGH12345",
            "log": "HF_TOKEN=tok-abcdef-999 max_new_tokens=256",
        },
    )
    t.close({})
    raw = t.path.read_text()
    for secret in (
        "very-secret-value-123",
        "hunter2",
        "plain-in-config",
        "abc.def.ghi123",
        "s3cr3t-k",
        "ABCDEFGH12345",
        "tok-abcdef-999",
    ):
        assert secret not in raw
    assert raw.count(REDACTED) >= 7
    assert "max_new_tokens=256" in raw and '"input_tokens": 12' in raw and "--port 30000" in raw
    assert redact_text("nothing to hide here") == "nothing to hide here"


def test_secret_flags_server_args_and_url_params_are_redacted_but_counters_are_not() -> None:
    unit = (
        "ExecStart=/usr/bin/python -m sglang.launch_server --admin-api-key adm1n-s3cr3t"
        " --api-key=k3y-value --ssl-keyfile-password 'pw with space' --max-running-requests 64"
    )
    log = (
        "[2025-01-01 00:00:00] server_args=ServerArgs(model_path='Qwen/Qwen3-8B', api_key='sekret123',"
        " admin_api_key='Adm1nKey', ssl_keyfile_password=None, max_total_tokens=8192, chunked_prefill_size=4096)"
    )
    url = "GET http://10.0.0.5:30000/v1/models?api_key=url-s3cret&limit=5 HTTP/1.1"
    counters = "max_tokens=256 input_tokens: 12 prompt_tokens 40 --max-prefill-tokens 8192 output_tokens=7"
    out = redact_text("\n".join((unit, log, url, counters)))
    for secret in ("adm1n-s3cr3t", "k3y-value", "pw with space", "sekret123", "Adm1nKey", "url-s3cret"):
        assert secret not in out
    assert "--max-running-requests 64" in out and "ssl_keyfile_password=None" in out
    assert "max_total_tokens=8192" in out and "&limit=5" in out
    assert counters in out
    assert (
        redact_text("api_key='sekret123' --admin-api-key s3cr3t --ssl-keyfile-password pw").count(REDACTED)
        == 3
    )


def test_a_failed_write_warns_once_and_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = Transcript.create(blocker / "sub", kind="run", goal="g", model="m", target="sim")
        t.add_messages(_planner().run_sync("hi").new_messages())
        t.event("trial", {"x": object()})
        t.close({})
    assert t.failed
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1


def test_format_0_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    rows = [
        {
            "type": "header",
            "id": "old-1",
            "created": "2024-05-01T10:00:00",
            "goal": "g",
            "model": "m",
            "target": "t",
        },
        {"type": "message", "n": 1, "role": "user", "text": "improve throughput"},
        {"type": "message", "n": 2, "role": "assistant", "text": "baseline first"},
        {"type": "event", "event": "trial", "data": {"flag": "--x"}},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_transcript(path)
    assert loaded.error is None
    assert loaded.header["format"] == 1 and loaded.header["started_at"] == "2024-05-01T10:00:00"
    assert [m["msg"] for m in loaded.messages] == [1, 2]
    assert loaded.events[0]["kind"] == "trial"
    history = loaded.model_messages()
    assert history[1].parts[0].content == "baseline first"


def test_find_transcript(tmp_path: Path) -> None:
    a = Transcript.create(tmp_path, kind="run", goal="g", model="m", target="t")
    a.close({})
    assert find_transcript(a.id, tmp_path) == a.path
    assert find_transcript(a.id[:-2], tmp_path) == a.path
    assert find_transcript(str(a.path), tmp_path / "elsewhere") == a.path
    assert find_transcript("last", tmp_path) == a.path
    b = Transcript.create(tmp_path, kind="run", goal="g", model="m", target="t")
    b.close({})
    with pytest.raises(TranscriptNotFound, match="matches 2"):
        find_transcript("2", tmp_path)
    with pytest.raises(TranscriptNotFound, match="no transcript"):
        find_transcript("nope", tmp_path)
