"""Bytes from the network and time for a lab: one bundle vs N plain installs (N = 1, 10, 30);
offline install uv vs pip.

Everything a laptop needs for torch 2.13.0 CPU (torch + its dependencies) is served by a loopback
PEP 503 index (tests/helpers/pypi_index.py) that counts the bytes it sends, so both scenarios are
measured the same way:

  bundle:  `egpu-setup bundle --only torch` once (torch via --index-url, dependencies via a pip
           configuration whose index is the same loopback server), then N offline installs
  plain:   N fresh venvs, each `pip install --no-cache-dir --index-url LOOP torch==2.13.0+cpu`

One plain install is measured (bytes and seconds; with no cache every laptop fetches the same
files) and N of them are that times N. The lab's time is then modelled from the measured figures:
the laptops install at once, so N plain installs take the longer of one laptop's install and
the bytes all of them fetch through the lab's internet link (--uplink-mbit); the bundle is
built once (its bytes through that link), copied to each laptop over the LAN (--lan-mbit), then
installed offline (uv) everywhere at once. No goal: figures only.

Then one offline install from the bundle with pip and with uv (fresh venv each, no cache, both
compiling bytecode as the installer does, `unshare -n` when we are root), timed side by side.
The bundle is built by the installed egpu-setup, started from an empty directory.

    python benchmarks/bundle_fetch.py [--targets 1,10,30] [--uplink-mbit 100] [--smoke]

--smoke serves a small pure-Python wheel named torch 2.13.0+cpu instead of the real one, for one
laptop: it proves the script runs, and measures nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _bench as b

REPO = b.REPO
sys.path.insert(0, str(REPO / "tests"))

from egpu_setup.execute.pip import SOURCE_ENV
from helpers import pypi_index as _pypi_index

TORCH = "torch==2.13.0+cpu"


def served_bytes(idx: _pypi_index.LocalIndex, since: int) -> int:
    total = 0
    for path in idx.requests[since:]:
        local = idx.dir / path.lstrip("/").split("#")[0].replace("%2B", "+")
        if local.is_dir():
            local = local / "index.html"
        if local.exists():
            total += local.stat().st_size
    return total


# This machine's own pip/uv source variables (PIP_FIND_LINKS=/opt/wheels, say) would let an
# install take torch from somewhere other than the loopback index: every child runs without them.
CLEAN = {k: v for k, v in os.environ.items() if k not in SOURCE_ENV}


def run(argv: list[str], env: dict[str, str] | None = None) -> float:
    t = time.monotonic()
    done = subprocess.run(
        argv, env={**CLEAN, **(env or {})}, capture_output=True, text=True, cwd=b.NEUTRAL
    )
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return time.monotonic() - t


def main() -> int:
    ap = b.parser(__doc__)
    ap.add_argument("--targets", default="1,10,30", help="lab sizes (default 1,10,30)")
    ap.add_argument("--uplink-mbit", type=float, default=100.0, help="the lab's internet link")
    ap.add_argument("--lan-mbit", type=float, default=1000.0, help="admin machine to laptops")
    args = ap.parse_args()
    uv = b.which("uv")
    if uv is None:
        sys.exit("uv is not on PATH (pip install uv)")
    b.banner("network bytes for a lab: one bundle vs N installs")
    stand_in = Path(tempfile.mkdtemp(prefix="egpu-bench-wheels-"))
    sizes = [1] if args.smoke else [int(n) for n in args.targets.split(",")]
    if args.smoke:
        wheels = [_pypi_index.build_wheel(stand_in, "torch", "2.13.0+cpu")]
    else:
        wheels = _pypi_index.download_torch(_pypi_index.cache_dir())
    offline = ["unshare", "-n", "--"] if os.geteuid() == 0 and shutil.which("unshare") else []
    with (
        tempfile.TemporaryDirectory(prefix="egpu-bundle-bench-") as tmp_s,
        _pypi_index.LocalIndex(wheels) as idx,
    ):
        tmp = Path(tmp_s)
        conf = tmp / "pip.conf"
        conf.write_text(f"[global]\nindex-url = {idx.url}\n")
        profile = tmp / "lab-cpu.yaml"
        profile.write_text(
            (REPO / "profiles/rtx4090.yaml")
            .read_text()
            .replace("extras: [torchvision]", "extras: []")
        )
        # 1. the bundle: one download for the whole lab
        start = len(idx.requests)
        t_bundle = run(
            [*b.tool(), "bundle", "--profile", str(profile),
             "--out", str(tmp / "b"), "--cuda", "cpu", "--torch", "2.13.0", "--python", "3.11",
             "--index-url", idx.url, "--only", "torch"],
            env={"PIP_CONFIG_FILE": str(conf), "PIP_NO_CACHE_DIR": "1"},
        )  # fmt: skip
        bundle_bytes = served_bytes(idx, start)
        # 2. one plain online install (every laptop's is the same, with no cache)
        start = len(idx.requests)
        # pip, not uv, here: uv asks for wheel metadata with Range requests, which
        # http.server answers with the whole file, so its byte count would be inflated
        venv = tmp / "plain"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        t_plain = run(
            [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-cache-dir",
             "--no-compile", "--index-url", idx.url, TORCH],
            env={"PIP_CONFIG_FILE": os.devnull},
        )  # fmt: skip
        shutil.rmtree(venv)
        plain_bytes = served_bytes(idx, start)
        # 3. offline installs from the bundle, pip vs uv
        out = tmp / "b"
        req = next(out.glob("requirements-*.txt"))
        pool = out / "wheels/py3.11"
        offline_args = ["--no-index", "--find-links", str(pool), "--require-hashes", "-r", str(req)]
        start = len(idx.requests)
        subprocess.run([sys.executable, "-m", "venv", str(tmp / "vp")], check=True)
        t_pip = run(
            [*offline, str(tmp / "vp/bin/python"), "-m", "pip", "install", "-q",
             "--no-cache-dir", *offline_args],
            env={"PIP_CONFIG_FILE": os.devnull},
        )  # fmt: skip
        subprocess.run(["sync"], check=True)
        subprocess.run([sys.executable, "-m", "venv", str(tmp / "vu")], check=True)
        t_uv = run(
            [*offline, uv, "pip", "install", "-q", "--no-config", "--offline", "--no-cache",
             "--compile-bytecode", "--python", str(tmp / "vu/bin/python"), *offline_args]
        )  # fmt: skip
        subprocess.run(["sync"], check=True)
        assert served_bytes(idx, start) == 0, "an offline install reached the index"

    print("torch 2.13.0 CPU + dependencies, loopback index; one laptop measured, N modelled")
    print(f"  one plain install    {plain_bytes / 1e6:9.1f} MB  {t_plain:6.1f} s (pip)")
    print(f"  the bundle, once     {bundle_bytes / 1e6:9.1f} MB  {t_bundle:6.1f} s to build")
    up, lan = args.uplink_mbit * 1e6 / 8, args.lan_mbit * 1e6 / 8
    print(f"\n{'laptops':>7} {'plain MB':>10} {'bundle MB':>10} {'ratio':>7} "
          f"{'plain s':>8} {'bundle s':>9}  (uplink {args.uplink_mbit:g}, LAN {args.lan_mbit:g} "
          "Mbit/s)")  # fmt: skip
    for n in sizes:
        plain_s = max(t_plain, n * plain_bytes / up)
        # built once (its download through the uplink), copied to each laptop over the LAN
        # one after another, then every laptop installs offline at once
        bundle_s = t_bundle + bundle_bytes / up + n * bundle_bytes / lan + t_uv
        ratio = n * plain_bytes / max(bundle_bytes, 1)
        print(f"{n:>7} {n * plain_bytes / 1e6:10.1f} {bundle_bytes / 1e6:10.1f} "
              f"{ratio:6.2f}x {plain_s:8.1f} {bundle_s:9.1f}")  # fmt: skip
    where = "inside unshare -n" if offline else "network not isolated (not root)"
    print(f"offline install from the bundle ({where}, fresh venv, no cache):")
    print(f"  pip {t_pip:6.1f} s   uv {t_uv:6.1f} s   pip/uv {t_pip / t_uv:4.2f}x")
    shutil.rmtree(stand_in)
    if args.smoke:
        print("(--smoke: a stand-in wheel and one laptop; the figures above mean nothing)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
