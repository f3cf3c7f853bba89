"""Trial runner guards, at unit level against a small fake of the `Deployment` API (no server needed)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from agent.trial import Baseline, TrialChange, TrialRunner
from tools.config import BenchConfig
from tools.deploy import DeployOutcome

UNIT = """[Service]
ExecStart=/opt/venv/bin/python -m sglang.launch_server --model-path /models/m --port 30000
"""


@dataclass
class FakeDeployment:
    """Records what the runner asked for; `deploy` takes `deploy_s` seconds, then fails to start."""

    deploy_s: float = 0.0
    events: list[str] = field(default_factory=list)

    async def __aenter__(self) -> FakeDeployment:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.events.append("exit")  # the real one releases the lock and closes the connection

    async def deploy(self, text: str, *, reason: str) -> DeployOutcome:
        self.events.append("deploy")
        try:
            await asyncio.sleep(self.deploy_s)
        except asyncio.CancelledError:
            self.events.append("deploy cancelled")
            raise
        self.events.append("deploy done")
        return DeployOutcome(ok=False, error="did not start", rolled_back=True)

    async def rollback(self) -> DeployOutcome:
        await asyncio.sleep(0.01)
        self.events.append("rollback")
        return DeployOutcome(ok=True)

    async def commit(self) -> None:
        self.events.append("commit")


def _runner(deployment: FakeDeployment, **kw: object) -> TrialRunner:
    return TrialRunner(
        deployment=deployment,
        endpoint="http://127.0.0.1:9",
        bench=BenchConfig(),
        objective=None,
        baseline=Baseline(reps=[], probe=None, text=UNIT),
        **kw,
    )


def test_cancelled_trial_rolls_back_before_the_deployment_is_exited():
    fake = FakeDeployment(deploy_s=0.3)
    runner = _runner(fake)

    async def session() -> None:
        async with fake:
            await runner.run([TrialChange(flag="--cuda-graph-max-bs", value="64")], reason="test")

    async def main() -> None:
        task = asyncio.create_task(session())
        await asyncio.sleep(0.05)  # inside deploy()
        task.cancel()  # what asyncio.run does on Ctrl-C
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.4)  # anything still running in the background would show up now

    asyncio.run(main())
    assert fake.events == ["deploy", "deploy cancelled", "rollback", "exit"]
    assert runner.trials[0].decision == "rolled_back"
    assert "CancelledError" in runner.trials[0].why
