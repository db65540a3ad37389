"""Safe detach of the eGPU: say why it is not safe, or make it safe and say so.

The sequence (NVIDIA README "Configuring External and Removable GPUs", after gswitch's "remove",
extended):
1. refuse while the eGPU drives a display (a DRM connector of the card is connected and
   enabled) or a process uses it (an open /dev/nvidia* or DRI node of the card, or a mapping of
   one), naming each process;
2. stop nvidia-persistenced (it holds /dev/nvidia* by design);
3. unload the NVIDIA modules, only when no other NVIDIA GPU remains (else removal unbinds just
   this card);
4. write 1 to `remove` of every function of the card (VGA, audio, USB-C), function 0 last;
5. for Thunderbolt, write 0 to the enclosure's `authorized` where the domain supports
   de-authorization (`deauthorization` = 1), which tears the PCIe tunnel down, but only for a
   device tied to the eGPU (`enclosure_of`): never a dock or a device it cannot tell apart.

The NVIDIA driver does not handle surprise removal (open-gpu-kernel-modules #842), which is why
this exists. `plan_eject` only reads; `run_eject` acts through the Host: commands with
`host.run`, sysfs writes on `host.real_path` (so `--root DIR` writes land inside DIR).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from egpu_setup.detect.facts import Gpu, HostFacts, TbDevice
from egpu_setup.detect.processes import probe_procs
from egpu_setup.errors import BusyError, EgpuSetupError, ExecutionError, UsageError
from egpu_setup.host.machine import Host
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.eject")

PERSISTENCED_UNITS = ("egpu-setup-persistenced.service", "nvidia-persistenced.service")
# /proc/PID/comm is cut to 15 characters.
_PERSISTENCED_COMM = "nvidia-persiste"
# Unload order: users of the core module first (uvm, peermem, drm -> modeset -> nvidia).
# Debian's packages load them as nvidia-current* (Debian nvidia-kernel-support's
# nvidia-modprobe.conf).
_MODULE_ORDER = (
    "nvidia_uvm",
    "nvidia_current_uvm",
    "nvidia_peermem",
    "nvidia_current_peermem",
    "nvidia_drm",
    "nvidia_current_drm",
    "nvidia_modeset",
    "nvidia_current_modeset",
    "nvidia",
    "nvidia_current",
)
_NVIDIA_NODE = re.compile(r"/dev/nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)\Z")
_PCI_FN = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")


@dataclass(frozen=True)
class EjectStep:
    """One action: a command (argv) or a sysfs write (path, value)."""

    kind: str  # "command" / "write"
    description: str
    argv: tuple[str, ...] = ()
    path: str = ""
    value: str = ""


@dataclass(frozen=True)
class EjectPlan:
    gpu: Gpu
    functions: tuple[str, ...]
    displays: tuple[str, ...]  # connectors driven by the card
    users: tuple[str, ...]  # "pid 4242 (python3): /dev/nvidia0"
    steps: tuple[EjectStep, ...]
    notes: tuple[str, ...]

    @property
    def blockers(self) -> tuple[str, ...]:
        return tuple(f"drives display {c}" for c in self.displays) + self.users


# -- reading the host ------------------------------------------------------------------------------


def card_functions(host: Host, address: str) -> tuple[str, ...]:
    """Every PCI function of the card at `address` (same domain:bus:device)."""
    slot = address.rsplit(".", 1)[0]
    found = [
        p.rsplit("/", 1)[1]
        for p in host.glob("/sys/bus/pci/devices", f"{slot}.*")
        if _PCI_FN.match(p.rsplit("/", 1)[1])
    ]
    return tuple(sorted(found)) or (address,)


def _drm_cards(host: Host, functions: tuple[str, ...]) -> list[str]:
    cards = []
    for fn in functions:
        cards += [p.rsplit("/", 1)[1] for p in host.glob(f"/sys/bus/pci/devices/{fn}/drm", "card*")]
    return sorted(set(cards))


def driven_displays(host: Host, functions: tuple[str, ...]) -> tuple[str, ...]:
    """Connectors of the card that are connected and enabled (status/enabled, sysfs drm)."""
    out = []
    for fn in functions:
        for card in host.glob(f"/sys/bus/pci/devices/{fn}/drm", "card*"):
            name = card.rsplit("/", 1)[1]
            for conn in host.glob(card, f"{name}-*"):
                if host.read_attr(f"{conn}/status") != "connected":
                    continue
                if host.read_attr(f"{conn}/enabled") == "disabled":
                    continue
                out.append(conn.rsplit("/", 1)[1])
    return tuple(sorted(out))


def gpu_minor(host: Host, address: str) -> str | None:
    text = host.read(f"/proc/driver/nvidia/gpus/{address}/information") or ""
    m = re.search(r"^Device Minor:\s*(\d+)", text, re.M)
    return m.group(1) if m else None


def _node_belongs(node: str, minor: str | None, only_gpu: bool, dri_nodes: set[str]) -> bool:
    if node in dri_nodes:
        return True
    m = _NVIDIA_NODE.match(node)
    if not m:
        return False
    if only_gpu:  # the one NVIDIA GPU: every NVIDIA node keeps the modules in use
        return True
    return m.group(1) == minor  # another NVIDIA GPU stays: only this card's node counts


def gpu_users(
    host: Host, functions: tuple[str, ...], minor: str | None, only_gpu: bool
) -> tuple[str, ...]:
    """Processes holding the card's device nodes open or mapped, persistenced excluded."""
    dri_nodes = {f"/dev/dri/{c}" for c in _drm_cards(host, functions)}
    for fn in functions:
        dri_nodes |= {
            f"/dev/dri/{p.rsplit('/', 1)[1]}"
            for p in host.glob(f"/sys/bus/pci/devices/{fn}/drm", "renderD*")
        }
    users = []
    for proc in probe_procs(host):
        nodes = sorted(p for p in proc.paths if _node_belongs(p, minor, only_gpu, dri_nodes))
        if not nodes or (proc.comm == _PERSISTENCED_COMM and _is_persistenced(host, proc.pid)):
            continue
        users.append(f"pid {proc.pid} ({proc.comm}): {', '.join(nodes)}")
    return tuple(users)


