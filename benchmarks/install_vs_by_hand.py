"""`egpu-setup install --root IMAGE` against the same work done by hand, phase by phase.

Two copies of one bootable Debian 12 image base (tests/helpers/image.py: the debootstrap root
with a kernel and its headers, copied with `cp -a --reflink=auto`), the same cached .debs seeded
into each (the driver's fetched once beforehand, so both start with the same cache), the same
torch wheels from one PEP 503 index on 127.0.0.1 (tests/helpers/pypi_index.py). One copy gets

    egpu-setup install --profile LAB.yaml --index-url LOCAL --root A --yes

the other what a person types for the same result, each command entered as egpu-setup enters an
image (host/image_root.py): the components drop-in and `apt-get update`, `apt-get install
--download-only` then `apt-get install` of the same packages (dpkg, DKMS building the NVIDIA
module for the image's kernel, the initramfs), `python3 -m venv`, `pip download` then `pip
install --no-index` of the same requirement, the same files and links copied in (the plan's
own, from `install --dry-run --json`), and `import torch` with one matmul.

Both sides run under `strace -f -ttt --seccomp-bpf -e trace=execve` (the same small cost
each): when each process started and ended, by program. That cuts both sides' apt-get installs
the same way: until apt's first dpkg run (one with --status-fd) is apt's own work (resolving,
fetching: "apt download"), then the update-initramfs processes, dkms (less the initramfs it
asks for), and the rest is dpkg's. (Not
apt's output lines: dpkg's maintainer scripts run under debconf, whose output reaches the pipe
in bursts, DKMS's twenty minutes of compiling as one.) egpu-setup's other phases come from its
own journal (each step's begin and end, /var/lib/egpu-setup/journal.jsonl in the image), "plan"
being the time before its run-begin. What egpu-setup does that the floor does not (egpu-setup
itself into the image, the apt simulation that records the packages before dpkg starts, the
journal, the seal) is its own phase, "doing more". The trace also counts the dpkg, apt,
update-initramfs and dkms processes each side started: work done twice shows there. Rounds are
interleaved (the order rotates).

With --loaded the same rounds run again under a steady synthetic load (one busy loop per core,
started by the benchmark, `_bench.steady_load`), both sides under the same load, and the ratio
is printed idle and loaded: on a shared machine whose own load comes and goes, the loaded ratio
is the one whose two sides saw the same machine.

egpu-setup's driver apt step defers dpkg's triggers to one `dpkg --configure --pending` after
its files (egpu_setup/plan/triggers.py): that step is split like an apt-get install (the
update-initramfs processes in it are "initramfs", the rest "dpkg").

Goal: egpu-setup's wall time within 10% of the by-hand floor (ratio <= 1.10x), idle and loaded.

    python benchmarks/install_vs_by_hand.py [--rounds 1] [--loaded] [--keep DIR] [--smoke]

Needs root (debootstrap, namespaces), the mirror this machine's apt uses, about 8 GB free and
15-30 minutes per round on 2 cores. --smoke needs neither: the configuration part only
(`--only config`) into an empty directory against copying the same rendered files, which proves
the phase accounting runs and measures nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _bench as b

sys.path.insert(0, str(b.REPO / "tests"))

from egpu_setup.host.image_root import enter_argv, image_env
from helpers import image, kept_wheels, pypi_index

Plan = dict[str, Any]  # `install --dry-run --json`'s plan, as docs/design.md gives it
Step = dict[str, Any]  # one of its steps
GOAL = 1.10  # egpu-setup seconds / by-hand seconds
PHASES = (
    "plan", "apt download", "dpkg", "DKMS", "initramfs", "venv", "pip download", "pip install",
    "files", "verify", "doing more",
)  # fmt: skip
APT_DPKG = "dpkg (run by apt)"
# mkinitramfs is one initramfs built: update-initramfs starts it for each image it writes, and
# not when it only activates initramfs-tools' trigger from a maintainer script ("deferring
# update (trigger activated)", /usr/sbin/update-initramfs in initramfs-tools 0.142)
TRACED = (APT_DPKG, "dpkg", "dpkg-query", "dpkg-deb", "apt-get", "apt-cache", "update-initramfs",
          "mkinitramfs", "dkms")  # fmt: skip


@dataclass
class Side:
    """One side's phases (seconds) and the processes it started, by program name."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    execs: Counter[str] = field(default_factory=Counter)
    wall: float = 0.0

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds


