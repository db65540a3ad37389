"""Where a profile is wrong: `file:line:column: key.path: problem`, with a hint."""

from __future__ import annotations

from dataclasses import dataclass, field

from egpu_setup.errors import UsageError

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Mark:
    file: str
    line: int  # 1-based
    column: int  # 1-based


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a profile, where it is, and what to do about it."""

    mark: Mark
    path: KeyPath
    message: str
    hint: str

    def text(self) -> str:
        where = f"{self.mark.file}:{self.mark.line}:{self.mark.column}"
        key = format_path(self.path)
        return f"{where}: {key}: {self.message}" if key else f"{where}: {self.message}"

    def error(self, others: int = 0) -> UsageError:
        more = f" (and {others} more problem{'s' if others != 1 else ''})" if others else ""
        return UsageError(self.text() + more, self.hint)


def format_path(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass
class Marks:
    """Where each key and each value of a document starts."""

    file: str
    keys: dict[KeyPath, Mark] = field(default_factory=dict)
    values: dict[KeyPath, Mark] = field(default_factory=dict)

    def value(self, path: KeyPath) -> Mark:
        # The closest enclosing value that has a mark (a missing key is reported on its parent).
        for i in range(len(path), -1, -1):
            if path[:i] in self.values:
                return self.values[path[:i]]
        return Mark(self.file, 1, 1)

    def key(self, path: KeyPath) -> Mark:
        return self.keys.get(path) or self.value(path)


class ProblemError(Exception):
    def __init__(self, problem: Problem):
        super().__init__(problem.text())
        self.problem = problem