def _is_persistenced(host: Host, pid: int | str) -> bool:
    """Whether `pid` runs NVIDIA's daemon: a name is not enough, any process sets its own
    (prctl(2) PR_SET_NAME, or a write to /proc/self/comm: proc(5)), so its program (exe) must
    be the daemon's binary too, which only root installs."""
    exe = host.readlink(f"/proc/{pid}/exe") or ""
    return exe.startswith("/usr/") and exe.rsplit("/", 1)[-1] == "nvidia-persistenced"


def loaded_nvidia_modules(host: Host) -> tuple[str, ...]:
    names = {
        line.split()[0] for line in (host.read("/proc/modules") or "").splitlines() if line.split()
    }
    return tuple(m for m in _MODULE_ORDER if m in names)


def _persistenced_running(host: Host) -> bool:
    return any(
        host.read_attr(f"/proc/{pid}/comm") == _PERSISTENCED_COMM
        for pid in host.listdir("/proc")
        if pid.isdigit()
    )


def _installed_units(host: Host, names: tuple[str, ...]) -> tuple[str, ...]:
    dirs = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
    return tuple(n for n in names if any(host.exists(f"{d}/{n}") for d in dirs))


def _gpu_domains(host: Host, gpu: Gpu) -> set[str] | None:
    """Thunderbolt domains the eGPU's root port is tied to by the kernel, or None if untied.

    On USB4 hosts whose ACPI names a `usb4-host-interface` for a PCIe root port, the kernel adds
    a device link root port -> NHI (drivers/thunderbolt/acpi.c, tb_acpi_add_link), seen as
    `supplier:pci:<nhi>` under the root port; the NHI's children are its domains. This ties the
    GPU to a controller, never to one router: sysfs does not expose tunnels.
    """
    if not gpu.bridges:
        return None
    root_port = gpu.bridges[0]
    domains: set[str] = set()
    for link in host.glob(f"/sys/bus/pci/devices/{root_port}", "supplier:pci:*"):
        nhi = link.rsplit("supplier:pci:", 1)[1]
        if _PCI_FN.match(nhi):
            domains |= {
                p.rsplit("/", 1)[1] for p in host.glob(f"/sys/bus/pci/devices/{nhi}", "domain*")
            }
    return domains or None


def _domain_name(dev: TbDevice) -> str:
    # Router "1-3" lives in domain1 (Linux Documentation/ABI/testing/sysfs-bus-thunderbolt).
    return dev.domain or f"domain{(dev.sysfs_name or '').split('-', 1)[0]}"


def enclosure_of(host: Host, facts: HostFacts, gpu: Gpu) -> tuple[TbDevice | None, str | None]:
    """The Thunderbolt device to de-authorize, or None and why none.

    De-authorizing the wrong device drops a dock's network and displays, so a device counts as
    the enclosure only when the eGPU is known to sit on Thunderbolt/USB4 and exactly one
    peripheral is (or may be) authorized, narrowed to the eGPU's domain where the kernel links
    it: the GPU's tunnel needs every router on its path authorized, so a sole candidate carries
    it. Residual assumption: detect's `connection` is right. Connection "unknown", two
    candidates (a dock, a daisy chain): None, and only the PCI device is removed.
    """
    if gpu.connection not in ("thunderbolt", "usb4"):
        return None, (
            f"the eGPU's link is '{gpu.connection}', so no Thunderbolt device can be tied to it"
            if gpu.connection == "unknown"
            else None
        )
    candidates = [
        d
        for d in facts.thunderbolt.devices
        if d.sysfs_name and not d.sysfs_name.endswith("-0") and d.authorized is not False
    ]
    domains = _gpu_domains(host, gpu)
    if domains is not None:
        candidates = [d for d in candidates if _domain_name(d) in domains]
    if len(candidates) == 1 and candidates[0].authorized is True:
        return candidates[0], None
    if not candidates:
        return None, "no authorized Thunderbolt device is listed"
    names = ", ".join(f"{d.sysfs_name} ({d.name or '?'})" for d in candidates)
    return None, f"several Thunderbolt devices could carry it: {names}"


