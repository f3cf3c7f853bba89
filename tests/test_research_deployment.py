"""`optagent research FLAG` in a project with a deployment (issue 51 item 8): the facts are the
deployment's, read as a run reads them (SGLang version, unit file, resolved server arguments, the
model's config.json, the GPUs), the output says which deployment it used and what it could not
read, and a value `optagent deploy` refuses comes out refused with deploy's own reason.

The real CLI (typer's CliRunner) against a simulated host on loopback, SGLang 0.5.23's real source
and its own start-up check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli.main import app

pytestmark = pytest.mark.slow(seconds=90)


def _toml(name: str, data: dict) -> str:
    return "\n".join([f"[{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in data.items() if v is not None])


@pytest.fixture
def project(sim_host, sglang_0523, tmp_path: Path) -> Path:
    """A project whose optagent.toml targets a running simulated seed host (Qwen3.5-122B-A10B, TP 4
    on four RTX PRO 6000), its research reading SGLang 0.5.23's source."""
    from sim import host

    cfg = sim_host("seed")
    host.ensure_up(Path(cfg.target.remote_unit).parent)
    target = cfg.target.model_dump(mode="json")
    research = {"source_dir": str(sglang_0523.root)}
    text = "simulated = true\n" + "\n\n".join([_toml("target", target), _toml("research", research)])
    (tmp_path / "optagent.toml").write_text(text + "\n")
    return tmp_path / "optagent.toml"


