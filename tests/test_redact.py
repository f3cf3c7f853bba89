"""Redaction, exactly (issue 51, item 6): the value of a secret-bearing option or variable and a URL's
password or token are hidden everywhere optagent prints or saves them; an ordinary flag or counter whose name
holds "token" never is. One table of inputs goes through every path: a transcript record, the
`status` flags mapping, the deploy diff, an error message and a URL; then the real commands
(`status`, `status --json`, `deploy --dry-run`, a drift error, the run's preflight) against a
simulated host whose unit carries secrets and whose endpoint carries `user:password@`."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from tests.test_deploy import OPTAGENT
from tools.deploy.units.file import UnitFile, unified_diff
from tools.redact import REDACTED, is_secret_name, redact, redact_flags, redact_text

# (text, the secret in it): each secret must vanish, whatever path the text takes
SECRET = [
    ("--api-key sk-live-0000abcd1111", "sk-live-0000abcd1111"),
    ("--api-key=k3y-value-42", "k3y-value-42"),
    ("--admin-api-key adm1n-s3cr3t", "adm1n-s3cr3t"),
    ("--hf-token hf-tok-0987654321", "hf-tok-0987654321"),
    ("--ssl-keyfile-password 'pw with space'", "pw with space"),
    ("Environment=HF_TOKEN=tok-abcdef-999", "tok-abcdef-999"),
    ('OPENAI_API_KEY="zz-very-secret"', "zz-very-secret"),
    ("server_args=ServerArgs(api_key='sekret123', max_total_tokens=8192)", "sekret123"),
    ("ServerArgs(admin_api_key='Adm1nKey', watermark_key_b='wm-b-s3cret')", "Adm1nKey"),
    ("ServerArgs(admin_api_key='Adm1nKey', watermark_key_b='wm-b-s3cret')", "wm-b-s3cret"),
    ('{"api_key": "json-s3cret", "max_tokens": 4}', "json-s3cret"),
    ("curl -H 'Authorization: Bearer abc.def.ghi123'", "abc.def.ghi123"),
    ("a key sk-proj-ABCDEFGH12345 in prose", "ABCDEFGH12345"),
    ("a token hf_AbCdEfGhIjKlMnOpQrSt in prose", "AbCdEfGhIjKlMnOpQrSt"),
    ("PGPASSWORD=pgpass99", "pgpass99"),
    ("endpoint http://admin:pa55w0rd@10.0.0.5:30000/v1", "pa55w0rd"),
    ("ssh://deploy:hunter22@10.0.0.5", "hunter22"),
    ("GET /v1/models?key=url-s3cret&limit=5", "url-s3cret"),
    ("Environment=HUGGING_FACE_HUB_TOKEN=hub-tok-1234", "hub-tok-1234"),
    ("password: hunter2x", "hunter2x"),
    # a URL whose userinfo is a token alone (git's and many registries' form)
    ("git clone https://glpat-Xy9zAbCdEf1234567890@gitlab.com/o/r.git", "glpat-Xy9zAbCdEf1234567890"),
    ("https://0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c@github.com/o/r", "0f1e2d3c4b5a69788796a5b4c3d2e1f0"),
    ("pip index https://Qm7xR2kP9vL4nT8w@pypi.example.com/simple", "Qm7xR2kP9vL4nT8w"),
    ("https://ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789@github.com", "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"),
    # a secret-named variable's value, even one that reads like code
    ("Environment=OPENAI_API_KEY=prod.key.v2", "prod.key.v2"),
    ("API_KEY=jwt.head.sig", "jwt.head.sig"),
    ("export HF_TOKEN=args.token", "args.token"),
]
# must come out unchanged, character for character
ORDINARY = [
    "--speculative-num-draft-tokens 4",
    "--max-prefill-tokens 16384",
    "--max-total-tokens 200000",
    "--max-tokens 400000",
    "--speculative-token-map /models/map.pt",
    "--ssl-keyfile /etc/ssl/key.pem",
    "--kt-max-deferred-experts-per-token 2",
    "TOKENIZERS_PARALLELISM=false",
    "input_tokens: 12, num_tokens=5",
    '{"output_tokens": 7, "max_new_tokens": 256}',
    "ServerArgs(ssl_keyfile_password=None, api_key=None, eos_token='</s>')",
    "bucket_time_to_first_token=[0.1, 0.5]",
    "the time to first token: 12 ms",
    "http://127.0.0.1:30000/v1",
    "ssh://deploy@10.0.0.5",
    "sort key=ratio",
    "token = tokens[pos]; next_token = tokens[pos + 1]",
    'self.bot_token = "<tool_call>"',
    'ASSISTANT_TOKEN = "<|Assistant|>"',
    "server = Server(api_key=args.api_key, secret=secret)",
    "def __init__(self, default: Any, secret: bool = False):",
    "ssl_key_password=ssl_keyfile_password,",
    "Restart with --admin-api-key to enable.",
    # a user name is not a secret: SSH targets, and a URL's user alone
    "root@127.0.0.1",
    "ssh -p 2222 ubuntu@gpu-host",
    "ssh://ubuntu@gpu-host:22",
    "git@github.com:org/repo.git",
    "https://myname@github.com/org/repo.git",
    "--max-prefill-tokens 8192",
]
FLAG_FORMS = [(t, s) for t, s in SECRET if t.startswith("--")]
CONFIGURED = "configured-k3y-xyz"


@pytest.mark.parametrize(("text", "secret"), SECRET)
def test_a_secret_is_hidden_in_error_text(text: str, secret: str) -> None:
    out = redact_text(f"error: could not start: {text}")
    assert secret not in out and REDACTED in out, out


@pytest.mark.parametrize("text", ORDINARY)
def test_an_ordinary_flag_or_counter_is_left_alone(text: str) -> None:
    assert redact_text(text) == text
    assert redact({"note": text}) == {"note": text}


def test_the_name_rule_follows_sglangs_own_arguments() -> None:
    secret = ["api_key", "--admin-api-key", "ssl_keyfile_password", "--hf-token", "watermark_key",
              "watermark_key_b", "HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "apiKey", "PGPASSWORD"]  # fmt: skip
    ordinary = ["--speculative-num-draft-tokens", "max_prefill_tokens", "--max-tokens", "speculative_token_map",
                "ssl_keyfile", "TOKENIZERS_PARALLELISM", "input_tokens", "num_tokens", "eos_token",
                "bucket_time_to_first_token", "kt_max_deferred_experts_per_token", "key", "maxTokens",
                "token", "cache_key", "next_token", "bot_token", "ASSISTANT_TOKEN"]  # fmt: skip
    assert [n for n in secret if not is_secret_name(n)] == []
    assert [n for n in ordinary if is_secret_name(n)] == []
    # an environment variable in capitals needs no word before KEY or TOKEN
    assert is_secret_name("DOCKER_LOGIN_TOKEN", variable=True) and not is_secret_name("DOCKER_LOGIN_TOKEN")
    assert not is_secret_name("docker_login_token", variable=True)


def test_every_path_hides_secrets_and_keeps_ordinary_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.transcripts.transcript import Transcript

    monkeypatch.setenv("MY_SERVICE_TOKEN", "env-tok-123456")  # a secret-named variable's value
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # not a secret: "false" stays everywhere
    texts = [t for t, _ in SECRET] + ORDINARY + ["seen env-tok-123456 in a log", f"key {CONFIGURED}"]
    secrets = [s for _, s in SECRET] + ["env-tok-123456", CONFIGURED]

    # a transcript record (the configured key arrives as $OPTAGENT_API_KEY, as `get_config` exports it)
    monkeypatch.setenv("OPTAGENT_API_KEY", CONFIGURED)
    t = Transcript.create(
        tmp_path, kind="run", goal="g", model="m", target="http://u:pa55w0rd@h:1", config={}
    )
    t.event("note", {"lines": texts, "api_key": "in-a-dict-0", "max_prefill_tokens": 16384})
    t.close({})
    raw = t.path.read_text()
    assert [s for s in [*secrets, "in-a-dict-0"] if s in raw] == []
    saved = [json.loads(line) for line in raw.splitlines()][1]["data"]
    assert saved["lines"][len(SECRET) : len(SECRET) + len(ORDINARY)] == ORDINARY
    assert saved["max_prefill_tokens"] == 16384 and saved["api_key"] == REDACTED

    # the status mapping: a unit's `--flag: value`
    flags = {t.split()[0].split("=")[0]: t.split("=", 1)[1] if "=" in t.split()[0] else t.split(" ", 1)[1]
             for t, _ in FLAG_FORMS}  # fmt: skip
    flags |= {
        "--max-prefill-tokens": "16384",
        "--speculative-num-draft-tokens": "4",
        "--trust-remote-code": None,
    }
    flags["--model-path"] = f"/models/{CONFIGURED}"  # the configured key inside another value
    shown = redact_flags(flags, secrets=[CONFIGURED])
    assert [v for v in shown.values() if v is not None and any(s in v for s in secrets)] == []
    assert shown["--max-prefill-tokens"] == "16384" and shown["--speculative-num-draft-tokens"] == "4"
    assert shown["--trust-remote-code"] is None and shown["--api-key"] == REDACTED

    # the deploy diff: a unit with every flag form, one ordinary flag changed
    argv = " ".join([t for t, _ in FLAG_FORMS] + [t for t in ORDINARY if t.startswith("--")])
    before = f"[Service]\nEnvironment=HF_TOKEN=tok-abcdef-999\nExecStart=/bin/serve {argv}\n"
    after = before.replace("--max-prefill-tokens 16384", "--max-prefill-tokens 8192")
    diff = redact_text(unified_diff(before, after))
    assert [s for s in secrets if s in diff] == []
    assert "--max-prefill-tokens 8192" in diff and "--speculative-num-draft-tokens 4" in diff
    assert "--max-tokens 400000" in diff and "--ssl-keyfile /etc/ssl/key.pem" in diff

    # error text and a URL
    error = redact_text(" ; ".join(texts), secrets=[CONFIGURED])
    assert [s for s in secrets if s in error] == [] and all(t in error for t in ORDINARY)
    assert redact_text("http://admin:pa55w0rd@10.0.0.5:30000") == f"http://admin:{REDACTED}@10.0.0.5:30000"


def test_redacting_twice_changes_nothing_more() -> None:
    once = redact_text("--api-key k3y-value-42 api_key='x1' http://u:p4ss@h https://Qm7xR2kP9vL4nT8w@h")
    assert redact_text(once) == once and once.count(REDACTED) == 4


def test_a_urls_token_alone_is_hidden_and_its_host_and_path_stay() -> None:
    """Only the userinfo goes: the host and path still say where the request went."""
    assert redact_text("fetch https://glpat-Xy9zAbCdEf1234567890@gitlab.com/o/r.git failed") == (
        f"fetch https://{REDACTED}@gitlab.com/o/r.git failed"
    )
    assert (
        redact_text("API_KEY=jwt.head.sig HF_TOKEN=hf.v2 ok") == f"API_KEY={REDACTED} HF_TOKEN={REDACTED} ok"
    )


ADMIN, KEYFILE_PW, HF, URL_PW = "adm1n-s3cr3t-key", "pw-s3cr3t-99", "hf_AbCdEfGhIjKlMnOpQrSt", "pa55w0rd-xyz"


def _secret_host(sim_host, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A started simulated host whose unit carries an admin key, a keyfile password and HF_TOKEN
    beside ordinary token-named flags, reached at an endpoint with `admin:password@`."""
    from sim import host

    cfg = sim_host("seed")
    unit = (
        UnitFile.load(Path(cfg.target.local_unit))
        .set_flag("--admin-api-key", ADMIN)
        .set_flag("--ssl-keyfile-password", KEYFILE_PW)
        .set_flag("--max-prefill-tokens", "16384")
        .render()
        .replace(
            "Environment=OPTAGENT_SIM_SCENARIO",
            f"Environment=HF_TOKEN={HF}\nEnvironment=OPTAGENT_SIM_SCENARIO",
        )
    )
    for path in (cfg.target.local_unit, cfg.target.remote_unit):
        Path(path).write_text(unit)
    host.ensure_up(Path(cfg.target.remote_unit).parent)
    target = cfg.target.model_copy(
        update={"endpoint": cfg.target.endpoint.replace("//", f"//admin:{URL_PW}@")}
    )
    lines = ["[target]"] + [
        f"{k} = {json.dumps(v if isinstance(v, bool | int | float) else str(v))}"
        for k, v in target.model_dump(mode="json").items()
        if v is not None
    ]
    config = tmp_path / "secret.toml"
    config.write_text("\n".join(lines) + "\n")
    return cfg.model_copy(update={"target": target}), config


