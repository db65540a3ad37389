"""The planner (pure diff against a host) and the install command's dry run and refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from egpu_setup.compat.index_url import check_index_url
from egpu_setup.errors import UsageError
from egpu_setup.host.machine import RootHost
from egpu_setup.plan.apt_sources import parse_deb822_sources
from egpu_setup.plan.build import build_plan
from egpu_setup.plan.installed import installed_packages, present_packages, unfinished_packages
from egpu_setup.plan.options import PlanOptions, parse_only
from egpu_setup.plan.steps import AptInstall, AptRepository, RunCommand
from egpu_setup.plan.triggers import TRIGGER_RUN
from helpers import install_values as values

REPO = Path(__file__).resolve().parents[2]
PROFILE = str(REPO / "profiles" / "rtx4090.yaml")
DPKG_STATUS = """Package: nvidia-driver
Status: install ok installed
Version: 535.261.03-1

Package: firmware-nvidia-gsp
Status: deinstall ok config-files
Version: 535.261.03-1
"""


def _root(tmp_path: Path, sources: str, status: str = "") -> Path:
    r = tmp_path / "root"
    (r / "etc/apt/sources.list.d").mkdir(parents=True)
    (r / "var/lib/dpkg").mkdir(parents=True)
    (r / "etc/apt/sources.list.d/debian.sources").write_text(sources)
    (r / "var/lib/dpkg/status").write_text(status)
    return r


MAIN_ONLY = """Types: deb
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def test_components_drop_in_mirrors_the_hosts_own_source(tmp_path: Path) -> None:
    host = RootHost(_root(tmp_path, MAIN_ONLY))
    plan = build_plan(
        values.facts(),
        values.profile(),
        values.resolution(),
        (),
        host,
        PlanOptions(target="root", only=frozenset({"driver"})),
    )
    repo = plan.steps[0]
    assert isinstance(repo, AptRepository)
    assert "URIs: http://mirror.invalid/debian\nSuites: bookworm bookworm-updates\n" in repo.content
    assert "Components: contrib non-free non-free-firmware" in repo.content
    assert "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" in repo.content


def test_components_already_enabled_plan_no_source(tmp_path: Path) -> None:
    full = MAIN_ONLY.replace(
        "Components: main", "Components: main contrib non-free non-free-firmware"
    )
    host = RootHost(_root(tmp_path, full, DPKG_STATUS))
    plan = build_plan(
        values.facts(),
        values.profile(),
        values.resolution(),
        (),
        host,
        PlanOptions(target="root", only=frozenset({"driver"})),
    )
    # the apt step defers dpkg's triggers to one run after it (plan/triggers.py)
    assert [s.kind for s in plan.steps] == ["apt-install", "run-command"]
    apt, trigger = plan.steps
    assert isinstance(apt, AptInstall) and isinstance(trigger, RunCommand)
    assert apt.defer_triggers and trigger.argv == TRIGGER_RUN
    # installed packages are diffed away; a removed one (config-files) is still wanted; an image
    # (--root) has no running kernel: only the resolver's meta headers package
    assert isinstance(plan.steps[0], AptInstall)
    assert plan.steps[0].packages == (
        "linux-headers-amd64",
        "nvidia-kernel-dkms",
        "firmware-nvidia-gsp",
    )


def test_live_debian_gets_headers_for_the_running_kernel(tmp_path: Path) -> None:
    """The resolver names linux-headers-amd64 (the meta package); a live system also needs the
    running kernel's headers, or DKMS builds no module for the kernel it boots."""
    facts = values.facts(codename="trixie", version="13", kernel="6.12.57+deb13-amd64")
    res = values.resolution(facts_=facts)
    assert "linux-headers-amd64" in res.driver.packages  # what the real resolver produces
    host = RootHost(_root(tmp_path, MAIN_ONLY.replace("bookworm", "trixie")))
    plan = build_plan(
        facts,
        values.profile(),
        res,
        (),
        host,
        PlanOptions(target="live", only=frozenset({"driver"})),
    )
    apt = next(s for s in plan.steps if isinstance(s, AptInstall))
    # apt cannot be asked in this bare directory: planned, apt says clearly if it is gone
    assert apt.packages.count("linux-headers-amd64") == 1
    assert "linux-headers-6.12.57+deb13-amd64" in apt.packages
    assert plan.steps[-1].kind == "reboot-needed"
    # a release that is no Debian package name never reaches apt's argv
    odd = values.facts(codename="trixie", version="13", kernel="6.12.57-Custom;rm")
    plan = build_plan(
        odd, values.profile(), res, (), host, PlanOptions(target="live", only=frozenset({"driver"}))
    )
    apt = next(s for s in plan.steps if isinstance(s, AptInstall))
    assert not [p for p in apt.packages if p.startswith("linux-headers-6")]
    assert any("not a Debian kernel package name" in w for w in plan.warnings)


