"""`pageserve admin install-units`: systemd units for the engine and the gateway, and their env files.

    pageserve admin install-units [--root /] [--user pageserve] [--memory-max 24G] [--redis-unit redis-server.service]

writes (under --root, "/" by default; tests use a temporary folder):

    etc/systemd/system/pageserve-engine.service    the engine (model + KV cache)
    etc/systemd/system/pageserve-gateway.service   the HTTP gateway; started once /ready answers 200
    etc/systemd/system/pageserve.target            both: `systemctl enable --now pageserve.target`
    etc/pageserve/engine.env, gateway.env          every setting, commented, with its default (0640)
    etc/sysusers.d/pageserve.conf                  the dedicated unprivileged user (systemd-sysusers)

Both services run as that user, ordered after and wanting Redis, restart on
failure (with an exponential back-off where systemd >= 254 has one), and are
hardened: NoNewPrivileges, ProtectSystem=strict (writable: their own cache and
state folders only), ProtectHome, PrivateTmp, RestrictAddressFamilies, an
optional MemoryMax. The gateway's readiness is an ExecStartPost probe of /ready
(`ops/ready_probe.py`), so `systemctl start` returns once it serves. The commands
are this interpreter's (`python -m ops.cli ...`), so the units run the code that
installed them. Settings come from the env files: every flag has a PAGESERVE_*
twin (shared/cli_env.py), and secrets (PAGESERVE_ADMIN_TOKEN, a Redis password
in PAGESERVE_REDIS_URL) never appear on a command line.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ops.supervisor import UNIT_BACKOFF

UNIT_DIR = "etc/systemd/system"
ENV_DIR = "etc/pageserve"
CACHE_DIR = "/var/cache/pageserve"
SOURCE_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class UnitOptions:
    user: str = "pageserve"
    python: str = sys.executable
    memory_max: str | None = None
    redis_unit: str = "redis-server.service"
    systemd_version: int = 0
    """Restart back-off keys (RestartSteps, RestartMaxDelaySec) are written only for systemd >= 254."""


def _hardening(o: UnitOptions) -> str:
    lines = [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "ProtectKernelTunables=yes",
        "ProtectControlGroups=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "UMask=0027",
    ]
    if o.memory_max:
        lines.append(f"MemoryMax={o.memory_max}")
    return "\n".join(lines)


def _restart(o: UnitOptions) -> str:
    b = UNIT_BACKOFF  # the same delays `pageserve up` uses for its engines (ops/supervisor.py)
    lines = ["Restart=on-failure", f"RestartSec={b.first_s:g}"]
    if o.systemd_version >= 254:
        lines += [f"RestartSteps={b.steps}", f"RestartMaxDelaySec={b.max_s:g}"]  # 2 s doubling up to 2 min
    return "\n".join(lines)


def _service(o: UnitOptions, name: str, description: str, after: str, wants: str, extra: str, stop_s: int) -> str:
    src = "" if _installed() else f"Environment=PYTHONPATH={SOURCE_ROOT}\n"
    return f"""# Written by `pageserve admin install-units`; settings live in /etc/pageserve/{name}.env.
[Unit]
Description={description}
PartOf=pageserve.target
After=network-online.target {after}
Wants=network-online.target {wants}
StartLimitIntervalSec=600
StartLimitBurst=20

[Service]
Type=exec
User={o.user}
Group={o.user}
CacheDirectory=pageserve
StateDirectory=pageserve
WorkingDirectory=/var/lib/pageserve
Environment=PAGESERVE_CACHE_DIR={CACHE_DIR} HF_HOME={CACHE_DIR}/hf XDG_CACHE_HOME={CACHE_DIR}
{src}EnvironmentFile=-/etc/pageserve/{name}.env
ExecStart={o.python} -m ops.cli {name}
{extra}KillSignal=SIGTERM
TimeoutStopSec={stop_s}
{_restart(o)}
{_hardening(o)}

