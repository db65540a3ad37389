"""The hot-plug configuration of an AMD Radeon eGPU: one udev rule, runtime PM off.

amdgpu is part of the kernel and binds the GPU itself, so none of NVIDIA's files apply (nouveau
blacklist, module options, the units that load modules and start nvidia-persistenced). What
does apply is the profile's `hotplug.runtime_pm_off`, written as a rule matched like NVIDIA's
(vendor and device id, `removable` when detect saw it), and reloaded the same way.

Pure: facts and profile in, a RenderSet out; every value is checked (render.checks) first.
"""

from __future__ import annotations

from egpu_setup.detect.facts import Gpu, HostFacts
from egpu_setup.profile.types import Profile
from egpu_setup.render.checks import check_bool, check_choice, check_device_id, check_profile_name
from egpu_setup.render.files import (
    UDEV_RULES,
    HostCommand,
    RenderedFile,
    RenderSet,
    render_template,
)
from egpu_setup.render.headers import add_header

AMD_VENDOR = "1002"


def amd_cards(facts: HostFacts) -> tuple[Gpu, ...]:
    """The AMD eGPU the rule is for: the detected eGPU when it is AMD's, else every external
    AMD GPU; empty when none is seen (the profile's device ids are used then)."""
    if facts.egpu is not None:
        return (facts.egpu,) if (facts.egpu.vendor_id or "").lower() == AMD_VENDOR else ()
    return tuple(g for g in facts.gpus if (g.vendor_id or "").lower() == AMD_VENDOR and g.external)


def render_amd_set(facts: HostFacts, profile: Profile, mode: str) -> RenderSet:
    """The AMD eGPU's files and the command they owe; nothing when the profile keeps runtime PM."""
    name = check_profile_name(profile.name)
    mode = check_choice(mode, ("compute", "display"), "mode")
    if not check_bool(profile.hotplug.runtime_pm_off, "profile hotplug.runtime_pm_off"):
        return RenderSet(files=(), commands=(), notes=())
    cards = amd_cards(facts)
    seen = [c.device_id for c in cards if c.device_id]
    ids = sorted({check_device_id(i, "profile gpu.device_ids") for i in profile.gpu.device_ids})
    ids = sorted({*ids, *(check_device_id(i, "detected eGPU device id") for i in seen)})
    body = render_template(
        "udev/71-egpu-setup-amd.rules.j2",
        device_ids=ids,
        match_removable=bool(cards) and all(c.removable == "removable" for c in cards),
    )
    rule = RenderedFile(
        UDEV_RULES,
        add_header(body, name, mode),
        0o644,
        "AMD eGPU udev rule: runtime PM off when it appears",
    )
    reload = HostCommand(
        ("udevadm", "control", "--reload"), "load the new udev rules", (UDEV_RULES,)
    )
    return RenderSet(files=(rule,), commands=(reload,), notes=())