@dataclass(frozen=True)
class Trace:
    """What an strace -f -ttt log says: each process's program, start and end (wall seconds)."""

    runs: tuple[tuple[str, float, float], ...]

    @classmethod
    def read(cls, path: Path) -> Trace:
        started: dict[str, tuple[str, float]] = {}
        runs = []
        for line in path.read_text(errors="replace").splitlines() if path.exists() else ():
            # strace pads the pid to five columns ("4843  1796665506.19 ..."): one space or more
            m = re.match(r"(\d+) +(\d+\.\d+) (.*)$", line)
            if not m:
                continue
            pid, stamp, rest = m.group(1), float(m.group(2)), m.group(3)
            ran = re.match(r'execve\("([^"]+)".* = 0$', rest)
            if ran:
                if pid in started:  # a process that execs again (sh -> update-initramfs)
                    runs.append((*started[pid], stamp))
                name = os.path.basename(ran.group(1))
                # apt's own dpkg runs (unpack, configure) pass --status-fd; its queries do not
                started[pid] = (APT_DPKG if '"--status-fd"' in rest else name, stamp)
            elif rest.startswith(("+++ exited", "+++ killed")) and pid in started:
                runs.append((*started.pop(pid), stamp))
        return cls(tuple(runs))

    def execs(self) -> Counter[str]:
        return Counter(name for name, _, _ in self.runs)

    def busy(self, program: str, start: float, end: float) -> list[tuple[float, float]]:
        """The merged spans within [start, end] while some `program` process ran."""
        spans = sorted(
            (max(lo, start), min(hi, end)) for name, lo, hi in self.runs if name == program
        )
        merged: list[list[float]] = []
        for lo, hi in spans:
            if lo >= hi:
                continue
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        return [(lo, hi) for lo, hi in merged]


def _length(spans: Sequence[tuple[float, float]]) -> float:
    return sum(hi - lo for lo, hi in spans)


def _minus(spans: Sequence[tuple[float, float]], cut: Sequence[tuple[float, float]]) -> float:
    """Seconds of `spans` outside `cut` (both merged and sorted)."""
    overlap = sum(max(0.0, min(hi, d) - max(lo, c)) for lo, hi in spans for c, d in cut)
    return _length(spans) - overlap


def split_apt(trace: Trace, start: float, end: float, side: Side) -> None:
    """An apt-get install's [start, end] (wall seconds) by what ran: until apt's first dpkg is apt
    (resolving, fetching: "apt download"); then update-initramfs, dkms (less the initramfs it
    asks for) and the rest, dpkg's (unpack, configure, maintainer scripts)."""
    dpkg = [a for n, a, _ in trace.runs if n == APT_DPKG and start <= a <= end]
    first = min(dpkg, default=end)
    side.add("apt download", first - start)
    initramfs = trace.busy("update-initramfs", first, end)
    dkms = _minus(trace.busy("dkms", first, end), initramfs)
    side.add("initramfs", _length(initramfs))
    side.add("DKMS", dkms)
    side.add("dpkg", (end - first) - _length(initramfs) - dkms)


def strace(out: Path) -> list[str]:
    # -q, not -qq: the "+++ exited" lines say when each process ended
    return ["strace", "-f", "-q", "-ttt", "--seccomp-bpf", "-e", "trace=execve",
            "-e", "signal=none", "-o", str(out), "--"]  # fmt: skip