[Install]
WantedBy=pageserve.target
"""


def units(o: UnitOptions) -> dict[str, str]:
    engine = _service(o, "engine", "pageserve engine (model + paged KV cache)", o.redis_unit, o.redis_unit,
                      "# SIGTERM: stop admitting, let in-flight requests finish (--shutdown-grace), exit 0.\n", 60)
    probe = (f"# Started = serving: wait until /ready answers 200 (engine connected, Redis reachable).\n"
             f"ExecStartPost={o.python} -m ops.ready_probe --timeout 600\n"
             "TimeoutStartSec=660\n"
             "# SIGTERM: /ready 503 at once, open streams get --drain-time to finish.\n")
    gateway = _service(o, "gateway", "pageserve gateway (OpenAI-compatible HTTP API)",
                       f"{o.redis_unit} pageserve-engine.service", f"{o.redis_unit} pageserve-engine.service",
                       probe, 120)
    target = f"""# Written by `pageserve admin install-units`: `systemctl enable --now pageserve.target`.
[Unit]
Description=pageserve (engine + gateway)
Wants=pageserve-engine.service pageserve-gateway.service {o.redis_unit}
After=pageserve-engine.service pageserve-gateway.service

[Install]
WantedBy=multi-user.target
"""
    return {"pageserve-engine.service": engine, "pageserve-gateway.service": gateway, "pageserve.target": target}


def _installed() -> bool:
    """True when this code runs from site-packages (pip-installed); a source checkout needs PYTHONPATH."""
    return "site-packages" in SOURCE_ROOT.parts


def env_file(component: str) -> str:
    """Every setting of `pageserve <component>`, commented out at its default, with its help."""
    from shared.cli_env import ENV_ATTR

    if component == "engine":
        from engine.serving.main import build_parser
    else:
        from gateway.server import build_parser  # type: ignore[assignment]
    parser = build_parser({})
    lines = [f"# /etc/pageserve/{component}.env: settings of `pageserve {component}` (written by install-units).",
             "# Uncomment a line to change it; `systemctl restart pageserve-" + component + "` applies it.", ""]
    if component == "gateway":
        lines += ["# Secrets go here, never on a command line (this file is 0640, group " + "pageserve):",
                  "#PAGESERVE_ADMIN_TOKEN=", ""]
    for action in parser._actions:
        if not action.option_strings or not hasattr(action, ENV_ATTR):
            continue
        help_text = (action.help or "").split("[env ")[0].strip()
        default = re.search(r"; default (.*)\]$", action.help or "")
        shown = default.group(1) if default else ""
        shown = "" if shown == "none" else shown
        lines += [f"# {action.option_strings[-1]}: {help_text}", f"#{getattr(action, ENV_ATTR)}={shown}", ""]
    return "\n".join(lines)


def _systemd_version() -> int:
    try:
        out = subprocess.run(["systemctl", "--version"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    match = re.match(r"systemd (\d+)", out)
    return int(match.group(1)) if match else 0


def install(root: Path, o: UnitOptions) -> list[Path]:
    written: list[Path] = []
    for name, text in units(o).items():
        written.append(_write(root / UNIT_DIR / name, text, 0o644))
    for component in ("engine", "gateway"):
        path = root / ENV_DIR / f"{component}.env"
        if path.exists():  # an operator's settings are never overwritten
            continue
        written.append(_write(path, env_file(component), 0o640))
    sysusers = f'u {o.user} - "pageserve model serving" /var/lib/pageserve\n'
    written.append(_write(root / "etc/sysusers.d/pageserve.conf", sysusers, 0o644))
    return written


def _write(path: Path, text: str, mode: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="pageserve admin install-units", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="/", help="write under this folder instead of / (packaging, tests)")
    p.add_argument("--user", default="pageserve", help="the unprivileged user both services run as")
    p.add_argument("--memory-max", default=None, help="MemoryMax of each service, e.g. 24G (default: none)")
    p.add_argument("--redis-unit", default="redis-server.service", help="the Redis unit to order after and want")
    p.add_argument("--python", default=sys.executable, help="the interpreter of the installed project")
    a = p.parse_args(argv)
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", a.user):
        p.error(f"--user {a.user!r} is not a valid user name")
    if a.memory_max is not None and not re.fullmatch(r"\d+[KMGT]?|infinity", a.memory_max):
        p.error(f"--memory-max {a.memory_max!r}: a byte count with K/M/G/T, or infinity")
    options = UnitOptions(user=a.user, python=a.python, memory_max=a.memory_max, redis_unit=a.redis_unit,
                          systemd_version=_systemd_version())
    for path in install(Path(a.root), options):
        print(f"wrote {path}")
    if a.root == "/":
        print("next: systemd-sysusers && systemctl daemon-reload && systemctl enable --now pageserve.target")
    return 0