def _research(config: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    env = {"COLUMNS": "400", **(env or {})}
    out = CliRunner().invoke(app, ["research", *args, "--config", str(config)], env=env)
    return out.exit_code, out.stdout


def test_research_says_when_the_start_up_ran_without_bubblewrap(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's own start-up runs under bubblewrap here. On a machine with neither bwrap, user
    namespaces nor Landlock (simulated: a kernel without Landlock cannot be made here) it is not run
    and the verdict says why and what to install; with the level capped at the audit hook (the user
    accepts it) it runs, and the verdict says how it was isolated."""
    from tools.research.startup import isolation

    note = "SGLang's start-up ran isolated by the audit hook only (no bubblewrap here)"
    code, out = _research(project, "--enable-mixed-chunk", "--json")
    assert code == 0 and not [n for n in json.loads(out)["notes"] if "isolated by" in n], out
    monkeypatch.setattr(isolation, "available", lambda: ["hook"])
    monkeypatch.setattr(isolation, "landlock_abi", lambda: 0)
    code, out = _research(project, "--enable-mixed-chunk", "--json")
    data = json.loads(out)
    refused = [n for n in data["notes"] if n.startswith("SGLang's own start-up: not run: ")]
    assert code == 0 and data["decided_by"] == "code", data
    assert len(refused) == 1 and "neither bubblewrap nor Landlock" in refused[0], data["notes"]
    assert "apt-get install bubblewrap" in refused[0] and "OPTAGENT_RESOLVER_ISOLATION=hook" in refused[0]
    code, out = _research(
        project, "--enable-mixed-chunk", "--json", env={"OPTAGENT_RESOLVER_ISOLATION": "hook"}
    )
    data = json.loads(out)
    assert code == 0 and note in data["notes"], data["notes"]
    assert data["verdict"] == "applies"  # the same answer, only less isolated


def test_research_reads_the_configured_deployment_and_says_which(project: Path) -> None:
    from tools.config import load_config

    endpoint = load_config(project).target.endpoint
    code, text = _research(project, "--enable-mixed-chunk")
    assert code == 0, text
    assert f"deployment: the simulated deployment at {endpoint}" in text and "SGLang 0.5.23" in text
    assert "model: Qwen3_5MoeForConditionalGeneration, MoE 256 experts" in text
    assert "(config.json of " in text and "Qwen3.5-122B-A10B)" in text
    assert "GPUs: 4x NVIDIA RTX PRO 6000 Blackwell" in text and "not read" not in text
    # SGLang's own start-up ran on the deployment's model and GPUs (it said "not run: no model config")
    assert "not run" not in text
    assert "SGLang's own argument resolution here changes: enable_mixed_chunk False -> True" in text

    code, out = _research(project, "--enable-mixed-chunk", "--json")
    data = json.loads(out)
    assert code == 0 and data["deployment"]["used"] and data["deployment"]["sglang_version"] == "0.5.23"
    assert data["deployment"]["missing"] == {}
    # the run's facts: the GPUs, the model and the running server's resolved arguments
    facts = data["facts"]
    assert facts["gpu.sm"] == 120 and facts["gpu.count"] == 4 and facts["server.tp_size"] == 4
    assert facts["model.architecture"] == "Qwen3_5MoeForConditionalGeneration"
    assert facts["sglang.version"] == "0.5.23" and facts["server.chunked_prefill_size"] == 8192


def test_a_value_deploy_refuses_is_refused_with_deploys_reason(project: Path, sglang_0523) -> None:
    code, text = _research(project, "--tp-size", "--value", "0")
    assert code == 0, text
    assert "verdict: refuses-to-start (deploy check, certainty 1.00)" in text, text
    assert "applies" not in text
    # the one check both use: deploy gives the same reason for the same value
    deploy = CliRunner().invoke(
        app, ["deploy", "--set", "tp-size=0", "--dry-run", "--config", str(project)], env={"COLUMNS": "400"}
    )
    assert deploy.exit_code == 2
    reason = " ".join(deploy.output.split()).removeprefix("error: ")
    assert reason == "--tp-size must be an integer of at least 1, got 0; SGLang would refuse it at start-up"
    assert reason in " ".join(text.split())
    # and a model's proposal is refused by the same check before any restart, catalog or not
    from agent.context import DeploymentContext
    from agent.policy.proposal import check_changes
    from agent.trial.record import TrialChange
    from tools.research.flags import flag_catalog

    ctx = DeploymentContext(version="0.5.23")
    ctx.catalog = {f.name: f for f in flag_catalog(sglang_0523)}
    for known in (ctx, DeploymentContext()):
        assert check_changes(known, [TrialChange(flag="--tp-size", value="0")]) == [reason]

    code, out = _research(project, "--attention-backend", "--value", "nope", "--json")
    data = json.loads(out)
    assert data["verdict"] == "refuses-to-start" and data["decided_by"] == "deploy check"
    assert "--attention-backend must be one of triton" in data["summary"]
    code, out = _research(project, "--enable-mixed-chunk", "--value", "3", "--json")
    assert "is a switch and takes no value" in json.loads(out)["summary"]

    # a value deploy takes is for the code and SGLang's start-up to judge
    code, out = _research(project, "--tp-size", "--value", "2", "--json")
    data = json.loads(out)
    assert code == 0 and data["decided_by"] != "deploy check" and data["verdict"] != "refuses-to-start"


def test_a_deployment_that_does_not_answer_is_named_and_research_falls_back(project: Path) -> None:
    from sim import host
    from tools.config import load_config

    cfg = load_config(project)
    host.down(Path(cfg.target.remote_unit).parent)
    code, text = _research(project, "--enable-mixed-chunk")
    assert code == 0, text
    assert f"deployment: the simulated deployment at {cfg.target.endpoint}" in text
    assert "SGLang version not read" in text
    assert "not read: the server's resolved arguments from /get_server_info (" in text
    assert "the unit file's flags stand in" in text
    # what the host still gives (its files) is used: the model and the GPUs
    assert "model: Qwen3_5MoeForConditionalGeneration" in text and "GPUs: 4x NVIDIA" in text
    assert "verdict: " in text


def test_no_deployment_to_read_is_said_once(tmp_path: Path, sglang_0523, monkeypatch) -> None:
    """No optagent.toml and no simulated host laid out: research says it used none."""
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(
        app, ["research", "--enable-mixed-chunk", "--source", str(sglang_0523.root)], env={"COLUMNS": "400"}
    )
    assert out.exit_code == 0, out.output
    assert "deployment: none used: no deployment configured" in out.stdout
    out = CliRunner().invoke(app, ["research", "--enable-mixed-chunk", "--version", "0.5.23", "--json"])
    data = json.loads(out.stdout)
    assert data["deployment"] == {
        "used": False,
        "why": "no simulated deployment here (`optagent sim up` lays one out)",
    }
