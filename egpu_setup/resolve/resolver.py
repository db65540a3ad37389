"""The resolver: (host facts or what-if inputs, profile, constraints, matrix) -> Resolution.

Pure: no I/O beyond reading our own package data. It keys on the GPU's compute capability AND the
driver AND the distro AND the target Python (uv's `--torch-backend=auto` and light-the-torch look
only at the driver version). Policy, in order:

1. Target: the eGPU (or the one NVIDIA GPU, or `--gpu`, or the profile's GPU).
2. Torch candidates: every (release, variant) with a wheel for the Python, matching `--torch` and
   `--cuda`, whose arch list has cubins for the GPU (binary compatible within a major version; PTX
   JIT as the documented fallback). Order: newest release, SASS before PTX, stable before
   experimental, newest CUDA first.
3. Driver: keep the installed one when it drives the GPU and runs some candidate; otherwise the
   least risky branch that does: the distro's own package, else NVIDIA's CUDA repo; never a
   branch that dropped the GPU. WSL2: the Windows host owns the driver (pip side only). Where we
   know no driver packages (Fedora, Arch), a driver that drives the GPU stays whatever branch
   was asked for, so torch must fit it or the request is refused.
4. Torch: the first candidate the chosen driver runs.
An impossible request raises MatrixError naming the conflicting facts and the nearest thing that
works.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from egpu_setup.compat.matrix import (
    Distro,
    Matrix,
    load_snapshot,
)
from egpu_setup.compat.versions import (
    DriverVersion,
    PythonVersion,
    parse_variant,
)
from egpu_setup.detect.facts import HostFacts, OsFacts
from egpu_setup.errors import MatrixError, UnsupportedHardware, UsageError
from egpu_setup.profile.types import Profile
from egpu_setup.resolve.constraints import Constraints, parse_distro, parse_python
from egpu_setup.resolve.driver import DriverCase, driver_unknown_gpu, linux_driver, wsl_driver
from egpu_setup.resolve.glibc_floor import within_glibc
from egpu_setup.resolve.resolution import (
    DriverPlan,
    MatrixUsed,
    Notes,
    Resolution,
    ResolvedGpu,
    TorchPlan,
)
from egpu_setup.resolve.rocm import amd_target, parse_rocm_variant, resolve_rocm
from egpu_setup.resolve.target import Target, pick_target
from egpu_setup.resolve.wheels import FALLBACK_PYTHON, candidates, runs_in_no_wheel, torch_plan


def resolve(
    facts: HostFacts | None,
    profile: Profile | None,
    constraints: Constraints,
    matrix: Matrix | None = None,
) -> Resolution:
    """Choose the driver, CUDA variant and torch wheel, with a reason for every choice.

    `facts` None: what-if inputs only (`resolve --gpu ...`, a bundle's targets). `matrix` None
    is the shipped snapshot (compat/matrix.py `select_matrix`: the overlay of `matrix update`
    decides only when asked for). A profile's pins (torch.pin, driver.pin) are exact: the matrix
    checks that they fit, it never chooses something else instead."""
    try:
        return _resolve(facts, profile, constraints, matrix or load_snapshot())
    except MatrixError as exc:
        pins = [
            f"{name} {value}"
            for name, value in (
                ("torch.pin", constraints.torch_pin),
                ("driver.pin", constraints.driver_pin),
            )
            if value
        ]
        if not pins or "driver.pin" in exc.message:
            raise
        raise MatrixError(
            f"the profile pins {' and '.join(pins)}, which does not fit: {exc.message}",
            f"{exc.hint}; or change the pin in the profile" if exc.hint else "change the pin",
        ) from exc


def _resolve(
    facts: HostFacts | None, profile: Profile | None, constraints: Constraints, m: Matrix
) -> Resolution:
    n = Notes()
    c = _checked(constraints, m, n)
    m = m.for_machine(_machine(facts, c, n))
    installed = _installed_driver(facts, c)
    os_facts = facts.os if facts is not None else None
    platform: Literal["linux", "wsl"] = c.platform or (
        "wsl" if os_facts is not None and os_facts.wsl else "linux"
    )
    distro, distro_label = _distro(os_facts, c, m, n)
    python = _python(facts, c, distro, n)
    amd = _amd(facts, profile, c, m, distro, python, platform, distro_label, n)
    if amd is not None:
        return amd
    target, others = pick_target(facts, profile, c, m, n)
    want_gpu = _explain_target(target, installed, c, n)
    if target is not None and c.cuda is None and runs_in_no_wheel(m, python, target):
        # Nothing was asked that cannot be: the card still gets its last driver (it drives
        # displays and nvidia-smi), torch the CPU build, and the answer says why.
        n.warnings.append(
            f"no torch wheel for Python {python} has kernels for {target.gpu.name} "
            f"(compute capability {target.cc}): torch runs on the CPU; the driver is still "
            "planned for the card"
        )
        c = replace(c, cuda="cpu")
    cands = candidates(m, python, target, want_gpu, c.torch_spec, c.cuda)
    distro_id, distro_ver = _distro_key(os_facts, c, m)
    base = m.base_of(distro_id, distro_ver) if m.distro(distro_id, distro_ver) is None else None
    cands = within_glibc(cands, c, distro_id, distro_ver, distro_label, base, n, m.machine)

    if platform == "wsl":
        driver, chosen = wsl_driver(m, cands, installed, target, n)
    elif target is None:
        driver, chosen = driver_unknown_gpu(m, cands, installed, n)
    else:
        case = DriverCase(
            m,
            tuple(cands),
            installed,
            facts,
            target,
            tuple(others),
            distro,
            distro_label,
            python,
            c,
        )
        driver, chosen = linux_driver(case, n)
    if c.driver_pin is not None and platform != "wsl":
        n.reasons.append(f"driver {c.driver_pin} is pinned by the profile (driver.pin)")
    torch = torch_plan(m, chosen, c, n)
    if chosen.how == "ptx":
        n.warnings.append(
            f"torch {chosen.label} has no SASS for compute capability "
            f"{target.cc if target else '?'}: kernels are JIT-compiled from PTX on first use "
            "(slow first start)"
        )
    gpu = target.gpu if target else None
    return _answer(gpu, driver, torch, python, platform, n, distro_label, distro, m, c)


def _answer(
    gpu: ResolvedGpu | None,
    driver: DriverPlan,
    torch: TorchPlan,
    python: str,
    platform: Literal["linux", "wsl"],
    n: Notes,
    distro_label: str | None,
    distro: Distro | None,
    m: Matrix,
    c: Constraints,
) -> Resolution:
    return Resolution(
        gpu=gpu,
        driver=driver,
        torch=torch,
        python=python,
        platform=platform,
        reasons=tuple(n.reasons),
        warnings=tuple(n.warnings),
        distro=distro_label,
        archive=distro.label if distro is not None else None,
        matrix=_matrix_used(m),
        torch_pin=c.torch_pin,
        driver_pin=c.driver_pin,
        machine=m.machine,
    )


# uname -m / os-release spellings of the two architectures PyTorch publishes Linux wheels for
_MACHINE_NAMES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


def _machine(facts: HostFacts | None, c: Constraints, n: Notes) -> str:
    """The CPU architecture to plan for: --arch, else the host's (`uname -m`), else x86_64."""
    asked = c.machine or (facts.os.arch if facts is not None else None)
    if not asked:
        return "x86_64"
    machine = _MACHINE_NAMES.get(asked.lower())
    if machine is None:
        raise UnsupportedHardware(
            f"the machine is {asked}: PyTorch publishes Linux wheels for x86_64 and aarch64 only",
            "plan for one of them with --arch x86_64 or --arch aarch64",
        )
    if machine != "x86_64":
        n.reasons.append(
            f"{machine}: only the wheels and packages published for {machine} are planned"
        )
    return machine


def _checked(c: Constraints, m: Matrix, n: Notes) -> Constraints:
    """The constraints with --cuda normalised and a torch pin as the spec; UsageError for what
    no matrix row can mean."""
    if c.driver_pin is not None:
        try:
            DriverVersion.from_str(c.driver_pin)
        except ValueError as exc:
            raise UsageError(f"driver.pin: {exc}", "pin a version such as 580.95.05") from exc
    if c.torch_pin is not None:
        c = replace(c, torch_spec=c.torch_pin)
        n.reasons.append(
            f"torch {c.torch_pin} is pinned by the profile (torch.pin): the matrix only checks "
            "that it fits"
        )
    if c.cuda is not None:
        try:
            c = replace(c, cuda=parse_variant(c.cuda))
        except ValueError as exc:
            raise UsageError(f"--cuda: {exc}", "use e.g. --cuda cu128 or --cuda cpu") from exc
    if c.rocm is not None:
        c = replace(c, rocm=parse_rocm_variant(c.rocm))
    if c.flavour not in ("open", "proprietary", "auto"):
        raise UsageError(f"driver flavour {c.flavour!r} is not open, proprietary or auto")
    if c.driver_branch is not None and m.branch(c.driver_branch) is None:
        known = ", ".join(str(b.branch) for b in m.branches)
        raise UsageError(
            f"--driver-branch {c.driver_branch}: not an NVIDIA driver branch we know",
            f"known branches: {known}",
        )
    return c


def _amd(
    facts: HostFacts | None,
    profile: Profile | None,
    c: Constraints,
    m: Matrix,
    distro: Distro | None,
    python: str,
    platform: Literal["linux", "wsl"],
    distro_label: str | None,
    n: Notes,
) -> Resolution | None:
    """The ROCm answer when the GPU to plan for is an AMD one (resolve/rocm.py), else None."""
    if c.cuda == "cpu":
        return None
    target = amd_target(facts, c, profile, n)
    if target is None:
        if c.rocm is not None:
            raise UsageError(
                f"--rocm {c.rocm}: no AMD GPU found or named",
                "pass the card with --gpu, e.g. --gpu 'RX 7900 XTX' or --gpu 1002:744c",
            )
        return None
    if c.cuda is not None:
        raise UsageError(
            f"--cuda {c.cuda}: the GPU is an AMD {target.model.name}, which runs ROCm, not CUDA",
            "use --rocm VARIANT (e.g. --rocm rocm7.2), or --cuda cpu for the CPU build",
        )
    if m.machine != "x86_64":
        raise UnsupportedHardware(
            f"PyTorch publishes its ROCm wheels for Linux x86_64 only, not for {m.machine}",
            "plan on an x86_64 machine, or pass --cuda cpu for the CPU build",
        )
    if platform == "wsl":
        raise UnsupportedHardware(
            "PyTorch publishes its ROCm wheels for Linux only, not for WSL",
            "run Linux natively, or pass --cuda cpu for the CPU build",
        )
    # the host's own release decides glibc; its package archive (a derivative's base) firmware
    distro_id, distro_ver = _distro_key(facts.os if facts is not None else None, c, m)
    archive = (distro_id, distro_ver)
    if distro is not None:
        archive = (distro.label.rsplit("-", 1)[0], distro.label.rsplit("-", 1)[1])
    a = resolve_rocm(target, m, c, python, (distro_id, distro_ver), archive, n)
    return _answer(a.gpu, a.driver, a.torch, python, platform, n, distro_label, distro, m, c)


def _matrix_used(m: Matrix) -> MatrixUsed:
    if m.overlay is None:
        return MatrixUsed("shipped", m.snapshot)
    return MatrixUsed("updated", m.snapshot, m.overlay.fetched_at, m.overlay.index_url)


def _distro_key(
    os_facts: OsFacts | None, c: Constraints, m: Matrix
) -> tuple[str | None, str | None]:
    """(id, version) of the distribution asked for: --distro, else the host's os-release."""
    if c.distro:
        return parse_distro(c.distro, m)
    if os_facts is None:
        return None, None
    return os_facts.id, os_facts.version_id


def _distro(
    os_facts: OsFacts | None, c: Constraints, m: Matrix, n: Notes
) -> tuple[Distro | None, str | None]:
    """(the distribution whose packages the plan uses, the host's own label): a derivative
    (Linux Mint) is planned as its base."""
    distro_id, distro_ver = _distro_key(os_facts, c, m)
    distro = m.distro(distro_id, distro_ver)
    label = f"{distro_id}-{distro_ver}" if distro_id and distro_ver else distro_id
    base = m.base_of(distro_id, distro_ver) if distro is None else None
    if base is not None:
        distro = next(d for d in m.distros if d.label == base.base)
        n.reasons.append(f"{label} uses the {base.base} package archive: planned as {base.base}")
    return distro, label


def _explain_target(
    target: Target | None, installed: DriverVersion | None, c: Constraints, n: Notes
) -> bool:
    """Say which GPU the plan is for (or that none is known); True when CUDA wheels are wanted."""
    if target is not None:
        gpu = target.gpu
        if target.cc is None:
            n.warnings.append(
                f"compute capability of {gpu.name} unknown: wheels are not checked for its kernels"
            )
        else:
            n.reasons.append(
                f"{gpu.name}{' (' + gpu.pci_id + ')' if gpu.pci_id else ''} is {gpu.architecture}, "
                f"compute capability {target.cc}"
            )
        return True
    if installed is not None:
        n.warnings.append(
            f"no NVIDIA GPU known: resolved from driver {installed} alone, so the wheel is not "
            "checked for your GPU's kernels (pass --gpu)"
        )
        return True
    if c.cuda not in (None, "cpu"):
        n.warnings.append(
            "no NVIDIA GPU and no driver known: the CUDA wheel is not checked against either"
        )
        return True
    n.warnings.append(
        "no NVIDIA GPU found: planning the CPU build (plug in the eGPU or pass --gpu)"
    )
    return False


def _installed_driver(facts: HostFacts | None, c: Constraints) -> DriverVersion | None:
    text = c.driver
    if text is None and facts is not None:
        text = facts.nvidia.driver_version
        if text:
            text = str(text).splitlines()[0].strip()  # WSL nvidia-smi: first line only (uv#14647)
    if not text:
        return None
    try:
        return DriverVersion.from_str(text)
    except ValueError as exc:
        if c.driver is not None:
            raise UsageError(f"--driver: {exc}", "use e.g. --driver 550.163.01") from exc
        return None


def _python(facts: HostFacts | None, c: Constraints, distro: Distro | None, n: Notes) -> str:
    if c.python:
        return parse_python(c.python)
    detected = facts.python.version if facts is not None else None
    if detected:
        try:
            return str(PythonVersion.from_str(detected))
        except ValueError:
            pass
    if distro is not None:
        n.reasons.append(f"Python {distro.python}: the default python3 of {distro.label}")
        return distro.python
    n.warnings.append(f"target Python unknown: assuming {FALLBACK_PYTHON} (pass --python)")
    return FALLBACK_PYTHON