def test_nvidia_repo_uses_signed_by_keyring_and_the_pin_package(tmp_path: Path) -> None:
    host = RootHost(_root(tmp_path, MAIN_ONLY))
    res = values.resolution(driver_branch=590)  # the resolver picks NVIDIA's repository
    assert res.driver.source == "nvidia-repo"
    plan = build_plan(
        values.facts(),
        values.profile(),
        res,
        (),
        host,
        PlanOptions(target="root", only=frozenset({"driver"})),
    )
    step = plan.steps[0]
    assert isinstance(step, AptRepository)
    assert step.keyring_path == "/etc/apt/keyrings/egpu-setup-nvidia-cuda.gpg"
    assert res.driver.repo is not None and step.fingerprint == res.driver.repo.fingerprint
    assert f"Signed-By: {step.keyring_path}" in step.content
    assert "trusted.gpg" not in step.content
    assert isinstance(plan.steps[1], AptInstall)
    assert "nvidia-driver-pinning-590" in plan.steps[1].packages


def test_keep_and_host_managed_drivers_plan_no_apt(tmp_path: Path) -> None:
    host = RootHost(_root(tmp_path, MAIN_ONLY))
    for action in ("keep", "host-managed"):
        plan = build_plan(
            values.facts(),
            values.profile(),
            values.resolution(action=action),
            (),
            host,
            PlanOptions(target="root", only=frozenset({"driver"})),
        )
        assert plan.steps == ()


def test_parsers_and_option_validation() -> None:
    status_only = {"read": lambda self, p: DPKG_STATUS, "listdir": lambda self, p: []}
    assert installed_packages(type("H", (), status_only)()) == {"nvidia-driver": "535.261.03-1"}
    assert (
        parse_deb822_sources("Types: deb\nURIs: x\nSuites: a\nComponents: main\nEnabled: no\n", "f")
        == []
    )
    assert parse_only("torch,config") == {"torch", "config"}
    with pytest.raises(UsageError, match="unknown part drivers"):
        parse_only("drivers")
    assert check_index_url("http://127.0.0.1:8080/simple/")
    with pytest.raises(UsageError, match="only https"):
        check_index_url("http://mirror.example/simple/")


@pytest.mark.parametrize(
    ("status", "installed"),
    [
        ("install ok installed", True),
        ("hold ok installed", True),  # apt-mark hold: there, and kept at its version
        # what a killed or failed dpkg run leaves (deb-status(5)): not usable, so planned again
        ("install ok unpacked", False),
        ("install ok half-configured", False),
        ("install reinstreq half-installed", False),
        ("install ok triggers-pending", False),
        ("install ok triggers-awaited", False),
        ("install reinstreq installed", False),
        ("deinstall ok installed", False),  # on its way out: apt-get install keeps it
        ("deinstall ok config-files", False),
        ("purge ok not-installed", False),
    ],
)
def test_a_package_is_installed_only_when_dpkg_configured_it(
    tmp_path: Path, status: str, installed: bool
) -> None:
    root = _root(tmp_path, MAIN_ONLY, f"Package: lab-driver\nStatus: {status}\nVersion: 1.0\n")
    assert ("lab-driver" in installed_packages(RootHost(root))) is installed
    # and rollback --packages purges it in every state that left something of it
    present = "lab-driver" in present_packages(RootHost(root))
    assert present is (not status.endswith("not-installed"))


def test_dpkgs_own_journal_is_read_after_its_status_file(tmp_path: Path) -> None:
    """A killed dpkg leaves its changes in /var/lib/dpkg/updates/NNNN, not yet in the status
    file: they are read in order over it, and its unfinished temp file (tmp.i) is not."""
    root = _root(tmp_path, MAIN_ONLY, DPKG_STATUS)
    updates = root / "var/lib/dpkg/updates"
    updates.mkdir()
    (updates / "0000").write_text("Package: lab-lib\nStatus: install ok half-installed\n")
    (updates / "0001").write_text("Package: lab-lib\nStatus: install ok unpacked\n")
    (updates / "0002").write_text(
        "Package: nvidia-driver\nStatus: install ok half-configured\nVersion: 1\n"
    )
    (updates / "tmp.i").write_text("Package: lab-lib\nStatus: install ok installed\n")
    host = RootHost(root)
    assert installed_packages(host) == {}
    assert present_packages(host) == {
        "nvidia-driver": "half-configured",
        "firmware-nvidia-gsp": "config-files",
        "lab-lib": "unpacked",
    }
    assert unfinished_packages(host) == ["nvidia-driver", "lab-lib"]


