"""Parse os-release(5) text (/etc/os-release, /usr/lib/os-release).

"KEY=value" lines; values may be quoted with double or single quotes, and inside double quotes
"\\", "$", "`" and '"' are escaped with a backslash (os-release(5), "shell-compatible variable
assignments"). Lines starting with "#" and blank lines are ignored, and so are lines that are not
assignments: a broken file yields the keys that can be read, never an exception.
"""

from __future__ import annotations

import re

__all__ = ["parse_os_release"]

_ASSIGN_RE = re.compile(r"^\s*(?:export\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")


def _unquote(value: str) -> str:
    """Shell-style unquoting as os-release(5) defines it; an unterminated quote runs to the end."""
    out: list[str] = []
    quote: str | None = None
    i = 0
    value = value.strip()
    while i < len(value):
        c = value[i]
        if quote == "'":
            if c == "'":
                quote = None
            else:
                out.append(c)
        elif quote == '"':
            if c == '"':
                quote = None
            elif c == "\\" and i + 1 < len(value) and value[i + 1] in '\\"$`':
                i += 1
                out.append(value[i])
            else:
                out.append(c)
        elif c in "\"'":
            quote = c
        elif c == "\\" and i + 1 < len(value):
            i += 1
            out.append(value[i])
        elif c == "#" and out and out[-1].isspace():
            break  # an unquoted "#" after whitespace starts a comment, as in sh
        else:
            out.append(c)
        i += 1
    return "".join(out).strip()


def parse_os_release(text: str) -> dict[str, str]:
    """KEY -> unquoted value for every assignment line; the last assignment of a key wins."""
    result: dict[str, str] = {}
    if not isinstance(text, str):
        return result
    for line in text.replace("\x00", "").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _ASSIGN_RE.match(line)
        if m:
            result[m.group("key")] = _unquote(m.group("value"))
    return result
