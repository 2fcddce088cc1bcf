"""Where a machine's CPU time goes during a load: every process's (and its threads') CPU seconds
between two snapshots of ``/proc`` (Linux), as cores used over the window.

Why: a service that does not reach its offline speed is bound by something; a process (or one of
its threads) near 1.0 core is the usual suspect, none near it says the bound is elsewhere (waits).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Snapshot", "busiest"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(stat: str) -> tuple[str, float]:
    """(comm, utime + stime in seconds) of one ``/proc/.../stat`` line."""
    left, right = stat.index("("), stat.rindex(")")
    fields = stat[right + 2 :].split()
    return stat[left + 1 : right], (int(fields[11]) + int(fields[12])) / _TICKS


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # the process or thread ended
        return None


@dataclass
class Snapshot:
    """CPU seconds of every process and thread, by pid and (pid, tid)."""

    processes: dict[int, float]
    threads: dict[tuple[int, int], tuple[str, float]]

    @classmethod
    def take(cls) -> Snapshot:
        processes, threads = {}, {}
        root = Path("/proc")
        if not root.is_dir():
            return cls({}, {})
        for entry in root.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = _read(entry / "stat")
            if stat is None:
                continue
            processes[pid] = _cpu_seconds(stat)[1]
            tasks = entry / "task"
            try:
                tids = [int(t.name) for t in tasks.iterdir()]
            except OSError:
                continue
            for tid in tids:
                line = _read(tasks / str(tid) / "stat")
                if line is not None:
                    threads[(pid, tid)] = _cpu_seconds(line)
        return cls(processes, threads)


def _title(pid: int) -> str:
    raw = _read(Path(f"/proc/{pid}/cmdline")) or ""
    parts = [p for p in raw.split("\0") if p]
    return " ".join(parts)[:90] if parts else f"pid {pid}"


def busiest(before: Snapshot, after: Snapshot, wall_s: float, top: int = 12,
            threads_of: int = 4) -> list[dict]:
    """The ``top`` processes by cores used between the snapshots, each with its busiest threads (the
    ``threads_of`` busiest processes only): ``[{"pid", "title", "cores", "threads": [[comm, tid, cores]]}]``."""
    used = {pid: after.processes[pid] - before.processes.get(pid, 0.0) for pid in after.processes}
    rows = []
    for rank, (pid, seconds) in enumerate(sorted(used.items(), key=lambda kv: -kv[1])[:top]):
        row = {"pid": pid, "title": _title(pid), "cores": round(seconds / wall_s, 3)}
        if rank < threads_of:
            spent = []
            for (p, tid), (comm, sec) in after.threads.items():
                if p == pid:
                    was = before.threads.get((p, tid), (comm, 0.0))[1]
                    spent.append([comm, tid, round((sec - was) / wall_s, 3)])
            row["threads"] = sorted(spent, key=lambda t: -t[2])[:6]
        rows.append(row)
    return rows
