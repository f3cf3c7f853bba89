"""How fast transcripts are written, read and reviewed (prints numbers; no assertions).

python benchmarks/transcript_bench.py [--messages 5000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=5000)
    args = parser.parse_args()
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    from agent.transcripts.load import load_transcript
    from agent.transcripts.review import build_review
    from agent.transcripts.transcript import Transcript

    batch = [
        ModelRequest(parts=[UserPromptPart("research --enable-torch-compile " + "x" * 200)]),
        ModelResponse(
            parts=[TextPart("thinking " * 30), ToolCallPart("research_flag", {"flag": "--x"}, "c1")]
        ),
        ModelRequest(
            parts=[ToolReturnPart("research_flag", {"verdict": "applies", "evidence": ["a:1"] * 10}, "c1")]
        ),
        ModelResponse(parts=[TextPart("done")]),
    ]
    with tempfile.TemporaryDirectory() as d:
        t = Transcript.create(d, kind="run", goal="bench", model="builtin", target="sim")
        start = time.perf_counter()
        for i in range(args.messages // len(batch)):
            t.add_messages(batch, parent=None)
            if i % 10 == 0:
                t.event("trial", {"number": i, "decision": "kept", "levels": {"1": 100.0, "64": 2000.0 + i}})
        t.close({"status": "done"})
        write_s = time.perf_counter() - start
        size = t.path.stat().st_size
        start = time.perf_counter()
        loaded = load_transcript(t.path)
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        build_review(loaded)
        review_s = time.perf_counter() - start
        start = time.perf_counter()
        history = loaded.model_messages()
        adapt_s = time.perf_counter() - start
        n = len(loaded.messages)
        print(
            f"messages written: {n} ({size / 1e6:.1f} MB), {n / write_s:,.0f} msg/s (flush after each record)"
        )
        print(f"load_transcript: {load_s * 1000:.0f} ms; build_review: {review_s * 1000:.0f} ms")
        print(
            f"model_messages (ModelMessagesTypeAdapter): {len(history)} messages in {adapt_s * 1000:.0f} ms"
        )
        code = "import sys; from agent.cli.main import app; app(sys.argv[1:])"
        for cmd in (
            ["--help"],
            ["transcripts", "list", "--dir", d],
            ["transcripts", "review", "last", "--dir", d],
        ):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, check=False)
            print(
                f"optagent {' '.join(cmd[:2])}: {time.perf_counter() - start:.2f} s wall (process start included)"
            )


if __name__ == "__main__":
    main()
