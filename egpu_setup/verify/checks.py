"""One verify check: the `checks[]` entry of the verify JSON contract (docs/design.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# pass / warn: ok is true (warn = worth a look: throttling, a link below its max);
# fail: ok is false; skip: not applicable here (ok is null, what `egpu-setup report` reads as
# "skipped"); info: a measurement that is no verdict (a CPU's bf16 throughput, the AMP speedup
# on a CPU, a tuning gain): ok is true and `informational` says it was not judged.
STATUSES = ("pass", "warn", "fail", "skip", "info")

# Every id a verify can report, for a table whose columns line up before the run has ended.
KNOWN_IDS = (
    "previous-run", "gpu-present", "driver-loaded", "driver-versions-agree",
    "nvidia-smi-lists-gpu", "torch-import", "torch-cuda-build", "torch-driver-cuda",
    "cuda-available", "device-is-egpu", "arch-list", "large-allocation", "pcie-link",
    "h2d-bandwidth", "d2h-bandwidth", "matmul-fp32", "matmul-tf32", "matmul-fp16",
    "matmul-bf16", "amp-training", "amp-speedup", "cudnn-benchmark", "h2d-pinned",
    "train-throughput", "burn-in", "gpu-temperature", "gpu-power", "gpu-throttle", "ddp",
    "verify-child", "cuda-device",
)  # fmt: skip
ID_WIDTH = max(len(i) for i in KNOWN_IDS)


@dataclass(frozen=True)
class Check:
    id: str
    status: str
    detail: str
    value: Any = None
    expected: Any = None
    seconds: float | None = None
    hint: str | None = None

    @property
    def ok(self) -> bool | None:
        return None if self.status == "skip" else self.status != "fail"

    @property
    def informational(self) -> bool:
        return self.status == "info"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ok": self.ok,
            "status": self.status,
            "detail": self.detail,
            "value": self.value,
            "expected": self.expected,
            "seconds": self.seconds,
            "hint": self.hint,
            "informational": self.informational,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Check:
        """A check line written by the child; anything malformed becomes a failed check."""
        status = rec.get("status")
        cid = rec.get("id")
        if not isinstance(cid, str) or status not in STATUSES:
            return cls("child-protocol", "fail", f"unreadable result from the child: {dict(rec)!r}")
        seconds = rec.get("seconds")
        return cls(
            id=cid,
            status=str(status),
            detail=str(rec.get("detail") or ""),
            value=rec.get("value"),
            expected=rec.get("expected"),
            seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
            hint=rec.get("hint") if isinstance(rec.get("hint"), str) else None,
        )
