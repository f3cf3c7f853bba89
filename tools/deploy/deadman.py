"""The dead-man's switch: the host restores known-good by itself unless optagent confirms in time.

Armed before a candidate is uploaded (it only needs the known-good text), so the host never holds
a candidate without it. An `armed` file on the host is the switch: the timer claims
it with an atomic `mv` before restoring, and disarming removes it with `rm`, so exactly one of
"confirmed" and "restored" happens. The known-good text is copied to the host when arming.
For systemd the timer is a transient unit (`systemd-run --on-active=N`); for the process manager it
is a detached watchdog process in its own session.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from tools.deploy.remote import Transport
from tools.deploy.service import ProcessManager, SystemdManager

if TYPE_CHECKING:
    from tools.deploy.service import ServiceManager

__all__ = ["WATCHDOG_MARK", "DeadmanSwitch"]

WATCHDOG_MARK = "optagent-deadman-watchdog"
"""Begins the watchdog's script (`: MARK ARMED_PATH`): its command line says which switch it is."""


def _put(path: str, value: str) -> str:
    """Shell: write `value` (expanded by the shell) to a new file made by `mktemp` (O_EXCL: never through
    a planted link, never into someone's file), then rename it over `path`."""
    q = shlex.quote
    return f't=$(mktemp {q(path + ".tmp.XXXXXX")}) && echo "{value}" > "$t" && mv -f "$t" {q(path)}'


