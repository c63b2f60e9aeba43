"""`perf run --profile DIR`: py-spy on every worker while a run's pods flow, kept as collapsed
stacks and flame graphs, and a pod's cost split by stage.

Flow: once start-up is over, `Profiler` attaches `py-spy record --nonblocking --format raw` to
each worker process (by role); when the run's pods are decided it stops them (SIGINT, on which
py-spy writes its file) and, per role, keeps `<name>-<role>.txt.gz` (the collapsed stacks:
`frame;frame;... count` per line, which any flame graph tool reads; `read_collapsed`) and `<name>-<role>.svg` (a
flame graph drawn here from them). `stages` sorts each sample into the stage of the pipeline it
belongs to, by the innermost frame of the stack that a rule in `STAGES` names (intake and
decode, queue, cycle, claim encode, owner apply, changelog, decider, Binding, reports, replica
apply, ...), so that with the workers' CPU over the run it tells where each microsecond of a pod
goes (`per_pod_us`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import html
import re
import shutil
import signal
import sys
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# (stage, pattern on one frame "function (path/file.py:line)"), most specific first: a sample
# goes to the first rule that any frame of its stack matches, so a hold's table value built
# inside the owner's apply is "changelog", a report decoded by the scheduler "reports", a Pod
# decoded there "intake". What the codec takes across the stages is counted apart (`CODEC`).
STAGES: tuple[tuple[str, str], ...] = (
    ("gc", r"^GcPacer\.|^\(garbage collection\)"),
    ("changelog", r"^(VersionedState\.\w+|NodeState\.to_json|NodeState\._holds_json|HoldEntry\.plain"
                  r"|LedgerState\.to_json) \("),
    ("outputs", r"^(\w*Sink\.\w+|PartitionedOutbox\.\w+|deliver|stamp) \("),
    ("claims out", r"^(SchedulerService\.dispatch|stamped) \("),
    ("reports", r"^(SchedulerService\.on_state_changes|SchedulerCore\.apply_state_changes|feed_state_changes) \("),
    ("intake", r"^(intake|SchedulerService\.on_inputs|SchedulerCore\.add) \("),
    ("owner apply", r"^(OwnerCore|NodeOwner)\."),
    ("decider", r"^(DeciderCore|Decider)\."),
    ("warm pools", r"\(agents/sandbox/(pool|core|warm\w*)\.py"),
    ("cycle", r"^(SchedulerCore\.schedule|SchedulerService\.run) \("),
    ("adapter loop", r"\(agents/adapters/"),
    ("kafka client", r"\(aiokafka/"),
    ("faust", r"\((faust|mode)/"),
    ("event loop", r"\(asyncio/"),
)
# The codec's share, wherever it runs (a sample counts when any frame of its stack matches).
CODEC: tuple[tuple[str, str], ...] = (
    ("decode", r"^decode_(message|object|many) \(schemas/codec"),
    ("encode", r"^(encode_batch|encode|_default) \(schemas/codec"),
)
IDLE = re.compile(r"^(EpollSelector\.select|select) \(")


@dataclass
class Profile:
    """One worker's samples: collapsed stacks and their counts."""

    role: str
    stacks: Counter[str] = field(default_factory=Counter)

    @property
    def samples(self) -> int:
        return sum(self.stacks.values())


def read_collapsed(text: str, role: str = "") -> Profile:
    """Collapsed stacks (`a;b;c 12` per line) as py-spy's raw format writes them."""
    out = Profile(role)
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out.stacks[stack] += int(count)
    return out


def stage_of(stack: str, rules: Iterable[tuple[str, re.Pattern[str]]]) -> str:
    """The stage of one sample: that of the first rule any frame of it matches; "idle" for a
    loop waiting on its selector; "other" when nothing matches."""
    frames = stack.split(";")
    if frames and IDLE.search(frames[-1]):
        return "idle"
    for stage, pattern in rules:
        if any(pattern.search(frame) for frame in frames):
            return stage
    return "other"


def stages(profile: Profile, rules: Iterable[tuple[str, str]] = STAGES) -> dict[str, int]:
    """Samples per stage, largest first."""
    compiled = [(s, re.compile(p)) for s, p in rules]
    counts: Counter[str] = Counter()
    for stack, n in profile.stacks.items():
        counts[stage_of(stack, compiled)] += n
    return dict(counts.most_common())


