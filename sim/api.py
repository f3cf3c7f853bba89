"""SGLang's HTTP API: health, model/server info, OpenAI completions and chat, native /generate."""

from __future__ import annotations

import argparse
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sim.args import SGLANG_VERSION
from sim.engine import Engine
from sim.httpio import HttpError, HttpRequest, Response, json_response
from sim.modelinfo import ModelInfo
from sim.plan import Plan
from sim.scheduler import Request
from sim.serverinfo import server_info
from sim.text import TextStream, count_prompt_tokens, greedy_length, prompt_key


@dataclass
class Generation:
    """A request in flight: its scheduler entry, token queue and text source."""

    req: Request
    queue: Any
    text: TextStream
    prompt_tokens: int

    @property
    def finish_reason(self) -> str:
        return "length" if self.req.generated >= self.req.max_new else "stop"


_TEXT = "text/plain; charset=utf-8"


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class Api:
    """Routes HTTP requests to the engine; `healthy` flips once warmup has finished."""

    def __init__(self, args: argparse.Namespace, model: ModelInfo, plan: Plan, engine: Engine) -> None:
        self.args, self.model, self.plan, self.engine = args, model, plan, engine
        self.healthy = False
        self.startup_time = 0.0
        self.served_name = args.served_model_name or args.model_path
        self.context_length = args.context_length or model.max_context

    async def handle(self, req: HttpRequest) -> Response:
        """Dispatch one request."""
        route = (req.method, req.path)
        if not self._authorized(req):
            return json_response({"error": "Unauthorized"}, 401)
        if route in {("GET", "/health"), ("GET", "/health_generate")}:
            if not self.healthy:
                raise HttpError(503, "Server is not ready (warmup has not finished).")
            if req.path == "/health_generate":
                gen = self._start(prompt=[1, 2, 3], max_new=1, greedy=True, ignore_eos=True)
                async for _ in self._pieces(gen):
                    pass
            return Response(200, b"")
        if route == ("GET", "/v1/models"):
            return json_response({"object": "list", "data": [self._model_card()]})
        if route == ("GET", "/get_model_info"):
            return json_response(self._model_info())
        if route in {("GET", "/get_server_info"), ("GET", "/server_info")}:
            return json_response(self._server_info())
        if req.path == "/flush_cache" and req.method in ("GET", "POST"):
            return self._flush_cache()
        if req.method == "POST" and req.path in {"/v1/completions", "/v1/chat/completions", "/generate"}:
            body = req.json()
            if not isinstance(body, dict):
                raise HttpError(400, "request body must be a JSON object")
            if req.path == "/generate":
                return self._generate(body)
            return self._openai(body, chat=req.path.endswith("chat/completions"))
        raise HttpError(404, f"Not Found: {req.method} {req.path}")

    def _authorized(self, req: HttpRequest) -> bool:
        """SGLang 0.5.23's `--api-key` (srt/utils/auth.py `decide_request_auth`): OPTIONS and paths
        starting with /health, /ready or /metrics are open; every other route needs `Bearer KEY`."""
        key = getattr(self.args, "api_key", None)
        if not key or req.method == "OPTIONS" or req.path.startswith(("/health", "/ready", "/metrics")):
            return True
        scheme, _, token = (req.authorization or "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(token, key)

    def _flush_cache(self) -> Response:
        """SGLang's `/flush_cache`: empties the radix cache unless requests are running or waiting."""
        sched = self.engine.scheduler
        if sched.has_work:
            return Response(400, b"Flush cache failed: there are running or waiting requests.\n", _TEXT)
        if sched.cache is not None:
            sched.cache.clear()
        sched.spec_tokens = sched.spec_forwards = 0  # SGLang's flush_cache resets its metrics too
        return Response(200, b"Cache flushed.\n", _TEXT)

    # -- info ----------------------------------------------------------------------------------
    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.served_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.served_name,
            "parent": None,
            "max_model_len": self.context_length,
        }

    def _model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.tokenizer_path or self.args.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.model.architecture,
            "architectures": [self.model.architecture],
        }

    def _server_info(self) -> dict[str, Any]:
        sched = self.engine.scheduler
        accept = sched.accept_length if self.plan.spec_steps else None
        live = {
            "max_total_num_tokens": sched.capacity,
            "max_req_input_len": self.context_length - 1,
            "effective_max_running_requests_per_dp": sched.max_running,
            "max_running_requests": sched.max_running,
            "world_size": self.plan.tp,
            "memory_usage": {
                "weight": round(self.plan.weight_bytes_per_gpu / 2**30, 2),
                "kvcache": round(self.plan.kv_budget_bytes / 2**30, 2),
                "token_capacity": sched.capacity,
            },
            "last_gen_throughput": self.engine.last_gen_throughput,
            "startup_time": {  # seconds per phase, as SGLang's scheduler reports them
                "load_weight": round(self.startup_time * 0.7, 3),
                "kv_cache_allocation": 0.0,
                "scheduler_e2e": round(self.startup_time, 3),
                "cuda_graph": {"prefill": 0.0, "decode": 0.0},
            },
        }
        if accept is not None:  # as SGLang: a speculative server, once it verified a draft
            live["avg_spec_accept_length"] = accept
        return server_info(self.args, self.plan.resolved, version=SGLANG_VERSION, live=live)

    # -- generation ----------------------------------------------------------------------------
    def _start(self, *, prompt: Any, max_new: int, greedy: bool, ignore_eos: bool) -> Generation:
        if isinstance(prompt, list) and not all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            raise HttpError(400, "prompt token ids must be a list of integers")
        if not isinstance(prompt, (str, list)) or not prompt:
            raise HttpError(400, "prompt must be a non-empty string or a list of token ids")
        if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1:
            raise HttpError(400, "max_tokens must be a positive integer")
        n_prompt = count_prompt_tokens(prompt)
        if n_prompt + max_new > self.context_length:
            raise HttpError(
                400,
                f"Requested token count exceeds the model's maximum context length of {self.context_length} "
                f"tokens. You requested a total of {n_prompt + max_new} tokens: {n_prompt} tokens from the "
                f"input messages and {max_new} tokens for the completion.",
            )
        key = prompt_key(prompt)
        stop_at = max_new if ignore_eos else greedy_length(key if greedy else key ^ time.time_ns(), max_new)
        req = Request.for_prompt(prompt, max_new=max_new, stop_at=stop_at)
        queue = self.engine.submit(req)
        return Generation(req, queue, TextStream(key, greedy=greedy, lossy=self.plan.lossy), n_prompt)

    async def _pieces(self, gen: Generation) -> AsyncIterator[str]:
        """The text each scheduler step adds, until the request finishes."""
        received = 0
        try:
            while received < gen.req.stop_at:
                n = await gen.queue.get()
                # Like SGLang's tokenizer manager, a stream that fell behind sends what accumulated in one chunk:
                # per-step events would make the HTTP side, not the model, set the pace at a small time scale.
                while not gen.queue.empty():
                    n += gen.queue.get_nowait()
                received += n
                yield gen.text.next_text(n)
        finally:
            if received < gen.req.stop_at:
                self.engine.abort(gen.req)

    @staticmethod
    def _sampling(body: dict[str, Any], key: str, default: int) -> tuple[int, bool, bool]:
        max_new = body.get(key, default)
        if max_new is None:
            max_new = default
        temperature = body.get("temperature", 1.0)
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise HttpError(400, "temperature must be a non-negative number")
        return max_new, temperature == 0, bool(body.get("ignore_eos", False))

    def _openai(self, body: dict[str, Any], *, chat: bool) -> Response:
        """Answer `/v1/completions` or (`chat`) `/v1/chat/completions`, whole or streamed as SGLang
        streams it. One piece because the nested `choice`, `chunk` and `events` close over the one
        generation, response id and usage they stream."""
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise HttpError(400, "messages must be a non-empty list")
            prompt: Any = "\n".join(
                f"{m.get('role')}: {m.get('content')}" for m in messages if isinstance(m, dict)
            )
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
        max_key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
        max_new, greedy, ignore_eos = self._sampling(body, max_key, 2048 if chat else 16)
        gen = self._start(prompt=prompt, max_new=max_new, greedy=greedy, ignore_eos=ignore_eos)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        base = {"id": rid, "created": int(time.time()), "model": self.served_name}
        usage = lambda: {  # noqa: E731
            "prompt_tokens": gen.prompt_tokens,
            "total_tokens": gen.prompt_tokens + gen.req.generated,
            "completion_tokens": gen.req.generated,
            "reasoning_tokens": 0,
        }
        report = bool(getattr(self.args, "enable_cache_report", False))
        cached = lambda: {"prompt_tokens_details": {"cached_tokens": gen.req.cached}} if report else {}  # noqa: E731
        if not body.get("stream"):
            return self._openai_whole(gen, base, chat, lambda: {**usage(), **cached()})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        obj = "chat.completion.chunk" if chat else "text_completion"

        def choice(text: str | None, finish: str | None) -> dict[str, Any]:
            # as SGLang 0.5.23: every chat delta carries reasoning_content, the first the role
            if chat:
                delta: dict[str, Any] = {"reasoning_content": None}
                if text is not None:
                    delta |= {"role": "assistant", "content": text} if text == "" else {"content": text}
                return {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": finish,
                    "matched_stop": None,
                }
            return {
                "index": 0,
                "text": text or "",
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }

        def chunk(choices: list[dict[str, Any]]) -> bytes:  # a chat chunk has no usage key until the last
            return _sse({**base, "object": obj, "choices": choices, **({} if chat else {"usage": None})})

        async def events() -> AsyncIterator[bytes]:
            yield chunk([choice("", None)])
            async for piece in self._pieces(gen):
                yield chunk([choice(piece, None)])
            yield chunk([choice(None, gen.finish_reason)])
            if include_usage:
                details = {"prompt_tokens_details": None, "completion_tokens_details": None} if chat else {}
                yield _sse(
                    {**base, "object": obj, "choices": [], "usage": {**usage(), **details, **cached()}}
                )
            yield b"data: [DONE]\n\n"

        return Response(content_type="text/event-stream", stream=events())

    def _openai_whole(self, gen: Generation, base: dict[str, Any], chat: bool, usage: Any) -> Response:
        async def body() -> AsyncIterator[bytes]:
            text = "".join([p async for p in self._pieces(gen)])
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text}}
            else:
                choice = {"index": 0, "text": text, "logprobs": None}
            choice["finish_reason"] = gen.finish_reason
            obj = "chat.completion" if chat else "text_completion"
            yield json.dumps({**base, "object": obj, "choices": [choice], "usage": usage()}).encode()

        return Response(stream=body())

    def _generate(self, body: dict[str, Any]) -> Response:
        prompt = body.get("input_ids") if body.get("input_ids") is not None else body.get("text")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise HttpError(400, "sampling_params must be an object")
        max_new, greedy, ignore_eos = self._sampling(params, "max_new_tokens", 128)
        gen = self._start(prompt=prompt, max_new=max_new, greedy=greedy, ignore_eos=ignore_eos)
        rid = uuid.uuid4().hex
        t0 = time.monotonic()

        def payload(text: str) -> dict[str, Any]:
            finish = None
            if gen.req.done:
                finish = {"type": "length", "length": gen.req.generated}
                if gen.finish_reason == "stop":
                    finish = {"type": "stop", "matched": self.model.eos_token_id}
            meta = {
                "id": rid,
                "finish_reason": finish,
                "prompt_tokens": gen.prompt_tokens,
                "completion_tokens": gen.req.generated,
                "cached_tokens": gen.req.cached,
                "e2e_latency": time.monotonic() - t0,
            }
            return {"text": text, "meta_info": meta}

        if body.get("stream"):

            async def events() -> AsyncIterator[bytes]:
                text = ""
                async for piece in self._pieces(gen):
                    text += piece
                    yield _sse(payload(text))
                yield b"data: [DONE]\n\n"

            return Response(content_type="text/event-stream", stream=events())

        async def whole() -> AsyncIterator[bytes]:
            text = "".join([p async for p in self._pieces(gen)])
            yield json.dumps(payload(text)).encode()

        return Response(stream=whole())
