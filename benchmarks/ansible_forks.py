"""The Ansible play (ansible/site.yml) over N laptops (N = 1, 10, 30): the wall time and the
controller's CPU time per host with Ansible's default forks (5) against ansible/ansible.cfg's.

Every host is this machine (`connection: local`) with the role's stand-in for a laptop with an
eGPU (tests/helpers/ansible_play.py, tool_standin.py: the real egpu-setup runs `install --only
config` into a folder of its own), the canary and the batches of site.yml as they ship, verify
off. The CPU time is that of ansible-playbook and everything it started (getrusage of the
children), so it includes the stand-in hosts' own egpu-setup runs: an upper bound on what the
controller spends per host. Each stand-in logs the CPU seconds it and the real tool behind it
spent (tests/helpers/tool_standin.py), so the controller's own share is printed beside it: the
total less the hosts'. Runs are interleaved (the order rotates).

    python benchmarks/ansible_forks.py [--hosts 1,10,30] [--rounds 1] [--smoke]
"""

from __future__ import annotations

import configparser
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _bench as b

sys.path.insert(0, str(b.REPO / "tests"))

from helpers import ansible_play as play

SHIPPED = configparser.ConfigParser()
SHIPPED.read(play.ANSIBLE / "ansible.cfg")
FORKS = SHIPPED.getint("defaults", "forks", fallback=5)


def one_run(base: Path, hosts: int, forks: int) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of ansible-playbook and its children, CPU seconds of the
    stand-in hosts among them) for one play."""
    tmp = Path(tempfile.mkdtemp(dir=base))
    inventory = {
        f"laptop{i:02d}": {
            **play.standin_host(tmp, f"laptop{i:02d}", reboots_needed=0),
            "egpu_setup_verify": False,
            "ansible_become": False,  # site.yml becomes root; these hosts are already this user
        }
        for i in range(hosts)
    }
    env = {**play.ansible_env(tmp), "ANSIBLE_FORKS": str(forks)}
    argv = ["ansible-playbook", "-i", str(play.write_inventory(tmp, inventory)),
            str(play.PLAYBOOK)]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"ansible-playbook: exit {done.returncode}\n{done.stdout[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    calls = [json.loads(line) for name in inventory
             for line in (tmp / name / "calls.jsonl").read_text().splitlines()]  # fmt: skip
    return wall, cpu, sum(c["cpu"] for c in calls)


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--hosts", default="1,10,30", help="the numbers of laptops, comma-separated")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    counts, rounds = (
        ((1,), 1) if args.smoke else (tuple(map(int, args.hosts.split(","))), args.rounds)
    )
    b.banner(f"ansible/site.yml over {counts} stand-in laptops: forks 5 against {FORKS}")
    print(f"\n{'hosts':>5} {'forks':>5} {'wall s':>8} {'CPU s':>7} {'hosts CPU s':>11} "
          f"{'controller CPU s/host':>22}  ({rounds} round(s))")  # fmt: skip
    for hosts in counts:
        measure(hosts, rounds)
    return b.report([], args.smoke)


def measure(hosts: int, rounds: int) -> None:
    cpu: dict[int, list[tuple[float, float]]] = {5: [], FORKS: []}
    with tempfile.TemporaryDirectory(prefix="egpu-ansible-bench-") as base_s:
        base = Path(base_s)
        os.chmod(base, 0o755)

        def case(forks: int) -> Callable[[], float]:
            def run() -> float:
                wall, spent, on_hosts = one_run(base, hosts, forks)
                cpu[forks].append((spent, on_hosts))
                return wall

            return run

        walls = b.side_by_side({5: case(5), FORKS: case(FORKS)}, rounds, warm=False)
    for forks, t in walls.items():
        total = b.median([c for c, _ in cpu[forks]])
        on_hosts = b.median([h for _, h in cpu[forks]])
        print(f"{hosts:>5} {forks:>5} {b.median(t):8.1f} {total:7.1f} {on_hosts:11.1f} "
              f"{(total - on_hosts) / hosts:22.2f}")  # fmt: skip
    ratio = b.median(walls[5]) / b.median(walls[FORKS])
    print(f"{hosts:>5} hosts: forks 5 / forks {FORKS}: {ratio:.2f}x the wall time")


if __name__ == "__main__":
    sys.exit(main())