def journal_steps(journal: Path) -> tuple[float, list[tuple[str, str, float, float]]]:
    """(run-begin wall time, [(kind, description, begin, end)]) of the last run in a journal."""
    events = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    runs = [e for e in events if e["event"] == "run-begin"]
    if not runs:
        sys.exit(f"{journal}: no run-begin: egpu-setup did not execute a plan")
    run = runs[-1]
    begun: dict[int, float] = {}
    steps = []
    for e in events:
        if e.get("run") != run["run"]:
            continue
        if e["event"] == "step-begin":
            begun[e["step"]] = e["time"]
        elif e["event"] == "step-done":
            i = e["step"]
            steps.append((e.get("kind", ""), run["steps"][i], begun[i], e["time"]))
    kinds = {e["step"]: e["kind"] for e in events if e.get("run") == run["run"] and "kind" in e}
    return run["time"], [(kinds.get(i, k), d, s, t) for i, (k, d, s, t) in enumerate(steps)]


STEP_PHASE = {
    "apt-repository": "apt download",
    "pip-install": "pip install",
    "write-file": "files",
    "enable-unit": "files",
    "create-link": "files",
}


def egpu_side(argv: Sequence[str], root: Path, env: dict[str, str], log: Path) -> Side:
    """egpu-setup's run, cut into phases by its journal and, inside apt, by its processes."""
    side = Side()
    wall0 = time.time()
    ran = image.run_logged([*strace(log.with_suffix(".trace")), *argv], env=env, timeout=7200,
                           log=log, check=False)  # fmt: skip
    trace = Trace.read(log.with_suffix(".trace"))
    if ran.rc not in (0, 3):  # 3: done, the image's driver needs its first boot
        sys.exit(f"egpu-setup install: exit {ran.rc}\n{ran.out[-3000:]}")
    total = time.time() - wall0
    side.wall = total
    begin, steps = journal_steps(root / "var/lib/egpu-setup/journal.jsonl")
    side.add("plan", begin - wall0)
    accounted = begin - wall0
    for kind, what, start, end in steps:
        if kind == "apt-install":
            # before the real apt-get (the last one the step starts): `apt-get -s`, which
            # records what is coming before dpkg starts (execute/apt.py), and the manifest
            real = max((a for n, a, _ in trace.runs if n == "apt-get" and start <= a <= end),
                       default=start)  # fmt: skip
            side.add("doing more", real - start)
            split_apt(trace, real, end, side)
        elif kind == "run-command" and "dpkg --configure --pending" in what:
            # the triggers the driver's apt step deferred: the initramfs build among them
            initramfs = trace.busy("update-initramfs", start, end)
            side.add("initramfs", _length(initramfs))
            side.add("dpkg", end - start - _length(initramfs))
        elif kind == "run-command" and "initramfs" in what:
            side.add("initramfs", end - start)
        elif kind == "pip-install":
            # uv resolves, downloads and installs in one command; its venv is made first
            side.add("pip install", end - start)
        else:
            side.add(STEP_PHASE.get(kind, "doing more"), end - start)
        accounted += end - start
    side.add("doing more", total - accounted)  # the journal's own writes, the seal, the report
    side.execs = trace.execs()
    return side


