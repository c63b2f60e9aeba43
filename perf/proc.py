"""What a perf run reads of processes from /proc and getrusage: a process's CPU seconds and
peak memory, this process's own CPU, the whole machine's busy CPU seconds, and a process's
children (to find the broker a run started)."""

from __future__ import annotations

import os
import resource
from pathlib import Path


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process, from /proc (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """A live process's peak resident memory (VmHWM) in MiB, from /proc (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        pass
    return 0.0


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_busy_s() -> float:
    """CPU seconds every process on the machine has used since boot, all cores together
    (/proc/stat: user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out