# -- planning -------------------------------------------------------------------------------------


def plan_eject(host: Host, facts: HostFacts) -> EjectPlan:
    """What eject would do on this host, and what blocks it. Reads only."""
    gpu = facts.egpu
    if gpu is None:
        many = [g for g in facts.nvidia_gpus if g.external]
        raise EgpuSetupError(
            "several external NVIDIA GPUs are attached; eject handles one"
            if many
            else "no external NVIDIA GPU is attached: nothing to eject",
            "see `egpu-setup detect`",
        )
    if not _PCI_FN.match(gpu.pci_address):
        raise UsageError(f"eGPU address {gpu.pci_address!r} is not a PCI address", "re-run detect")
    functions = card_functions(host, gpu.pci_address)
    only_gpu = len(facts.nvidia_gpus) == 1
    displays = driven_displays(host, functions)
    users = gpu_users(host, functions, gpu_minor(host, gpu.pci_address), only_gpu)
    steps: list[EjectStep] = []
    notes: list[str] = []

    if _persistenced_running(host):
        units = _installed_units(host, PERSISTENCED_UNITS)
        if units:
            steps.append(
                EjectStep(
                    "command",
                    "stop nvidia-persistenced (it holds /dev/nvidia*)",
                    argv=("systemctl", "stop", *units),
                )
            )
        else:
            users += ("nvidia-persistenced runs outside systemd (stop it yourself)",)
    if only_gpu:
        modules = loaded_nvidia_modules(host)
        if modules:
            steps.append(
                EjectStep(
                    "command", f"unload {', '.join(modules)}", argv=("modprobe", "-r", *modules)
                )
            )
    else:
        notes.append(
            "another NVIDIA GPU stays: the driver stays loaded; removal unbinds this card only"
        )
    # Function 0 last: the others (audio, USB-C) hang off the same card.
    for fn in sorted(functions, key=lambda f: (f == gpu.pci_address, f)):
        steps.append(
            EjectStep(
                "write",
                f"remove PCI function {fn}",
                path=f"/sys/bus/pci/devices/{fn}/remove",
                value="1\n",
            )
        )
    enclosure, untied = enclosure_of(host, facts, gpu)
    if enclosure is not None and enclosure.sysfs_name:
        domain = _domain_name(enclosure)
        if host.read_attr(f"/sys/bus/thunderbolt/devices/{domain}/deauthorization") == "1":
            steps.append(
                EjectStep(
                    "write",
                    f"de-authorize Thunderbolt device {enclosure.sysfs_name}"
                    f" ({enclosure.name or 'enclosure'})",
                    path=f"/sys/bus/thunderbolt/devices/{enclosure.sysfs_name}/authorized",
                    value="0\n",
                )
            )
        else:
            notes.append(f"{domain} cannot de-authorize devices; the tunnel closes when unplugged")
    elif untied is not None:
        notes.append(
            f"{untied}: only the PCI device is removed; the Thunderbolt enclosure stays "
            "authorized (the tunnel closes when it is unplugged)"
        )
    return EjectPlan(gpu, functions, displays, users, tuple(steps), tuple(notes))


# -- acting ---------------------------------------------------------------------------------------


def run_eject(
    host: Host, plan: EjectPlan, say: Callable[[str], None] = log.info
) -> tuple[EjectStep, ...]:
    """Carry the plan out, step by step; returns the steps done. Refuses while blocked."""
    if host.kind == "recorded":
        raise UsageError("a recorded host cannot be changed", "run eject on the machine itself")
    if plan.blockers:
        raise BusyError(
            f"not safe to unplug {plan.gpu.name or 'the eGPU'} ({plan.gpu.pci_address}): "
            + "; ".join(plan.blockers),
            "close those programs (or move the display to another GPU), "
            "then re-run `egpu-setup eject`",
        )
    done = []
    for step in plan.steps:
        say(step.description)
        if step.kind == "write":
            host.write_attr(step.path, step.value)
        elif host.kind == "root":
            # A directory image has no running services or kernel: nothing to stop or unload.
            say(f"  skipped under --root: {' '.join(step.argv)}")
            continue
        else:
            res = host.run(step.argv, timeout=60)
            if not res.ok:
                raise ExecutionError(
                    f"`{' '.join(step.argv)}` failed (exit {res.rc}); "
                    "the eGPU is NOT safe to unplug",
                    "see the message above; a process may still hold the driver "
                    "(`fuser -v /dev/nvidia*`)",
                    argv=step.argv,
                    rc=res.rc,
                    stderr_tail=res.err[-2000:],
                )
        done.append(step)
    return tuple(done)
