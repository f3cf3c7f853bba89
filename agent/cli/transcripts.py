"""`optagent transcripts`: list, show, review and export saved sessions."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from agent.cli.common import ConfigOption, console, err_console, fail, get_config
from agent.transcripts.load import (
    LoadedTranscript,
    TranscriptNotFound,
    find_transcript,
    list_transcripts,
    load_transcript,
)
from tools.printable import json_text, printable

app = typer.Typer(help=__doc__, no_args_is_help=True)

DirOption = typer.Option(None, "--dir", "-d", help="Transcripts directory (default: agent.transcripts_dir).")
IdArgument = typer.Argument(..., help="Session id, a unique prefix of one, 'last', or a .jsonl path.")


def _directory(directory: Path | None, config: Path | None) -> Path:
    return directory if directory is not None else get_config(config).agent.transcripts_dir


def _open(session: str, directory: Path | None, config: Path | None) -> LoadedTranscript:
    """Find and load a transcript, or exit 2 with the reason; damage is reported and not fatal."""
    try:
        path = find_transcript(session, _directory(directory, config))
        loaded = load_transcript(path)
    except (TranscriptNotFound, OSError) as e:
        fail(str(e), code=2)
    if loaded.header is None:
        fail(f"{path}: not an optagent transcript ({loaded.error})", code=2)
    if loaded.error:
        err_console.print(
            f"[yellow]warning:[/] {loaded.error}; showing everything before it", highlight=False
        )
    return loaded


def summary_row(loaded: LoadedTranscript) -> dict[str, Any]:
    """The `transcripts list` fields of one session."""
    from agent.transcripts.review import build_review, gain_summary

    review = build_review(loaded)
    h = loaded.header or {}
    return {
        "id": loaded.id,
        "started_at": h.get("started_at", ""),
        "kind": h.get("kind", "?"),
        "goal": h.get("goal", ""),
        "model": h.get("model", ""),
        "target": h.get("target", ""),
        "status": review.status,
        "kept": review.kept,
        # kept trials of several flags: one measured effect for all, no member's own
        "together": [
            {
                "trial": g.number,
                "changes": [m.change for m in g.members],
                "effect": g.effect,
                "members": [
                    {"change": m.change, "research": m.research, "own_effect": m.own} for m in g.members
                ],
            }
            for g in review.together
            if g.decision == "kept"
        ],  # fmt: skip
        "throughput_change": gain_summary(review),
        "user_workload": review.before_after.as_dict() if review.before_after is not None else None,
        "messages": len(loaded.messages),
        "path": str(loaded.path),
    }


@app.command("list")
def list_(
    limit: int = typer.Option(20, "-n", "--limit", help="Show the N most recent sessions (0: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    directory: Path | None = DirOption,
    config: Path | None = ConfigOption,
) -> None:
    """List saved sessions, most recent first."""
    paths = list(reversed(list_transcripts(_directory(directory, config))))
    rows = []
    for path in paths[:limit] if limit > 0 else paths:
        try:
            loaded = load_transcript(path)
        except OSError as e:
            err_console.print(f"[yellow]warning:[/] {path}: {e}")
            continue
        if loaded.header is not None:
            rows.append(summary_row(loaded))
    if as_json:
        print(json_text(rows, indent=2))
        return
    if not rows:
        console.print("no transcripts")
        return
    console.print(list_table(rows, console.width))


def kept_words(row: dict[str, Any]) -> list[str]:
    """A listing row's kept changes; flags kept together on one effect as one entry
    (`--a 64 + --b (together, one effect)`), not each as if it had won alone."""
    kept, out = list(row["kept"]), []
    for g in row.get("together") or []:
        if g["changes"] and all(c in kept for c in g["changes"]):
            kept = [k for k in kept if k not in g["changes"]]
            out.append(" + ".join(g["changes"]) + f" (together in trial {g['trial']}, one effect)")
    return out + kept


def list_table(rows: list[dict[str, Any]], width: int) -> Any:
    """The `transcripts list` table: every field of every row at any width. Below 140 columns a
    session is two cells: its id, start, kind and messages; then its goal, model and target over
    its outcome, wrapped at spaces in what is left of the width (at 80 columns an outcome column of
    its own was ~20 wide and cut flag names: `--enable-mixed-chun` / `k`)."""
    from rich import box
    from rich.table import Table

    narrow = width < 140
    table = Table(header_style="bold", box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD)
    if narrow:
        table.add_column("session (msgs)", no_wrap=True)
        table.add_column("goal · model · target, outcome", ratio=1, overflow="fold")
    else:
        for name in ("id", "started", "kind"):
            table.add_column(name, no_wrap=True)
        for name in ("goal", "model", "target"):
            table.add_column(name, min_width=10, overflow="fold")
        table.add_column("outcome", ratio=3, overflow="fold")
        table.add_column("msgs", justify="right", no_wrap=True)
    for r in rows:
        outcome = r["status"]
        if r["kept"]:
            outcome += "; kept " + ", ".join(kept_words(r))
        if r["throughput_change"]:
            outcome += f": {r['throughput_change']}"
        started = r["started_at"][5:16].replace("T", " ")  # MM-DD HH:MM: the id holds the year
        if narrow:
            where = f"[dim]{escape(r['goal'])} · {escape(r['model'])} · {escape(r['target'])}[/]"
            session = f"{r['id']}\n{started} {r['kind']}\n{r['messages']} msgs"
            table.add_row(session, f"{where}\n{escape(outcome)}")
        else:
            said = [escape(str(r[k])) for k in ("kind", "goal", "model", "target")]  # never markup
            table.add_row(r["id"], started, *said, escape(outcome), str(r["messages"]))
    return table


@app.command("show")
def show(
    session: str = IdArgument,
    msg: int | None = typer.Option(None, "--msg", help="Show this message (and --context around it)."),
    context: int = typer.Option(2, "--context", "-C", min=0, help="Messages either side of --msg."),
    width: int = typer.Option(
        400, "--fold", help="Fold texts and tool results to about this many characters."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the records as JSON."),
    directory: Path | None = DirOption,
    config: Path | None = ConfigOption,
) -> None:
    """Show a session's conversation: numbered messages, tool calls, subagents, todo lists, trials."""
    from agent.transcripts.view import readable, render_conversation

    loaded = _open(session, directory, config)
    if msg is not None and not any(m["msg"] == msg for m in loaded.messages):
        last = max((m["msg"] for m in loaded.messages), default=0)
        fail(f"no message {msg} in {loaded.id} (messages 1..{last})", code=2)
    if as_json:
        lo, hi = (msg - context, msg + context) if msg is not None else (None, None)
        msgs = [m for m in loaded.messages if lo is None or lo <= m["msg"] <= hi]
        evs = [e for e in loaded.events if lo is None or (e.get("msg") is not None and lo <= e["msg"] <= hi)]
        out = {
            "header": loaded.header,
            "messages": msgs,
            "events": evs,
            "end": loaded.end,
            "error": loaded.error,
        }
        print(json_text(out, indent=2))
        return
    h = loaded.header or {}
    console.print(
        f"[bold]{escape(loaded.id)}[/]  {escape(' · '.join(str(h.get(k)) for k in ('kind', 'model', 'target')))}\n"
        f"[dim]goal:[/] {escape(str(h.get('goal')))}",
        highlight=False,
    )
    for block in render_conversation(loaded, focus=msg, context=context, limit=width):
        console.print(block, highlight=False)
    if msg is None and loaded.end:
        console.print(f"[bold]end[/] {escape(readable(loaded.end.get('outcome') or {}))}", highlight=False)


