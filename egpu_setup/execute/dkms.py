"""After the driver's packages: a DKMS-built module for every kernel the target boots.

Debian's dkms postinst (/usr/lib/dkms/common.postinst) builds for `uname -r` and, in a chroot
whose `uname -r` has no /lib/modules ("It is likely that ... belongs to a chroot's host"), for
the kernels it finds, but an upgrade builds only for the newest, and a kernel whose headers are
missing is skipped with a message and no error. So after apt, `dkms status` is read for each
kernel with headers (/lib/modules/<release>/build/include) and `dkms autoinstall -k <release>`
runs where a module is missing; a module still missing then is an error naming the kernel.
"""

from __future__ import annotations

from egpu_setup.detect.kernels import DkmsEntry, parse_dkms_status
from egpu_setup.errors import ExecutionError
from egpu_setup.execute.console import show_line
from egpu_setup.host.machine import Host
from egpu_setup.log import get_logger

log = get_logger("egpu_setup.execute")

# one kernel's NVIDIA module: 2.5-5 min on 2 cores, measured in a Debian 12 image
DKMS_BUILD_TIMEOUT_S = 3600


def missing_kernels(entries: list[DkmsEntry], kernels: list[str], prefix: str) -> list[str]:
    """The kernels among `kernels` for which no module whose name starts with `prefix` is
    installed; [] when DKMS knows no such module (nothing of ours to build)."""
    ours = [e for e in entries if e.module.startswith(prefix)]
    if not ours:
        return []
    have = {e.kernel for e in ours if e.state.startswith("installed")}
    return [k for k in kernels if k not in have]


def kernels_with_headers(host: Host) -> list[str]:
    from egpu_setup.host.image_root import boot_kernels

    return [k for k in boot_kernels(host) if host.is_dir(f"/lib/modules/{k}/build/include")]


def ensure_modules(host: Host, prefix: str = "nvidia") -> list[str]:
    """Build the DKMS module for every kernel with headers that lacks it; the kernels built.

    ExecutionError when `dkms autoinstall` fails or the module is still missing after it."""
    if host.which("dkms") is None:
        return []
    kernels = kernels_with_headers(host)
    status = host.run(["dkms", "status"], timeout=120)
    todo = missing_kernels(parse_dkms_status(status.out), kernels, prefix)
    for kernel in todo:
        log.warning("building the NVIDIA module for kernel %s (dkms autoinstall)", kernel)
        host.run_checked(
            ["dkms", "autoinstall", "-k", kernel], timeout=DKMS_BUILD_TIMEOUT_S, on_line=show_line
        )
    if todo:
        again = parse_dkms_status(host.run(["dkms", "status"], timeout=120).out)
        still = missing_kernels(again, todo, prefix)
        if still:
            raise ExecutionError(
                f"DKMS built no {prefix} module for kernel {', '.join(still)}",
                "see the dkms output above (its make.log path); check that the kernel's "
                "headers match it (`dpkg -l 'linux-headers-*'`)",
                argv=["dkms", "status"],
            )
    return todo
