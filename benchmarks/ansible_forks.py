"""The Ansible play (ansible/site.yml) over N laptops: the controller's wall and CPU time per host
with Ansible's default forks (5) against the forks ansible/ansible.cfg sets.

Every host is this machine (`connection: local`) with the role's stand-in for a laptop with an
eGPU (tests/helpers/ansible_play.py, tool_standin.py: the real egpu-setup runs `install --only
config` into a folder of its own), the canary and the batches of site.yml as they ship, verify
off. The CPU time is that of ansible-playbook and everything it started (getrusage of the
children), so it includes the stand-in hosts' own egpu-setup runs: an upper bound on what the
controller spends per host. Runs are interleaved (the order rotates).

    python benchmarks/ansible_forks.py [--hosts 30] [--rounds 1] [--smoke]
"""

from __future__ import annotations

import configparser
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


def one_run(base: Path, hosts: int, forks: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of ansible-playbook and its children) for one play."""
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
    return wall, cpu


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--hosts", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    hosts, rounds = (3, 1) if args.smoke else (args.hosts, args.rounds)
    b.banner(f"ansible/site.yml over {hosts} stand-in laptops: forks 5 against {FORKS}")
    cpu: dict[int, list[float]] = {5: [], FORKS: []}
    with tempfile.TemporaryDirectory(prefix="egpu-ansible-bench-") as base_s:
        base = Path(base_s)
        os.chmod(base, 0o755)

        def case(forks: int) -> Callable[[], float]:
            def run() -> float:
                wall, spent = one_run(base, hosts, forks)
                cpu[forks].append(spent)
                return wall

            return run

        walls = b.side_by_side({5: case(5), FORKS: case(FORKS)}, rounds, warm=False)
    print(f"\n{'forks':>5} {'wall s':>8} {'CPU s':>7} {'CPU s/host':>11}  ({rounds} round(s))")
    for forks, t in walls.items():
        c = b.median(cpu[forks])
        print(f"{forks:>5} {b.median(t):8.1f} {c:7.1f} {c / hosts:11.2f}")
    ratio = b.median(walls[5]) / b.median(walls[FORKS])
    print(f"forks 5 / forks {FORKS}: {ratio:.2f}x the wall time")
    return b.report([], args.smoke)


if __name__ == "__main__":
    sys.exit(main())
