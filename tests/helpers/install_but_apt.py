"""`install` as the command runs it, but for its AptInstall steps: their argv comes back for the
test to give to apt's own simulation (`apt-get -s`, apt-get(8)). A real dpkg install of the
driver's ~400 packages takes ~35 s more (docs/sources.md, "Measured here"); tests that install
for real use small packages (tests/install/test_apt_kill.py).

Run as a child (`python install_but_apt.py OPTIONS-JSON`, OPTIONS-JSON the InstallOptions
fields), so a test can wrap it in `unshare -n`; prints {"steps", "result", "apt"} as JSON.
"""

from __future__ import annotations

import json
import sys

from egpu_setup.execute.executor import ExecOptions, execute
from egpu_setup.install.options import InstallOptions
from egpu_setup.install.pipeline import prepare
from egpu_setup.plan.steps import AptInstall, Plan
from egpu_setup.state.lock import RunLock


def main(options_json: str) -> None:
    run = prepare(InstallOptions(**json.loads(options_json)))
    apt = [s for s in run.plan.steps if isinstance(s, AptInstall)]
    rest = Plan(tuple(s for s in run.plan.steps if not isinstance(s, AptInstall)))
    with RunLock(run.paths.lock, run.paths.anchor):
        result = execute(rest, run.target, run.paths, ExecOptions(), progress=lambda _t: None)
    out = {
        "steps": [s.to_json() for s in run.plan.steps],
        "result": [s.to_json() for s in result.steps],
        "apt": [s.argv() for s in apt],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