class DeadmanSwitch:
    """Arms and disarms the host-side timer for one service."""

    def __init__(
        self, transport: Transport, manager: ServiceManager, *, run_dir: str, unit_path: str, service: str
    ):
        self.transport, self.manager, self.unit_path, self.service = transport, manager, unit_path, service
        base = f"{run_dir.rstrip('/')}/{service}"
        self.armed_path, self.known_good_path = f"{base}.deadman-armed", f"{base}.known-good"
        self.watchdog_pid_path, self.timer_unit = f"{base}.deadman.pid", f"optagent-deadman-{service}"
        self.deadline_path = f"{base}.deadman-deadline"

    def _restore_shell(self, *, systemd: bool = False) -> str:
        q = shlex.quote
        claim = f"mv -f {q(self.armed_path)} {q(self.armed_path)}.firing 2>/dev/null || exit 0; "
        if (
            systemd
        ):  # no `$` in a command systemd-run starts (systemd would expand it); rm first: no planted link
            tmp = q(f"{self.unit_path}.optagent-deadman-tmp")
            return (
                f"{claim}rm -f {tmp} && cp {q(self.known_good_path)} {tmp} && mv -f {tmp} {q(self.unit_path)}"
            )
        tmp = q(f"{self.unit_path}.optagent-deadman-tmp.XXXXXX")
        copy = f't=$(mktemp {tmp}) && cat {q(self.known_good_path)} > "$t" && chmod 644 "$t"'
        return f'{claim}{copy} && mv -f "$t" {q(self.unit_path)}'

    def _systemd_script(self) -> str:
        assert isinstance(self.manager, SystemdManager)
        q = shlex.quote
        return (
            f"{self._restore_shell(systemd=True)} && systemctl daemon-reload && systemctl restart {q(self.manager.unit)}; "
            f"mv -f {q(self.armed_path)}.firing {q(self.armed_path)}.fired"
        )

    async def arm(self, known_good: str, seconds: float) -> None:
        """Copy known-good to the host and start the timer."""
        await self.transport.write_file_atomic(self.known_good_path, known_good)
        q = shlex.quote
        arm = f"rm -f {q(self.armed_path)}.firing {q(self.armed_path)}.fired && {_put(self.armed_path, 'armed')}"
        secs = max(1, round(seconds))
        if isinstance(self.manager, SystemdManager):
            sudo = ["sudo", "-n"] if self.manager.sudo else []
            script = self._systemd_script()
            await self.transport.run(["sh", "-c", arm], check=True)
            await self.transport.run([*sudo, "systemctl", "stop", f"{self.timer_unit}.timer"])
            await self.transport.run(
                [*sudo, "systemd-run", f"--unit={self.timer_unit}", f"--on-active={secs}",
                 "--timer-property=AccuracySec=1s", "/bin/sh", "-c", script],
                check=True,
            )  # fmt: skip
            return
        assert isinstance(self.manager, ProcessManager)
        pm = self.manager
        argv, env, cwd = await pm.command_for(known_good)
        deadline = q(self.deadline_path)
        wait = (  # sleeps until the deadline, which extend() may push back
            f'while :; do d=$(cat {deadline} 2>/dev/null || echo 0); n=$(date +%s); [ "$n" -ge "$d" ] && break; '
            f"sleep $((d - n)); done"
        )
        script = (  # the marker in its command line is how disarm() knows the PID is this watchdog
            f": {WATCHDOG_MARK} {q(self.armed_path)}; {_put(self.watchdog_pid_path, '$$')}; {wait}; "
            f"{self._restore_shell()}; "
            f"echo 'optagent dead-man switch: restoring the known-good configuration' >> {q(pm.log_path)}; "
            f"{pm.stop_shell()}; {pm.start_shell(argv, env, cwd)}; "
            f"mv -f {q(self.armed_path)}.firing {q(self.armed_path)}.fired; rm -f {q(self.watchdog_pid_path)}"
        )
        launch = (
            f"{arm} && {_put(self.deadline_path, f'$(($(date +%s) + {secs}))')} && "
            f"{{ setsid sh -c {q(script)} > /dev/null 2>&1 < /dev/null & }}"
        )
        await self.transport.run(["sh", "-c", launch], check=True)

    async def extend(self, seconds: float) -> bool:
        """Push the deadline to `seconds` from now (one round trip); False if the switch is not armed."""
        q, secs = shlex.quote, max(1, round(seconds))
        if isinstance(self.manager, SystemdManager):
            sudo = "sudo -n " if self.manager.sudo else ""
            timer = shlex.join(
                ["systemd-run", f"--unit={self.timer_unit}", f"--on-active={secs}",
                 "--timer-property=AccuracySec=1s", "/bin/sh", "-c", self._systemd_script()]
            )  # fmt: skip
            move = f"{sudo}systemctl stop {q(self.timer_unit + '.timer')} >/dev/null 2>&1; {sudo}{timer} >/dev/null"
        else:
            move = _put(self.deadline_path, f"$(($(date +%s) + {secs}))")
        script = f"[ -e {q(self.armed_path)} ] || exit 3; {move}"
        result = await self.transport.run(["sh", "-c", script])
        return result.ok

    async def disarm(self) -> bool:
        """Stop the timer (one round trip); False if it had already fired (the host went back to known-good)."""
        q = shlex.quote
        if isinstance(self.manager, SystemdManager):
            sudo = "sudo -n " if self.manager.sudo else ""
            stop = f"{sudo}systemctl stop {q(self.timer_unit + '.timer')} >/dev/null 2>&1;"
        else:  # only a watchdog that did not fire is stopped; a firing one must finish; and only ours
            stop = (
                'p=; { read -r p _ < "$2"; } 2>/dev/null; case "$p" in ""|*[!0-9]*) p=;; esac;'
                f' [ -n "$p" ] && [ "$p" -gt 1 ] && grep -qF "{WATCHDOG_MARK} $1" "/proc/$p/cmdline" 2>/dev/null'
                ' && [ "$(stat -c %u "/proc/$p")" = "$(id -u)" ] && kill -s TERM -- "-$p" 2>/dev/null; rm -f "$2";'
            )
        script = (
            f'if rm "$1" 2>/dev/null; then {stop} exit 0; fi; {stop if isinstance(self.manager, SystemdManager) else ""}'
            ' if [ -e "$1.firing" ] || [ -e "$1.fired" ]; then exit 3; fi; exit 0'
        )
        result = await self.transport.run(["sh", "-c", script, "sh", self.armed_path, self.watchdog_pid_path])
        return result.returncode != 3

    async def is_armed(self) -> bool:
        """True while the switch is armed."""
        return await self.transport.exists(self.armed_path)

    async def fired(self) -> bool:
        """True once the timer has restored known-good (until the next arm)."""
        return await self.transport.exists(f"{self.armed_path}.fired")

    async def is_firing(self) -> bool:
        """True while the timer is restoring known-good."""
        return await self.transport.exists(f"{self.armed_path}.firing")
