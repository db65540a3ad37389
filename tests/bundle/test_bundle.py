"""Offline bundles, end to end: built from a loopback index + this machine's pip configuration and
the Debian archive, then installed inside `unshare -n` (no network at all) into a fresh venv and a
debootstrap root.

The slow tests share one bundle (module fixture): torch 2.13.0 CPU for Python 3.11 on this
machine's distribution. The torch wheel is served ONLY by the loopback index, so the request log
proves where it came from; its dependencies come from this machine's pip configuration.
The driver part is the real resolution (nvidia-driver and friends, ~400 .debs); the install into
the root runs for real but for its apt-get install, whose exact argv the test gives to `apt-get
-s` in the root, still with no network, against the bundle's repository alone (which proves the
repository is complete) - a real dpkg install of it takes ~35 s more and was measured once
(docs/sources.md, "Measured here"; helpers/install_but_apt.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from egpu_setup.bundle import format as bundle_format
from egpu_setup.bundle import targets as bundle_targets
from egpu_setup.bundle import wheels as bundle_wheels
from egpu_setup.errors import EgpuSetupError, UsageError
from helpers import debroot as _debroot
from helpers import pypi_index as _pypi_index

REPO = Path(__file__).resolve().parents[2]
HOST_FIXTURES = REPO / "tests" / "fixtures" / "hosts"
Z64 = "0" * 64  # a well-formed pin, for the cases refused before it is compared


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, wrap: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*wrap, sys.executable, "-m", "egpu_setup", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _profile(tmp: Path) -> Path:
    """rtx4090 without torchvision: the loopback index serves torch alone."""
    text = (REPO / "profiles" / "rtx4090.yaml").read_text()
    text = text.replace("extras: [torchvision]", "extras: []").replace(
        "name: rtx4090", "name: lab-cpu"
    )
    path = tmp / "lab-cpu.yaml"
    path.write_text(text)
    return path


def _host_distro() -> str:
    from egpu_setup.host.machine import LiveHost

    return bundle_targets.host_distro(LiveHost())


def _can_bundle_debs() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("debootstrap") is None or shutil.which("dpkg-scanpackages") is None:
        return "needs debootstrap and dpkg-scanpackages"
    from egpu_setup.compat.matrix import load_matrix

    dist_id, _, version = _host_distro().partition("-")
    if load_matrix().distro(dist_id, version) is None:
        return "host distribution has no driver data"
    return None


def _cache_env(tmp: Path) -> dict[str, str]:
    """Share the debootstrap roots of tests/helpers/debroot.py when its layout allows."""
    d = _debroot.cache_dir()
    return {"EGPU_SETUP_CACHE": str(d.parent if d.name == "debroot" else tmp / "cache")}


# -- pure parts -----------------------------------------------------------------------------------


def test_platform_tags_stop_at_the_targets_glibc() -> None:
    tags = bundle_wheels.platform_tags("ubuntu-22.04")
    assert tags[0] == "manylinux_2_35_x86_64" and tags[-1] == "manylinux2014_x86_64"
    assert "manylinux_2_36_x86_64" not in tags


@pytest.mark.parametrize(
    ("distro", "minor"),
    [("debian-12", 36), ("debian-13", 41), ("ubuntu-22.04", 35), ("ubuntu-24.04", 39)],
)
def test_a_targets_glibc_comes_from_the_one_table(distro: str, minor: int) -> None:
    from egpu_setup.compat.glibc import distro_glibc

    dist_id, _, version = distro.partition("-")
    assert (distro_glibc(dist_id, version) or ("", ""))[0] == f"2.{minor}"
    assert bundle_wheels.glibc_minor(distro) == minor
    assert bundle_wheels.platform_tags(distro)[0] == f"manylinux_2_{minor}_x86_64"


def test_a_target_the_glibc_table_lacks_gets_the_torch_27_floor() -> None:
    assert bundle_wheels.glibc_minor("plan9-4") == 28
    assert bundle_wheels.manylinux_minor("manylinux_2_31_x86_64") == 31


def test_closure_follows_markers_and_reports_what_is_missing(tmp_path: Path) -> None:
    import zipfile

    def wheel(name: str, version: str, requires: list[str]) -> None:
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
            f"Requires-Dist: {r}\n" for r in requires
        )
        with zipfile.ZipFile(tmp_path / f"{name}-{version}-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)

    wheel("top", "1.0", ["dep>=2", 'old; python_version < "3.9"', 'opt; extra == "x"'])
    wheel("dep", "1.0", [])
    wheel("dep", "2.1", [])
    pool = bundle_wheels.wheel_pool(tmp_path)
    got = bundle_wheels.closure(pool, ["top==1.0"], "3.11")
    assert [(w.name, w.version) for w in got] == [("dep", "2.1"), ("top", "1.0")]
    with pytest.raises(EgpuSetupError, match="no wheel for opt"):
        bundle_wheels.closure(pool, ["top[x]==1.0"], "3.11")
    with pytest.raises(EgpuSetupError, match="no wheel for old"):
        bundle_wheels.closure(pool, ["top==1.0"], "3.8")


def test_manifest_paths_may_not_leave_the_bundle(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(
        json.dumps({"schema": bundle_format.SCHEMA, "files": [{"path": "../etc/passwd"}]})
    )
    with pytest.raises(UsageError, match="leaves the bundle"):
        bundle_format.load_manifest(tmp_path)


def test_bad_inputs_exit_2_and_write_nothing(tmp_path: Path) -> None:
    prof = _profile(tmp_path)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine\n")
    cases = [
        (["bundle", "--profile", str(prof), "--out", str(busy)], "not a bundle"),
        (["bundle", "--profile", str(prof), "--out", str(tmp_path / "b"), "--only", "x"], "--only"),
        (
            ["bundle", "--profile", str(prof), "--out", str(tmp_path / "b"), "--distro", "arch-1"],
            "--distro",
        ),
        (
            [
                "bundle",
                "--profile",
                str(prof),
                "--out",
                str(tmp_path / "b"),
                "--index-url",
                "http://x.invalid/",
            ],
            "--index-url",
        ),
        (["install", "--bundle", str(tmp_path / "nope"), "--dry-run"], "no such directory"),
        (
            ["install", "--bundle", str(busy), "--dry-run", "--bundle-sha256", Z64],
            "no manifest.json",
        ),
    ]
    for args, needle in cases:
        res = _cli(*args, timeout=60)
        assert res.returncode == 2, (args, res.stderr)
        assert "error:" in res.stderr and needle in res.stderr and "hint:" in res.stderr
        assert "Traceback" not in res.stderr
    assert sorted(p.name for p in busy.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "b").exists()


# -- the real bundle ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("bundle")
    wheels = _pypi_index.download_torch(_pypi_index.cache_dir())
    torch_only = [w for w in wheels if w.name.startswith("torch-")]
    why_no_debs = _can_bundle_debs()
    only = "torch,tool" if why_no_debs else "torch,driver,tool"
    with _pypi_index.LocalIndex(torch_only) as idx:
        args = [
            "bundle", "--profile", str(_profile(tmp)), "--out", str(tmp / "b"),
            "--cuda", "cpu", "--torch", "2.13.0", "--python", "3.11",
            "--distro", _host_distro(), "--index-url", idx.url, "--only", only, "--json",
        ]  # fmt: skip
        first = _cli(*args, env=_cache_env(tmp))
        assert first.returncode == 0, first.stderr[-3000:]
        served = list(idx.requests)
        again = _cli(*args, env=_cache_env(tmp))
        assert again.returncode == 0, again.stderr[-3000:]
        yield {
            "dir": tmp / "b",
            "first": json.loads(first.stdout),
            "again": json.loads(again.stdout),
            "served_first": served,
            "served_again": idx.requests[len(served) :],
            "debs": why_no_debs is None,
            "why_no_debs": why_no_debs,
            "tmp": tmp,
        }


@pytest.mark.debootstrap  # the bundle fetches its .debs in a debootstrap root
def test_bundle_holds_hashed_wheels_from_the_loopback_index(built: dict[str, Any]) -> None:
    b: Path = built["dir"]
    manifest = json.loads((b / "manifest.json").read_text())
    assert manifest["schema"] == "egpu-setup/bundle/1" and manifest["tool_version"]
    (target,) = manifest["targets"]
    assert target["name"] == f"py3.11-{_host_distro()}"
    assert target["torch"]["requirements"] == ["torch==2.13.0+cpu"]
    files = {f["path"]: f for f in manifest["files"]}
    torch_whl = "wheels/py3.11/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert files[torch_whl]["sha256"] == bundle_format.sha256_file(b / torch_whl)
    assert manifest["total_bytes"] == sum(f["size"] for f in manifest["files"])
    req = (b / target["torch"]["requirements_file"]).read_text()
    assert f"torch==2.13.0+cpu --hash=sha256:{files[torch_whl]['sha256']}" in req
    lines = [line for line in req.splitlines() if not line.startswith("#")]
    assert len(lines) >= 8 and all("--hash=sha256:" in line for line in lines)
    # torch came from 127.0.0.1 and nothing else was asked of it: deps are a separate call
    assert any(r.startswith("/files/torch-2.13.0") for r in built["served_first"])
    assert {r.split("/")[2] for r in built["served_first"] if r.startswith("/simple/")} == {"torch"}
    tool = {p.name.split("-")[0] for p in (b / "tool").glob("*.whl")}
    assert {"egpu_setup", "click", "distro", "jinja2", "pyyaml", "requests", "packaging"} <= tool


@pytest.mark.debootstrap  # the bundle fetches its .debs in a debootstrap root
def test_second_bundle_with_the_same_inputs_downloads_nothing(built: dict[str, Any]) -> None:
    again = built["again"]
    assert again["downloaded"] == []
    assert sorted(again["reused"]) == sorted(built["first"]["downloaded"])
    assert built["served_again"] == []  # not even an index page


@pytest.mark.debootstrap  # the bundle fetches its .debs in a debootstrap root
def test_offline_install_into_a_fresh_venv(built: dict[str, Any], tmp_path: Path) -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare -n (root)")
    offline = ("unshare", "-n", "--")
    # no network in there: a plain download from the default index fails
    probe = subprocess.run(
        [*offline, sys.executable, "-m", "pip", "download", "--no-cache-dir", "-d",
         str(tmp_path / "dl"), "six"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PIP_CONFIG_FILE": "/dev/null",
                                                          "PIP_DEFAULT_TIMEOUT": "3", "PIP_RETRIES": "0"},
        check=False,
    )  # fmt: skip
    assert probe.returncode != 0 and not list((tmp_path / "dl").glob("*"))
    venv = tmp_path / "venv"
    res = _cli(
        "install", "--bundle", str(built["dir"]), *_pin(built["dir"]), "--only", "torch",
        "--venv", str(venv), "--yes", "--no-verify", "--json",
        env={"EGPU_SETUP_INSTALLER": "pip"}, wrap=offline,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    steps = json.loads(res.stdout)["steps"]
    assert [s["kind"] for s in steps] == ["pip-install"] and steps[0]["find_links"]
    out = subprocess.run(
        [*offline, str(venv / "bin/python"), "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "2.13.0+cpu"
    # a second run plans nothing
    res = _cli("install", "--bundle", str(built["dir"]), *_pin(built["dir"]), "--only", "torch",
               "--venv", str(venv), "--dry-run", wrap=offline)  # fmt: skip
    assert res.returncode == 0 and "Nothing to do" in res.stdout


def _pin(bundle: Path) -> tuple[str, str]:
    """--bundle-sha256 as the admin carries it over: from the pin file `bundle` wrote."""
    return ("--bundle-sha256", (bundle / bundle_format.PIN_FILE).read_text().split()[0])


def _linked_copy(src: Path, dest: Path) -> Path:
    subprocess.run(["cp", "-al", str(src), str(dest)], check=True)
    return dest


@pytest.mark.debootstrap  # the bundle fetches its .debs in a debootstrap root
def test_tampered_wheel_exit_1_and_nothing_installed(built: dict[str, Any], tmp_path: Path) -> None:
    copy = _linked_copy(built["dir"], tmp_path / "b")
    victim = next((copy / "wheels/py3.11").glob("filelock-*.whl"))
    data = victim.read_bytes()
    victim.unlink()  # break the hard link before writing
    victim.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    venv = tmp_path / "venv"
    res = _cli("install", "--bundle", str(copy), *_pin(copy), "--only", "torch", "--venv",
               str(venv), "--yes", "--no-verify")  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert f"{victim.relative_to(copy)} does not match its sha256" in res.stderr
    assert "nothing was installed" in res.stderr and "hint:" in res.stderr
    assert not venv.exists()


@pytest.mark.debootstrap  # the bundle fetches its .debs in a debootstrap root
def test_wrong_target_exit_2_names_what_the_bundle_has(built: dict[str, Any]) -> None:
    res = _cli("install", "--bundle", str(built["dir"]), *_pin(built["dir"]), "--only", "torch",
               "--dry-run",
               "--from", str(HOST_FIXTURES / "tb4-rtx4090-ubuntu2404"))  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert f"it holds py3.11-{_host_distro()}" in res.stderr and "Traceback" not in res.stderr
    assert "--python 3.12" in res.stderr


@pytest.mark.debootstrap  # the bundle fetches its .debs in a debootstrap root
def test_driver_from_the_bundle_into_a_debootstrap_root_offline(
    built: dict[str, Any], tmp_path: Path
) -> None:
    if not built["debs"]:
        pytest.skip(built["why_no_debs"])
    b: Path = built["dir"]
    suite = {"debian-12": "bookworm", "debian-13": "trixie"}.get(_host_distro())
    if suite is None:
        pytest.skip("no debootstrap root for this distribution")
    repo = b / f"debs/{_host_distro()}"
    debs = list(repo.glob("*.deb"))
    assert len(debs) > 300 and "Package: nvidia-driver\n" in (repo / "Packages").read_text()
    root = _debroot.copy_root(suite, tmp_path / "root")
    before = _debroot.snapshot(root)
    options = {"root_dir": str(root), "bundle_dir": str(b), "bundle_sha256": _pin(b)[1],
               "only": "driver", "yes": True}  # fmt: skip
    res = subprocess.run(
        ["unshare", "-n", "--", sys.executable, str(REPO / "tests/helpers/install_but_apt.py"),
         json.dumps(options)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(res.stdout)
    kinds = [s["kind"] for s in data["steps"]]
    # then the driver part's modprobe drop-ins and the initramfs rebuild, and an image's seal
    # (image/additions.py): /etc/machine-id and D-Bus's link to it
    assert kinds[:2] == ["apt-repository", "apt-install"], kinds
    assert set(kinds[2:]) <= {"write-file", "run-command", "create-link"}
    links = [s for s in data["steps"] if s["kind"] == "create-link"]
    assert [s["path"] for s in links] == ["/var/lib/dbus/machine-id"], links
    assert [s["kind"] for s in data["result"]] == [k for k in kinds if k != "apt-install"]
    (argv,) = data["apt"]
    sim = subprocess.run(
        ["unshare", "-n", "--", "chroot", str(root), argv[0], "-s", *argv[1:]],
        capture_output=True, text=True, timeout=600, check=False,
        env={"LC_ALL": "C.UTF-8", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )  # fmt: skip
    assert sim.returncode == 0, sim.stdout[-2000:] + sim.stderr[-2000:]
    inst = [ln for ln in sim.stdout.splitlines() if ln.startswith("Inst ")]
    assert len(inst) > 300  # `apt-get -s` found all of them offline
    src = (root / "etc/apt/sources.list.d/egpu-setup-bundle.sources").read_text()
    assert "Trusted: yes" in src and "URIs: file:/var/lib/egpu-setup/bundle-apt/" in src
    staged = root / f"var/lib/egpu-setup/bundle-apt/{_host_distro()}"
    assert len(list(staged.glob("*.deb"))) == len(debs)
    # rollback removes the source and the staged packages; /etc is as before
    res = _cli("rollback", "--root", str(root), "--yes")
    assert res.returncode == 0, res.stderr[-2000:]
    assert _debroot.snapshot(root) == before
    assert not list(staged.glob("*.deb"))
