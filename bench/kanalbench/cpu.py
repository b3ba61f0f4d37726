"""CPU time of the processes under test, read from ``/proc`` (Linux).

No Kanal import here: the client worker reads these too, to sample the broker, relay and gateway
exactly around its own produce phase.
"""

from __future__ import annotations

import os
from pathlib import Path


def stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (state, parent pid, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process (all its threads) used so far."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds(pid: int) -> float:
    """User + system CPU time the live child processes of ``pid`` (a gateway's helpers) used so far."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(stat_fields(entry.name)[1]) == pid:
                    total += cpu_seconds(int(entry.name))
            except OSError:  # it exited meanwhile
                continue
    return total


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and every process it started, live or exited: socat forks one process per
    connection, and a child that exited and was reaped lives on in its parent's cutime/cstime."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(stat_fields(entry.name)[1])
            except OSError:
                continue
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(child for child, parent in parents.items() if parent == current)
    total = 0
    for member in tree:
        try:
            fields = stat_fields(member)
        except OSError:  # exited meanwhile: its parent's cutime holds it once reaped
            continue
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def machine_idle_seconds() -> float:
    """Idle + iowait time of all the machine's cores so far. Busy time is better taken as elapsed
    time x cores less this than from the busy fields: with a tickless kernel those are sampled at
    ticks and miss the short bursts of a process woken thousands of times a second, while idle time
    is measured exactly."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return (int(fields[3]) + int(fields[4])) / os.sysconf("SC_CLK_TCK")
