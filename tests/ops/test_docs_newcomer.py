"""The operator docs say what the code does (issue 28, "Docs a newcomer trips on").

- operations.md's recipe for a room's control entries, run as written against a real Redis holding a
  room's real output stream (a synthetic worker spoke into it): it prints the ``start`` and ``end``
  entries (without ``grep -a`` it printed nothing: the audio fields make grep call it binary);
- operations.md's key table names the keys voxroom/store/keys.py builds (the wake streams and the cache among them);
- deployment.md's "Without containers" workers on one host each get their own metrics port;
- client_js/README.md's module table lists every browser API each module reaches, itself or through
  the modules it imports.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from pathlib import Path

from tests.ops.conftest import OpsStack
from tests.support.processes import ROOT
from tests.support.room_client import RoomClient
from voxroom.store import keys
OPERATIONS = ROOT / "docs" / "operations.md"
DEPLOYMENT = ROOT / "docs" / "deployment.md"
CLIENT_README = ROOT / "client_js" / "README.md"


async def test_the_control_entries_recipe_prints_the_start_and_end(ops_stack: OpsStack) -> None:
    room = f"docs-{uuid.uuid4().hex[:8]}"
    async with RoomClient(ops_stack.port, room) as client:
        await client.say("A line to look for in the output stream.")
        await client.wait_ends(1, timeout=60)
    (recipe,) = [line for line in OPERATIONS.read_text().splitlines()
                 if line.startswith("rc XREVRANGE 'vx:room:{lobby}:out'")]
    redis_cli = shutil.which("redis-cli")
    assert redis_cli, "redis-cli is not installed: run scripts/system-deps"
    port = ops_stack.redis_url.rsplit(":", 1)[1].split("/")[0]
    command = recipe.replace("rc ", f"{redis_cli} -p {port} ", 1).replace("{lobby}", "{" + room + "}")
    done = subprocess.run(command, shell=True, capture_output=True, text=True, errors="replace", timeout=30,
                          check=False)
    lines = done.stdout.splitlines()
    assert "start" in lines and "end" in lines, f"{recipe!r} printed {done.stdout[:300]!r}"
    assert "A line to look for in the output stream." in done.stdout


def test_the_key_table_names_every_key() -> None:
    """Each key as voxroom/store/keys.py builds it, with the table's placeholders for its arguments."""
    table = "\n".join(line for line in OPERATIONS.read_text().splitlines() if line.startswith("| `vx:"))
    built = [keys.JOBS, keys.ROOMS, keys.room_output("room"), keys.worker_heartbeat("{id}"),
             keys.worker_wake("{id}"), keys.gateway_wake("{id}", "api"), keys.gateway_wake("{id}", "{n}"),
             keys.cache_slot("{slot}")]  # type: ignore[arg-type]
    assert [key for key in built if f"| `{key}` |" not in table] == []


def test_workers_on_one_host_get_their_own_metrics_ports() -> None:
    text = DEPLOYMENT.read_text()
    block = text[text.index("## Without containers"):]
    block = block[block.index("```sh"):block.index("```", block.index("```sh") + 5)]
    workers = [line for line in block.splitlines() if re.search(r"\bvoxroom worker\b", line)]
    assert len(workers) >= 2, block
    ports = [re.search(r"--metrics-port (\d+)|VOXROOM_WORKER_METRICS_PORT=(\d+)", w) for w in workers]
    assert all(ports), f"a worker without its own port takes the default (9464): {workers}"
    values = [m.group(1) or m.group(2) for m in ports if m]
    assert len(set(values)) == len(values), values


# What each browser API looks like in the source, and what the README calls it.
APIS = {"WebSocket": r"\bWebSocket\b", "fetch": r"\bfetch\(", "Web Audio": r"\bAudioContext\b",
        "WebCodecs": r"\bAudioDecoder\b", "AudioWorklet": r"\bAudioWorkletProcessor\b|\bregisterProcessor\b"}


def _reaches(module: Path, seen: set[Path] | None = None) -> set[str]:
    seen = set() if seen is None else seen
    if module in seen or not module.exists():
        return set()
    seen.add(module)
    source = re.sub(r"//[^\n]*|/\*.*?\*/", "", module.read_text(), flags=re.S)  # not what comments mention
    found = {api for api, pattern in APIS.items() if re.search(pattern, source)}
    for imported in re.findall(r"^import [^;]*? from '\./([\w.-]+)'", source, flags=re.M):
        found |= _reaches(module.parent / imported, seen)
    return found


def test_the_module_table_lists_the_browser_apis_each_module_reaches() -> None:
    rows = re.findall(r"^\| `([\w.-]+\.js)` \| [^|]+ \| ([^|]+) \|$", CLIENT_README.read_text(), flags=re.M)
    assert len(rows) >= 8, rows
    wrong = {}
    for name, said in rows:
        reached = _reaches(ROOT / "client_js" / name)
        listed = {api for api in APIS if api in said}
        if reached - listed:
            wrong[name] = sorted(reached - listed)
    assert wrong == {}, f"used but not listed: {wrong}"