def by_hand_side(
    root: Path, plan: Plan, rendered: Path, index_url: str, log: Path, trace_dir: Path
) -> Side:
    """The same packages, requirement and files, typed by a person, each command timed."""
    side = Side()
    started = time.monotonic()
    n = 0

    def run(phase: str | None, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        nonlocal n
        n += 1
        trace = trace_dir / f"{n}.trace"
        full = [*strace(trace), *enter_argv(root, argv)]
        t0 = time.time()
        image.run_logged(full, env=image_env(env, False), timeout=7200, log=log, what=argv)
        if phase is None:
            split_apt(Trace.read(trace), t0, time.time(), side)
        else:
            side.add(phase, time.time() - t0)

    steps = plan["steps"]
    apt_env = dict(image.APT_ENV)
    for s in steps:
        if s["kind"] == "apt-repository":
            t0 = time.monotonic()
            (root / s["sources_path"].lstrip("/")).write_text(s["content"])
            side.add("apt download", time.monotonic() - t0)
    installs = [s for s in steps if s["kind"] == "apt-install"]
    if installs:
        keep = ["-o", "APT::Keep-Downloaded-Packages=true"]
        with image.locked_debs() as cache:
            image.seed_debs(root, cache)
            try:
                run("apt download", ["apt-get", "update"], apt_env)
                for s in installs:
                    what = [*keep, "install", *no_recommends(s), *s["packages"]]
                    run(None, ["apt-get", "-y", *what, "--download-only"], apt_env)
                    run(None, ["apt-get", "-y", *what], apt_env)
            finally:
                image.harvest_debs(root, cache)
    pip = [s for s in steps if s["kind"] == "pip-install"]
    for s in pip:
        venv, reqs = s["venv"], s["requirements"]
        run("venv", ["python3", "-m", "venv", venv])
        no_cache = {"PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        run("pip download", [f"{venv}/bin/pip", "download", "-q", "-d", "/root/wheels",
                             "--index-url", index_url, *reqs], no_cache)  # fmt: skip
        run("pip install", [f"{venv}/bin/pip", "install", "-q", "--no-index", "--find-links",
                            "/root/wheels", *reqs], no_cache)  # fmt: skip
    t0 = time.monotonic()
    subprocess.run(["cp", "-a", f"{rendered}/.", str(root)], check=True)
    side.add("files", time.monotonic() - t0)
    if pip:
        venv = pip[0]["venv"]
        matmul = "import torch; x = torch.randn(256, 256); print(float((x @ x).sum()))"
        run("verify", [f"{venv}/bin/python", "-c", matmul])
    side.wall = time.monotonic() - started
    for trace in trace_dir.glob("*.trace"):
        side.execs += Trace.read(trace).execs()
    return side


def no_recommends(step: Step) -> list[str]:
    return ["--no-install-recommends"] if step.get("no_install_recommends") else []


# --- smoke: the configuration part only, no image ------------------------------------------


def smoke_round(tmp: Path, profile: str, n: int) -> tuple[Side, Side]:
    env = {**os.environ, "EGPU_SETUP_STATE_DIR": str(tmp / f"state{n}")}
    ours, hand = tmp / f"ours{n}", tmp / f"hand{n}"
    (ours / "etc").mkdir(parents=True)
    (hand / "etc").mkdir(parents=True)
    argv = [*b.tool(), "install", "--profile", profile, "--root", str(ours), "--only", "config",
            "--yes"]  # fmt: skip
    wall0 = time.time()
    seconds, done = b.run(argv, env)
    if done.returncode not in (0, 3):
        sys.exit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    side = Side(wall=seconds)
    begin, steps = journal_steps(tmp / f"state{n}" / "journal.jsonl")
    side.add("plan", begin - wall0)
    for kind, _what, start, end in steps:
        side.add(STEP_PHASE.get(kind, "doing more"), end - start)
    side.add("doing more", seconds - sum(side.seconds.values()))
    rendered = tmp / "rendered"
    t0 = time.monotonic()
    subprocess.run(["cp", "-a", f"{rendered}/.", str(hand)], check=True)
    copied = time.monotonic() - t0
    return side, Side(seconds={**dict.fromkeys(PHASES, 0.0), "files": copied}, wall=copied)


def materialize(plan: Plan, out: Path) -> Path:
    """The plan's files and links in a tree at their paths under `out`: what a person copies in."""
    for step in plan["steps"]:
        if step["kind"] == "write-file":
            dest = out / step["path"].lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(step["content"])
            dest.chmod(step["mode"])
        links = [(link, step["unit_path"]) for link in step.get("links", ())]
        if step["kind"] == "create-link":
            links.append((step["path"], step["target"]))
        for link, target in links if step["kind"] in ("enable-unit", "create-link") else ():
            dest = out / link.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(target)
    return out


