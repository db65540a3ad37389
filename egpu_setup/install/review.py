"""The plan reviewed before it is shown: what a person must do, whether the profile is for this
card, the known problems of this GPU on its link, and the summary's advice.

One call from prepare (install/pipeline.py), so the dry run and the real run say the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from egpu_setup.detect.facts import HostFacts
from egpu_setup.host.machine import Host
from egpu_setup.install.advice import Advice
from egpu_setup.install.attention import PersonAction
from egpu_setup.plan.steps import Plan
from egpu_setup.profile.types import Profile
from egpu_setup.resolve.resolution import Resolution


@dataclass(frozen=True)
class Review:
    actions: tuple[PersonAction, ...]
    mok_key: str | None
    mismatch: str | None
    advice: tuple[Advice, ...]
    warnings: tuple[str, ...]


def review(
    facts: HostFacts,
    profile: Profile,
    resolution: Resolution,
    plan: Plan,
    target: Host,
    *,
    mode: str,
    only: frozenset[str],
    venv: str,
) -> Review:
    from egpu_setup.doctor.known_issues import known_issues
    from egpu_setup.install.advice import card_for, plan_advice, power_limit, profile_for_card
    from egpu_setup.install.attention import image_actions, manager_actions, mok_action
    from egpu_setup.render.context import detected_cards, profile_card_mismatch

    actions, warnings = manager_actions(target, mode, only)
    mok, key = mok_action(facts, plan, target) if "driver" in only else (None, None)
    if mok is not None:
        actions.append(mok)
    actions += image_actions(facts, plan, profile.hotplug, target, only)
    mismatch = None
    if only & {"driver", "config"} or resolution.torch is None or resolution.torch.variant != "cpu":
        mismatch = profile_card_mismatch(profile, detected_cards(facts))
    if mismatch:
        warnings.append(
            f"{mismatch}: the plan and the udev rules are for the detected card; --yes refuses "
            "it without --force"
        )
    warnings += [hit.text() for hit in known_issues(facts)]
    card = card_for(facts, resolution)
    advice = plan_advice(
        facts,
        profile,
        card,
        power_limit(target, facts, card),
        card_profile=profile_for_card(card) if mismatch else None,
        venv=venv,
        mode=mode,
        only=only,
        torch_planned=resolution.torch is not None,
    )
    return Review(tuple(actions), key, mismatch, advice, tuple(warnings))