def _cli(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OPTAGENT_API_KEY"} | {"COLUMNS": "200"}
    return subprocess.run([OPTAGENT, *args, "--config", str(config)], capture_output=True, text=True, env=env,
                          timeout=120)  # fmt: skip


def test_status_diff_and_errors_show_no_secret_and_every_ordinary_flag(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg, config = _secret_host(sim_host, tmp_path)
    status, as_json = _cli("status", config=config), _cli("status", "--json", config=config)
    dry = _cli("deploy", "--set", "max-prefill-tokens=8192", "--dry-run", config=config)
    for result in (status, as_json, dry):
        out = result.stdout + result.stderr
        assert result.returncode == 0, out
        assert [s for s in (ADMIN, KEYFILE_PW, HF, URL_PW) if s in out] == [], out
    assert (
        "--speculative-num-draft-tokens 4" in status.stdout and "--max-prefill-tokens 16384" in status.stdout
    )
    assert f"http://admin:{REDACTED}@127.0.0.1:" in status.stdout
    info = json.loads(as_json.stdout)
    assert info["endpoint"].startswith(f"http://admin:{REDACTED}@127.0.0.1:")
    assert info["deployed_flags"]["--admin-api-key"] == REDACTED
    assert info["deployed_flags"]["--speculative-num-draft-tokens"] == "4"
    assert info["deployed_flags"]["--max-prefill-tokens"] == "16384"
    assert "-    --max-prefill-tokens 16384" in dry.stdout and "+    --max-prefill-tokens 8192" in dry.stdout

    # someone changed the host's key behind optagent's back: the drift error shows the diff, not the keys
    remote = Path(cfg.target.remote_unit)
    remote.write_text(remote.read_text().replace(ADMIN, "changed-adm1n-key"))
    drift = _cli("deploy", "--set", "max-prefill-tokens=8192", "--yes", config=config)
    out = drift.stdout + drift.stderr
    assert drift.returncode != 0 and "--admin-api-key" in out, out
    assert [s for s in (ADMIN, "changed-adm1n-key", KEYFILE_PW, HF, URL_PW) if s in out] == [], out


def test_the_preflight_prints_the_endpoint_without_its_password(sim_host, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from agent.prepare import _preflight
    from agent.transcripts.transcript import Transcript
    from agent.ui import RunUI
    from tools.deploy.deployment import Deployment

    cfg, _ = _secret_host(sim_host, tmp_path)
    screen = io.StringIO()
    transcript = Transcript.create(
        tmp_path / "t", kind="run", goal="g", model="m", target=cfg.target.endpoint
    )
    ui = RunUI(Console(file=screen, width=200), transcript)

    async def preflight() -> None:
        async with Deployment(cfg.target) as d:
            await _preflight(ui, d, cfg.target, will_deploy=False)

    asyncio.run(preflight())
    transcript.close({})
    shown, saved = screen.getvalue(), transcript.path.read_text()
    assert f"server healthy at http://admin:{REDACTED}@127.0.0.1:" in shown, shown
    assert [s for s in (ADMIN, KEYFILE_PW, HF, URL_PW) if s in shown + saved] == []
    assert re.search(r"--speculative-num-draft-tokens.: .4", saved), saved  # a dict's repr or JSON
    assert re.search(r"--max-prefill-tokens.: .16384", saved), saved


def test_a_benchmark_and_a_probe_keep_no_url_password(sim_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The endpoint a sweep or a probe records (saved by `bench --json`, shown in its table) has no
    password, and the requests still reach the server through it."""
    from tools.bench.loadgen import run_sweep
    from tools.bench.probe import run_probe
    from tools.config import BenchConfig

    server = sim_server("seed")
    endpoint = server.endpoint.replace("//", f"//admin:{URL_PW}@")
    settings = BenchConfig(concurrency=[1], input_len=32, output_len=8, prompts_per_level=2, warmup=0)
    sweep = asyncio.run(run_sweep(endpoint, settings))
    probe = asyncio.run(run_probe(endpoint))
    assert sweep.errors == [] and sweep.levels and sweep.levels[0].completed == 2
    assert probe.outputs and all(o.error is None for o in probe.outputs)
    closed = asyncio.run(run_sweep(f"http://admin:{URL_PW}@127.0.0.1:9", settings))  # its errors name the URL
    assert closed.errors and any("127.0.0.1:9" in e for e in closed.errors)
    for recorded in (sweep.model_dump_json(), probe.model_dump_json(), closed.model_dump_json()):
        assert URL_PW not in recorded and f"admin:{REDACTED}@127.0.0.1:" in recorded

    unreachable = subprocess.run(
        [OPTAGENT, "bench", "--endpoint", f"http://admin:{URL_PW}@127.0.0.1:9", "--concurrency", "1"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert (
        unreachable.returncode == 1
        and f"cannot reach http://admin:{REDACTED}@127.0.0.1:9" in unreachable.stderr
    )
    assert URL_PW not in unreachable.stdout + unreachable.stderr