def plan_of(argv: Sequence[str], env: dict[str, str]) -> Plan:
    """`install ... --dry-run --json`: the steps the run will take."""
    _, dry = b.run([*argv, "--dry-run", "--json"], env)
    if dry.returncode not in (0, 3):
        sys.exit(f"install --dry-run: exit {dry.returncode}\n{dry.stderr[-3000:]}")
    plan: Plan = json.loads(dry.stdout)
    return plan


# --- the report ----------------------------------------------------------------------------


def print_phases(ours: list[Side], hand: list[Side]) -> tuple[float, float]:
    med = b.median
    print(f"\n{'phase':<14} {'egpu-setup s':>13} {'by hand s':>10} {'ratio':>7}")
    for phase in PHASES:
        o = med([s.seconds[phase] for s in ours])
        h = med([s.seconds[phase] for s in hand])
        if o == 0 and h == 0:
            continue
        ratio = f"{o / h:6.2f}x" if h > 0.005 else "      -"
        print(f"{phase:<14} {o:13.1f} {h:10.1f} {ratio}")
    o_all, h_all = med([s.wall for s in ours]), med([s.wall for s in hand])
    print(f"{'total':<14} {o_all:13.1f} {h_all:10.1f} {o_all / h_all:6.2f}x")
    print(f"\n{'processes started':<18} {'egpu-setup':>10} {'by hand':>8}")
    for prog in TRACED:
        o_n, h_n = ours[-1].execs[prog], hand[-1].execs[prog]
        if o_n or h_n:
            print(f"{prog:<18} {o_n:>10} {h_n:>8}")
    print(f"{'(all)':<18} {sum(ours[-1].execs.values()):>10} {sum(hand[-1].execs.values()):>8}")
    return o_all, h_all


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--loaded", action="store_true", help="the rounds again under one busy loop per core"
    )
    ap.add_argument("--keep", metavar="DIR", help="keep logs and traces in DIR")
    ap.add_argument("--side", choices=("egpu-setup", "by hand"), help="run one side only")
    args = ap.parse_args()
    b.banner("install --root against apt-get + pip by hand, phase by phase")
    if not args.tool and args.side != "by hand":
        # the checkout's editable install keeps no wheels of itself: as the suite gives them
        # (tests/helpers/kept_wheels.py). Only where egpu-setup runs: rebuilt while another
        # install from this checkout is planned, the wheel no longer matches its plan's sha256
        cache = os.environ.get("EGPU_SETUP_TEST_CACHE")
        kept_wheels.keep(Path(cache) if cache else Path(tempfile.mkdtemp(prefix="egpu-kept-")))
    loads = (0, os.cpu_count() or 1) if args.loaded else (0,)
    results: dict[int, tuple[list[Side], list[Side]]] = {}
    with tempfile.TemporaryDirectory(prefix="egpu-byhand-") as tmp_s:
        tmp = Path(tmp_s)
        if args.smoke:
            profile = str(b.REPO / "profiles" / "rtx4090.yaml")
            (tmp / "empty/etc").mkdir(parents=True)
            argv = [*b.tool(), "install", "--profile", profile, "--only", "config", "--root"]
            materialize(plan_of([*argv, str(tmp / "empty")], dict(os.environ)), tmp / "rendered")
            for n, busy in enumerate(loads):
                with b.steady_load(busy):
                    o, h = smoke_round(tmp, profile, 2 * n)  # the first warms the page cache
                    o, h = smoke_round(tmp, profile, 2 * n + 1)
                results[busy] = ([o], [h])
        else:
            keep = Path(args.keep) if args.keep else None
            results = full(tmp, args.rounds, keep, args.side, loads)
    print(f"load average now: {b.load()} ({args.rounds if not args.smoke else 1} round(s))")
    goals = []
    for busy, (ours, hand) in results.items():
        if not (ours and hand):  # --side: this side's phases, to set beside the other's
            for side in ours or hand:
                print(json.dumps({"side": args.side, "busy loops": busy, "wall": side.wall,
                                  "seconds": side.seconds, "execs": dict(side.execs)}))  # fmt: skip
            continue
        print(f"\n-- {f'under {busy} busy loops' if busy else 'idle (no load of its own)'}")
        o_all, h_all = print_phases(ours, hand)
        ratio = o_all / h_all
        what = f"install --root vs by hand, {f'{busy} busy loops' if busy else 'idle'} (wall)"
        goals.append(b.Goal(what, f"{ratio:.2f}x", f"<= {GOAL:.2f}x", ratio <= GOAL,
                            f"egpu-setup {o_all:.1f} s, by hand {h_all:.1f} s"))  # fmt: skip
    return b.report(goals, args.smoke) if goals else 0


