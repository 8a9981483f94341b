"""A Locust run's final numbers, read from ``--json-file`` rather than ``--csv``.

Locust rewrites ``<prefix>_stats.csv`` once a second from a background greenlet and does not
write it again when it quits, so the CSV misses whatever happened in the run's last second and
its stop timeout: a clean-clone CI run lost both refused connects of a 2 s swarm that way. The
JSON file is written at shutdown, after every user stopped, from the same entries the summary
table prints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    """One name's totals over the whole run (Locust's StatsEntry, as serialized)."""

    name: str
    requests: int = 0
    failures: int = 0
    none_requests: int = 0  # requests fired without a response time
    response_times: dict[int, int] = field(default_factory=dict)  # rounded ms -> count

    def percentile(self, q: float) -> float:
        """The percentile (q in 0..1) as Locust's summary table computes it; NaN when nothing was timed.

        Locust's rule, restated here because importing ``locust`` monkey-patches the importing
        process with gevent: walk the rounded times from the slowest down until no more than
        ``int(timed * q)`` requests are left below.
        """
        timed = self.requests - self.none_requests
        if timed <= 0 or not self.response_times:
            return float("nan")
        below = int(timed * q)
        seen = 0
        for ms in sorted(self.response_times, reverse=True):
            seen += self.response_times[ms]
            if timed - seen <= below:
                return float(ms)
        return float("nan")


def json_file_args(prefix: Path) -> list[str]:
    """Locust options that write the final stats to ``<prefix>.json`` (read it with ``final_stats``)."""
    return ["--json-file", str(prefix)]


def final_stats(prefix: Path) -> dict[str, Entry]:
    """Entries by name from ``<prefix>.json``; names that saw nothing are absent, as in Locust."""
    rows = json.loads(Path(f"{prefix}.json").read_text())
    out: dict[str, Entry] = {}
    for row in rows:
        # JSON turned the int keys of response_times into strings; Locust's percentile sorts them.
        times = {int(float(k)): int(v) for k, v in (row.get("response_times") or {}).items()}
        out[row["name"]] = Entry(name=row["name"], requests=int(row["num_requests"]),
                                 failures=int(row["num_failures"]),
                                 none_requests=int(row.get("num_none_requests") or 0), response_times=times)
    return out


def total_failures(stats: dict[str, Entry]) -> int:
    return sum(e.failures for e in stats.values())


def summary(stats: dict[str, Entry]) -> str:
    """A short table for assertion messages (the JSON run prints no summary of its own)."""
    return "\n".join(f"{e.name}: {e.requests} requests, {e.failures} failures, p50 {e.percentile(0.5):.0f} ms"
                     for e in stats.values())
