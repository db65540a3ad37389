"""Tab completion for bash: the script bash sources, and the answers it asks this program for.

The protocol is the bash side of the one egpu-setup spoke when it was built on Click, so a
completion file that scripts/install.sh wrote earlier keeps working (zsh and fish, which Click
also served, are refused with a hint): `_EGPU_SETUP_COMPLETE=bash_source` prints
the script; the script calls back with `_EGPU_SETUP_COMPLETE=bash_complete`, the words typed so
far in COMP_WORDS and the index of the one being completed in COMP_CWORD, and reads one
`kind,value` line per candidate (kind plain: a word; file or dir: the shell completes a path).
Every answer comes from the commands' own declarations (commands/_cli.py), so it cannot drift
from what the parser takes.
"""

from __future__ import annotations

import shlex
import sys
from typing import TYPE_CHECKING

from egpu_setup.commands._cli import Argument, Command, Group, Option

if TYPE_CHECKING:
    from collections.abc import Mapping

    from egpu_setup.commands._cli import Completion

SCRIPT = """\
# bash completion for egpu-setup (written by `_EGPU_SETUP_COMPLETE=bash_source egpu-setup`)
_egpu_setup_completion() {
    local IFS=$'\\n' line kind
    local response
    response=$(env COMP_WORDS="${COMP_WORDS[*]}" COMP_CWORD="$COMP_CWORD" \\
        _EGPU_SETUP_COMPLETE=bash_complete "$1")
    COMPREPLY=()
    for line in $response; do
        kind=${line%%,*}
        case $kind in
            dir) compopt -o dirnames ;;
            file) compopt -o default ;;
            plain) COMPREPLY+=("${line#*,}") ;;
        esac
    done
    return 0
}
complete -o nosort -F _egpu_setup_completion egpu-setup
"""


def answer(root: Group, env: Mapping[str, str]) -> int:
    """Print the script or the candidates, as `_EGPU_SETUP_COMPLETE` asks; the exit status."""
    mode = env.get("_EGPU_SETUP_COMPLETE", "")
    if mode == "bash_source":
        print(SCRIPT, end="")
        return 0
    if mode != "bash_complete":
        print(f"error: _EGPU_SETUP_COMPLETE={mode!r} is not a completion request", file=sys.stderr)
        print("hint: bash_source prints the script; unset the variable to run", file=sys.stderr)
        return 2
    try:
        words = shlex.split(env.get("COMP_WORDS", ""))
    except ValueError:  # an open quote: complete what is there
        words = env.get("COMP_WORDS", "").split()
    cword = int(env["COMP_CWORD"]) if env.get("COMP_CWORD", "").isdigit() else len(words)
    typed = words[1:cword]
    incomplete = words[cword] if cword < len(words) else ""
    for kind, value in candidates(root, typed, incomplete):
        print(f"{kind},{value}")
    return 0


def candidates(root: Group, typed: list[str], incomplete: str) -> list[Completion]:
    """What may come next after `typed` (the words before the cursor), starting `incomplete`."""
    cmd: Command = root
    positional = 0
    i = 0
    while i < len(typed):
        word = typed[i]
        i += 1
        opt = _option(cmd, word)
        if opt is not None:
            if not opt.is_flag and "=" not in word:
                i += 1  # its value
            continue
        if word.startswith("-"):
            continue
        if isinstance(cmd, Group):
            sub = cmd.get_command(word)
            if sub is None:
                return []
            cmd, positional = sub, 0
        else:
            positional += 1
    previous = _option(cmd, typed[-1]) if typed else None
    if previous is not None and not previous.is_flag and "=" not in typed[-1]:
        return _values(previous, incomplete)
    if incomplete.startswith("-"):
        used = {o for w in typed if (o := _option(cmd, w)) is not None and not o.multiple}
        names = [n for n, (p, _on) in cmd.options_by_name().items() if p not in used]
        return [("plain", n) for n in [*names, "--help"] if n.startswith(incomplete)]
    if isinstance(cmd, Group):
        return [("plain", n) for n in cmd.list_commands() if n.startswith(incomplete)]
    arguments = [p for p in cmd.params if isinstance(p, Argument)]
    if arguments:
        arg = arguments[min(positional, len(arguments) - 1)]
        complete = getattr(arg.type, "complete", None)
        return complete(incomplete) if complete else []
    return []


def _option(cmd: Command, word: str) -> Option | None:
    found = cmd.options_by_name().get(word.partition("=")[0])
    return found[0] if found else None


def _values(opt: Option, incomplete: str) -> list[Completion]:
    if opt.shell_complete is not None:
        return opt.shell_complete(incomplete)
    complete = getattr(opt.type, "complete", None)
    return complete(incomplete) if complete else []