@app.command("review")
def review(
    session: str = IdArgument,
    narrate: bool = typer.Option(False, "--narrate", help="Add an LLM's written analysis of the decisions."),
    model: str | None = typer.Option(
        None, "--model", help="Model for --narrate (default: the configured one)."
    ),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint for --narrate."),
    as_markdown: bool = typer.Option(False, "--markdown", help="Print raw Markdown."),
    json_out: bool = typer.Option(False, "--json", help="Print the structured review as JSON."),
    directory: Path | None = DirOption,
    config: Path | None = ConfigOption,
) -> None:
    """A structured account of a session: context, todo list, verdicts, trials, rollbacks, gain."""
    import dataclasses

    from agent.transcripts.markdown import review_markdown
    from agent.transcripts.review import build_review

    loaded = _open(session, directory, config)
    built = build_review(loaded)
    text = review_markdown(built)
    analysis = None
    if narrate:
        from agent.transcripts.narrate import NoModelError, narrate_review

        cfg = get_config(config)
        try:
            analysis = narrate_review(
                text, model=model or cfg.agent.model, base_url=base_url or cfg.agent.base_url
            )
        except NoModelError as e:
            analysis = f"not written: {e}\n"
            err_console.print(f"[yellow]--narrate:[/] {e}", highlight=False)
        text += "\n## Analysis\n\n" + analysis
    if json_out:
        data = {"id": loaded.id, **dataclasses.asdict(built)}
        if narrate:
            data["analysis"] = analysis
        print(json_text(data, indent=2, default=str))
        return
    if as_markdown:
        print(printable(text))  # the goal and the host's lines in it, without their control sequences
        return
    from agent.transcripts.view import terminal_markdown

    console.print(terminal_markdown(text))


@app.command("export")
def export(
    session: str = IdArgument,
    fmt: str = typer.Option("md", "--format", "-f", help="md or html."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write here (default: stdout)."),
    directory: Path | None = DirOption,
    config: Path | None = ConfigOption,
) -> None:
    """Export a session as a self-contained Markdown or HTML document (HTML embeds the plots)."""
    from agent.transcripts.export import export as render

    if fmt not in ("md", "html"):
        fail(f"unknown format {fmt!r}: use md or html", code=2)
    if fmt == "html" and output is None and sys.stdout.isatty():
        fail("HTML with its plots embedded (base64) is not for a terminal: give -o FILE.html", code=2)
    loaded = _open(session, directory, config)
    try:
        text = render(loaded, fmt, output)
    except OSError as e:
        fail(f"cannot write {output}: {e}")
    if output is None:
        print(printable(text) if fmt == "md" else text, end="")
    else:
        err_console.print(f"wrote {output}", highlight=False)