def test_the_apt_get_command_carries_its_deadlines_and_a_reinstall() -> None:
    step = AptInstall(("nvidia-driver", "lab-lib"), True, lock_timeout=30, fetch_timeout=20)
    common = [
        "apt-get", "-y",
        "-o", "DPkg::Lock::Timeout=30",
        "-o", "Acquire::http::Timeout=20",
        "-o", "Acquire::https::Timeout=20",
        "-o", "Dpkg::Options::=--force-confdef",
        "-o", "Dpkg::Options::=--force-confold",
        "install",
    ]  # fmt: skip
    assert step.argv() == [*common, "--no-install-recommends", "nvidia-driver", "lab-lib"]
    # what dpkg left half-installed, named once, after the step's own
    assert step.argv(reinstall=("lab-lib", "lab-dep")) == [
        *common, "--reinstall", "--no-install-recommends", "nvidia-driver", "lab-lib", "lab-dep"
    ]  # fmt: skip
    assert step.deadline == 3600 and AptInstall(("x",)).fetch_timeout == 60


# -- the command ---------------------------------------------------------------------------------


# This machine's Python lives under /root (mode 0700), which an unprivileged user cannot enter;
# so the child imports what the command needs as root, then drops to `nobody` for real before
# the command runs: every file it touches afterwards is checked with nobody's rights.
_AS_NOBODY = """
import contextlib, io, os, sys
import egpu_setup.cli
args = [a for a in sys.argv[1:] if a not in ("--yes", "--dry-run")] + ["--dry-run"]
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    with contextlib.suppress(BaseException):  # warm-up as root: every lazy import happens here
        egpu_setup.cli.cli.main(args, "egpu-setup")
os.setgroups([]); os.setgid(65534); os.setuid(65534)
sys.argv = ["egpu-setup", *sys.argv[1:]]
egpu_setup.cli.main()
"""


def _cli(
    *args: str, user: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "egpu_setup", *args]
    if user:
        argv = [sys.executable, "-c", _AS_NOBODY, *args]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
        cwd="/",
    )


def test_dry_run_works_here_without_root_and_without_a_gpu(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = _cli(
        "install",
        "--profile",
        PROFILE,
        "--dry-run",
        user="65534",
        env={"EGPU_SETUP_STATE_DIR": str(state)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "Plan (" in proc.stdout and "apt-get install" in proc.stdout
    assert "no external NVIDIA GPU detected" in proc.stderr
    # a dry run writes nothing: no manifest, journal or lock
    assert not any(
        (state / n).exists() for n in ("manifest.json", "journal.jsonl", "egpu-setup.lock")
    )


def test_dry_run_json_is_the_resolution_contract_plus_steps() -> None:
    proc = _cli(
        "install", "--profile", PROFILE, "--dry-run", "--json", "--only", "torch", "--cuda", "cpu"
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema"] == "egpu-setup/resolution/1"
    assert [s["kind"] for s in data["steps"]] == ["pip-install"]
    assert data["steps"][0]["index_url"].endswith("/whl/cpu")
    assert data["driver"]["in_run"] is False  # --only torch: the driver line is not this run's
    whole = json.loads(_cli("install", "--profile", PROFILE, "--dry-run", "--json").stdout)
    assert whole["driver"]["in_run"] is True


def test_non_root_real_install_changes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = _cli(
        "install",
        "--profile",
        PROFILE,
        "--yes",
        "--only",
        "config",
        user="65534",
        env={"EGPU_SETUP_STATE_DIR": str(state)},
    )
    assert proc.returncode == 1, proc.stderr
    assert "\nerror: installing the driver and system files needs root" in "\n" + proc.stderr
    assert not Path("/etc/udev/rules.d/71-egpu-setup.rules").exists()
    assert "hint:" in proc.stderr and "Traceback" not in proc.stderr
    assert not any(
        (state / n).exists() for n in ("manifest.json", "journal.jsonl", "egpu-setup.lock")
    )


def test_from_without_root_is_a_usage_error(tmp_path: Path) -> None:
    proc = _cli("install", "--profile", PROFILE, "--from", str(tmp_path), "--yes")
    assert proc.returncode == 2 and "needs --root DIR" in proc.stderr


def test_bad_only_and_index_url_are_usage_errors() -> None:
    assert _cli("install", "--profile", PROFILE, "--dry-run", "--only", "gpu").returncode == 2
    proc = _cli("install", "--profile", PROFILE, "--dry-run", "--index-url", "ftp://x/simple")
    assert proc.returncode == 2 and "error: --index-url" in proc.stderr
