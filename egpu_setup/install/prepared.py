"""The values between the install stages: a Prepared plan, and the Outcome of applying it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from egpu_setup.detect.facts import HostFacts
from egpu_setup.errors import EXIT_FAILED, EXIT_OK, EXIT_REBOOT
from egpu_setup.execute.executor import ExecResult
from egpu_setup.host.machine import Host
from egpu_setup.install.options import InstallOptions
from egpu_setup.plan.options import PlanOptions
from egpu_setup.plan.steps import Plan
from egpu_setup.profile.types import Profile
from egpu_setup.render.files import RenderSet
from egpu_setup.resolve.resolution import Resolution
from egpu_setup.state.paths import StatePaths

if TYPE_CHECKING:
    from egpu_setup.install.advice import Advice
    from egpu_setup.install.attention import PersonAction
    from egpu_setup.install.day_after import VerifySeen

NOTHING_TO_DO = "Nothing to do: this machine already matches the profile."


@dataclass(frozen=True)
class Prepared:
    """Everything a plan was made from, and the plan: what show prints and apply executes."""

    options: InstallOptions
    facts: HostFacts
    profile: Profile
    resolution: Resolution
    rendered: RenderSet
    plan: Plan
    target: Host
    paths: StatePaths
    plan_options: PlanOptions
    warnings: tuple[str, ...]
    # another run held the lock while this was planned: said among the warnings of a dry run,
    # and not under the lock, where the holder is this very run
    stale_warning: str | None = None
    # what a person must do (install/attention.py), and the key a Secure Boot check reads
    actions: tuple[PersonAction, ...] = ()
    mok_key: str | None = None
    # the detected eGPU is not the profile's card (render/context.profile_card_mismatch)
    mismatch: str | None = None
    # the plan summary's lines: power, NUMA, how to use torch, a re-login (install/advice.py)
    advice: tuple[Advice, ...] = ()


@dataclass(frozen=True)
class Outcome:
    """What applying a plan did: the steps' results (none when there was nothing to do) and the
    quick verify that followed (None when it did not run)."""

    prepared: Prepared
    result: ExecResult | None = None
    verify: dict[str, Any] | None = None
    message: str | None = None
    # nothing to do after the reboot an install asked for: what the boot-time verify found
    seen: VerifySeen | None = None

    @property
    def reboot_required(self) -> str | None:
        return self.result.reboot_required if self.result is not None else None

    @property
    def verify_failed(self) -> bool:
        return self.verify is not None and not self.verify.get("ok")

    @property
    def exit_code(self) -> int:
        """1: installed, but the eGPU does not train (a failed install); 3: a reboot is due."""
        if self.verify_failed:
            return EXIT_FAILED
        return EXIT_REBOOT if self.reboot_required else EXIT_OK