def codec(profile: Profile, rules: Iterable[tuple[str, str]] = CODEC) -> dict[str, int]:
    """Samples in which the codec decodes or encodes, whatever the stage."""
    compiled = [(s, re.compile(p)) for s, p in rules]
    counts: Counter[str] = Counter({s: 0 for s, _ in compiled})
    for stack, n in profile.stacks.items():
        frames = stack.split(";")
        for op, pattern in compiled:
            if any(pattern.search(f) for f in frames):
                counts[op] += n
    return dict(counts)


def per_pod_us(by_stage: Mapping[str, int], cpu_s: float, pods: int, busy: int = 0) -> dict[str, float]:
    """A worker's CPU per pod split by stage in proportion to its busy (non-idle) samples
    (`busy`: their count, when `by_stage` does not partition them)."""
    busy = busy or sum(n for s, n in by_stage.items() if s != "idle")
    if not busy or not pods:
        return {}
    return {s: round(cpu_s * n / busy / pods * 1e6, 1) for s, n in by_stage.items() if s != "idle"}


def flamegraph_svg(profile: Profile, title: str, width: int = 1600, row: int = 16) -> str:
    """A flame graph of the collapsed stacks: the root at the bottom, a frame's width its
    samples, hover text its name, samples and share. Frames under 0.05% are left out."""
    tree: dict[str, Any] = {"n": 0, "kids": {}}
    for stack, n in profile.stacks.items():
        node = tree
        node["n"] += n
        for frame in stack.split(";"):
            node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
            node["n"] += n
    total = max(tree["n"], 1)
    frames: list[tuple[float, int, float, str, int]] = []  # x, depth, width, name, samples

    def lay_out(node: dict[str, Any], x: float, depth: int) -> None:
        for name, kid in sorted(node["kids"].items()):
            w = kid["n"] / total * width
            if kid["n"] / total >= 0.0005:
                frames.append((x, depth, w, name, kid["n"]))
                lay_out(kid, x, depth + 1)
            x += w

    lay_out(tree, 0.0, 0)
    height = (max((f[1] for f in frames), default=0) + 2) * row + 24
    rects = []
    for x, depth, w, name, n in frames:
        y = height - (depth + 1) * row
        label = html.escape(f"{name} ({n} samples, {n / total:.2%})")
        text = html.escape(name.split(" (")[0])[: int(w / 7)] if w > 40 else ""
        hue = 20 + zlib.crc32(name.split(" (")[-1].split(":")[0].encode()) % 40  # by file, the same each run
        rects.append(f'<g><title>{label}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" '
                     f'fill="hsl({hue},80%,60%)"/><text x="{x + 2:.1f}" y="{y + row - 4}" font-size="11">{text}</text></g>')
    body = "\n".join(rects)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace">\n'
            f'<text x="4" y="16" font-size="13">{html.escape(title)} ({total} samples)</text>\n{body}\n</svg>\n')


class Profiler:
    """py-spy attached to processes by role for the length of an `async with`."""

    def __init__(self, out_dir: str | Path, name: str, pids: Mapping[str, int], rate: int = 97) -> None:
        self.out_dir, self.name, self.pids, self.rate = Path(out_dir), name, dict(pids), rate
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.profiles: dict[str, Profile] = {}

    def path(self, role: str, suffix: str) -> Path:
        return self.out_dir / f"{self.name}-{role}.{suffix}"

    async def __aenter__(self) -> Profiler:
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for role, pid in self.pids.items():
            self.procs[role] = await asyncio.create_subprocess_exec(
                spy, "record", "--pid", str(pid), "--rate", str(self.rate), "--nonblocking", "--format", "raw",
                "--output", str(self.path(role, "txt")),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
        for role, proc in self.procs.items():
            try:
                await asyncio.wait_for(proc.wait(), 60.0)
            except TimeoutError:
                proc.kill()
                continue
            raw = self.path(role, "txt")
            if raw.exists():
                text = raw.read_text()
                self.profiles[role] = read_collapsed(text, role)
                self.path(role, "txt.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
                raw.unlink()
                self.path(role, "svg").write_text(flamegraph_svg(self.profiles[role], f"{self.name}: {role}"))

    def figures(self, cpu_s: Mapping[str, float], pods: int) -> dict[str, Any]:
        """Per role: samples, samples by stage, and the role's CPU per pod by stage."""
        out: dict[str, Any] = {}
        for role, p in self.profiles.items():
            by_stage, by_op, cpu = stages(p), codec(p), cpu_s.get(role, 0.0)
            out[role] = {"samples": p.samples, "stages": by_stage, "codec": by_op,
                         "cpu_us_per_pod": per_pod_us(by_stage, cpu, pods),
                         "codec_us_per_pod": per_pod_us(by_op, cpu, pods, busy=p.samples - by_stage.get("idle", 0))}
        return out
