"""docker-compose.yml against the CLI: there is no Docker engine here, so check what can go wrong
without one: every ``voxroom`` command parses, every variable is a setting with a valid value,
each worker reserves its own GPU, and nginx's upstreams are exactly the gateway services."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.support.processes import ROOT
from voxroom.runtime.settings import Settings
from voxroom_cli.main import build_parser

COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(COMPOSE.read_text())
    return dict(doc["services"])


def _interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR:?error}``: the default, or a stand-in for a required one."""
    def one(m: re.Match[str]) -> str:
        _name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        return arg if op.startswith(":-") or op.startswith("-") else "set-by-operator"
    return re.sub(r"\$\{(\w+)(:?[-?])?([^}]*)\}", one, value)


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: _interpolate(str(v)) for k, v in env.items()}


def test_every_voxroom_command_parses(services: dict[str, dict[str, Any]]) -> None:
    parser = build_parser()
    voxroom_services = {name: s for name, s in services.items() if (s.get("command") or [""])[0] == "voxroom"}
    assert {n for n, s in voxroom_services.items() if s["command"][1] == "gateway"} >= {"gateway-1", "gateway-2"}
    assert {n for n, s in voxroom_services.items() if s["command"][1] == "worker"} >= {"worker-gpu0", "worker-gpu1"}
    for name, service in voxroom_services.items():
        try:
            parser.parse_args(service["command"][1:])
        except SystemExit:
            pytest.fail(f"{name}: `{' '.join(service['command'])}` is not accepted by voxroom's CLI")


def test_every_variable_is_a_setting_with_a_valid_value(services: dict[str, dict[str, Any]]) -> None:
    known = set(Settings.env_names())
    for name, service in services.items():
        if (service.get("command") or [""])[0] != "voxroom":
            continue
        env = _env(service)
        unknown = {k for k in env if (k.startswith("VOXROOM_") or k == "REDIS_URL") and k not in known}
        assert not unknown, f"{name} sets {unknown}, which Settings does not know"
        assert env["REDIS_URL"] == "redis://redis:6379/0"
        Settings.from_env(env)  # values parse (ints are ints, booleans are booleans)


def test_one_worker_per_gpu(services: dict[str, dict[str, Any]]) -> None:
    seen: list[str] = []
    for name, service in services.items():
        if name.startswith("worker"):
            (device,) = service["deploy"]["resources"]["reservations"]["devices"]
            assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
            (gpu,) = device["device_ids"]
            seen.append(gpu)
    assert len(seen) >= 2 and len(set(seen)) == len(seen), seen


def test_redis_persists_and_nginx_fronts_every_gateway(services: dict[str, dict[str, Any]]) -> None:
    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    gateways = {f"{n}:8000" for n, s in services.items() if s.get("command", [""])[1:2] == ["gateway"]}
    # nginx's template names each gateway by a variable that the nginx service sets (tests/ops/test_nginx.py
    # checks the template layout and runs the shipped files).
    upstreams = {str(v) for k, v in services["nginx"]["environment"].items() if k.startswith("NGINX_GATEWAY_")}
    assert upstreams == gateways
    for mount in services["nginx"]["volumes"]:
        assert (ROOT / mount.split(":")[0]).exists(), mount
    assert (ROOT / "Dockerfile").exists()
    targets = {s["build"]["target"] for s in services.values() if "build" in s}
    dockerfile = (ROOT / "Dockerfile").read_text()
    for target in targets:
        assert re.search(rf"^FROM \S+ AS {target}$", dockerfile, re.M), target


def _bytes(size: str) -> int:
    """redis.conf memory units: ``4gb``, ``512mb``, ``1000000``."""
    m = re.fullmatch(r"(\d+)(kb|mb|gb)?", size.lower())
    assert m, size
    return int(m.group(1)) * {"kb": 1024, "mb": 1024**2, "gb": 1024**3, None: 1}[m.group(2)]


def test_redis_has_a_memory_budget_that_never_evicts_jobs(services: dict[str, dict[str, Any]]) -> None:
    """``noeviction`` without ``maxmemory`` grows until the host kills Redis; ``allkeys-*`` would
    evict ``vx:jobs`` (accepted lines). A ``volatile-*`` policy evicts only keys with a TTL:
    rooms' keys and the audio cache, never the job stream."""
    cmd = [_interpolate(str(part)) for part in services["redis"]["command"]]
    assert "--maxmemory" in cmd, cmd
    assert _bytes(cmd[cmd.index("--maxmemory") + 1]) >= 1024**3
    assert cmd[cmd.index("--maxmemory-policy") + 1] == "volatile-lru"


def test_workers_load_chattts_from_their_mount_and_never_download(services: dict[str, dict[str, Any]]) -> None:
    """The weights are a read-only mount: the setting's own default (``huggingface``) would try the
    hub and write into it. ``local`` (published hashes) by default; ``custom`` for an operator's own
    model (tests/ops/test_compose_stack.py runs the worker that way on a tiny checkpoint)."""
    for name, service in services.items():
        command = service.get("command") or []
        if command[:2] != ["voxroom", "worker"] or "chattts" not in command:
            continue
        mounted = {v.split(":")[1]: v.split(":")[2:] for v in service["volumes"]}
        chattts_dir = command[command.index("--chattts-dir") + 1]
        (mount,) = [target for target in mounted if chattts_dir.startswith(target + "/")]
        assert mounted[mount] == ["ro"], (name, mount)
        assert _env(service)["VOXROOM_CHATTTS_SOURCE"] == "local", name
        assert service["environment"]["VOXROOM_CHATTTS_SOURCE"] == "${VOXROOM_CHATTTS_SOURCE:-local}", name
