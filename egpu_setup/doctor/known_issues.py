"""Known-bad combinations of GPU and link (data/known_issues.yaml): which one this host has.

Pure over HostFacts: detect prints the hits, doctor reports them as `known-egpu-issue`, install
warns in its plan. The data says what the public reports confirm and what is inference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from egpu_setup.detect.facts import Gpu, HostFacts


@dataclass(frozen=True)
class KnownIssue:
    """A known-bad combination of GPU architecture and link, with its sources."""

    id: str
    architectures: tuple[str, ...]
    connections: tuple[str, ...]
    generations: tuple[str, ...]
    summary: str
    confirmed: str
    mitigation: str
    sources: tuple[str, ...]

    def matches(self, gpu: Gpu) -> bool:
        def ok(allowed: tuple[str, ...], value: str | None) -> bool:
            return not allowed or value in allowed

        return (
            gpu.vendor == "nvidia"
            and gpu.external is not False
            and ok(self.architectures, gpu.architecture)
            and ok(self.connections, gpu.connection)
            and ok(self.generations, gpu.connection_generation)
        )


@dataclass(frozen=True)
class IssueHit:
    """A known issue that matches a GPU of this machine."""

    issue: KnownIssue
    gpu: Gpu

    def where(self) -> str:
        link = self.gpu.connection + (
            f" ({self.gpu.connection_generation})" if self.gpu.connection_generation else ""
        )
        return f"{self.gpu.name or 'NVIDIA GPU'} at {self.gpu.pci_address} via {link}"

    def text(self) -> str:
        """One line for detect and install: what, on which GPU, where it is reported (doctor's
        `known-egpu-issue` adds what the reports confirm and what helps)."""
        return f"{self.where()}: {self.issue.summary} ({', '.join(self.issue.sources)})"


@functools.cache
def load_issues() -> tuple[KnownIssue, ...]:
    from egpu_setup.compat.shipped import load

    out = []
    for entry in load("known_issues.yaml")["issues"]:
        match = entry["match"]
        out.append(
            KnownIssue(
                id=entry["id"],
                architectures=tuple(match.get("architectures") or ()),
                connections=tuple(match.get("connections") or ()),
                generations=tuple(match.get("generations") or ()),
                summary=entry["summary"].strip(),
                confirmed=entry["confirmed"].strip(),
                mitigation=entry["mitigation"].strip(),
                sources=tuple(entry["sources"]),
            )
        )
    return tuple(out)


def known_issues(facts: HostFacts) -> list[IssueHit]:
    """Every known problem of an NVIDIA GPU here that is (or may be) external, on its link."""
    return [
        IssueHit(issue, gpu)
        for issue in load_issues()
        for gpu in facts.nvidia_gpus
        if gpu.connection != "unknown" and issue.matches(gpu)
    ]