def full(
    tmp: Path, rounds: int, keep: Path | None, only: str | None, loads: Sequence[int]
) -> dict[int, tuple[list[Side], list[Side]]]:
    if os.geteuid() != 0:
        sys.exit("install --root into an image needs root (namespaces, chroot)")
    logs = keep or tmp
    logs.mkdir(parents=True, exist_ok=True)
    wheels = pypi_index.download_torch(pypi_index.cache_dir())
    profile = tmp / f"{image.LAB_PROFILE}.yaml"
    profile.write_text(image.LAB_PROFILE_YAML)
    base = image.build_base(tmp / "base", image.Phases(), log=logs / "base.log")
    env = {k: v for k, v in os.environ.items() if k != "EGPU_SETUP_STATE_DIR"}
    results: dict[int, tuple[list[Side], list[Side]]] = {}
    ours: list[Side] = []
    hand: list[Side] = []
    with pypi_index.LocalIndex(wheels) as idx:
        args = ["--profile", str(profile), "--index-url", idx.url, "--root"]
        plan = plan_of([*b.tool(), "install", *args, str(base.root)], env)
        rendered = materialize(plan, tmp / "rendered")
        prefetch(base.root, plan, logs / "prefetch.log")
        cases: dict[str, Callable[[], float]] = {}

        def ours_case() -> float:
            copy = fresh_copy(base.root, tmp / "ours")
            n = sum(len(o) for o, _ in results.values()) + len(ours)
            side = egpu_side([*b.tool(), "install", *args, str(copy), "--yes"], copy, env,
                             logs / f"ours{n}.log")  # fmt: skip
            ours.append(side)
            image.remove_image(copy)
            return side.wall

        def hand_case() -> float:
            copy = fresh_copy(base.root, tmp / "hand")
            n = sum(len(h) for _, h in results.values()) + len(hand)
            traces = logs / f"hand{n}.traces"
            traces.mkdir(exist_ok=True)
            side = by_hand_side(copy, plan, rendered, idx.url, logs / f"hand{n}.log", traces)
            hand.append(side)
            image.remove_image(copy)
            return side.wall

        cases = {"egpu-setup": ours_case, "by hand": hand_case}
        if only:  # one side alone (two processes side by side when the time is short)
            cases = {only: cases[only]}
        for busy in loads:
            with b.steady_load(busy):
                b.side_by_side(cases, rounds, warm=False)
            results[busy] = (ours[:], hand[:])
            ours.clear()
            hand.clear()
    image.remove_image(base.root)
    return results


def fresh_copy(base: Path, dest: Path) -> Path:
    if dest.exists():
        image.remove_image(dest)
    subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(dest)], check=True)
    return dest


def prefetch(base: Path, plan: Plan, log: Path) -> None:
    """The plan's .debs into the shared cache once, so both sides start with the same cache."""
    scratch = fresh_copy(base, base.with_name("prefetch"))
    try:
        for s in plan["steps"]:
            if s["kind"] == "apt-repository":
                (scratch / s["sources_path"].lstrip("/")).write_text(s["content"])
        packages = [p for s in plan["steps"] if s["kind"] == "apt-install" for p in s["packages"]]
        if packages:
            image.apt(scratch, ["update"], log=log)
            image.apt(scratch, ["install", "--download-only", *packages], log=log)
    finally:
        image.remove_image(scratch)


if __name__ == "__main__":
    sys.exit(main())
