"""The command-line kit every command is declared with: options and arguments as data on the
function they feed, parsed with Click's rules, help and man page rendered from the same data.

Why not Click itself: importing it takes 20 ms on an interpreter that starts in 9 ms, more than
`detect` spends reading the whole machine, and every command paid it before printing a line. This
module needs nothing beyond `os` and `sys`. The rules kept from Click, because users and scripts
learnt them: `--opt VALUE` and `--opt=VALUE`, a value is the next word even when it starts with a
dash, `-abc` is `-a -b -c`, options and arguments in any order, `--` ends the options, no
abbreviations; a repeatable option collects a tuple; `--x/--no-x` pairs.
"""

from __future__ import annotations

import os
import sys

from egpu_setup.errors import Aborted, UsageError

TYPE_CHECKING = False  # typing and collections cost 3 ms of a 10 ms `--help`; mypy reads these
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any, TypeAlias

    # (kind, value) pairs a shell completes with: kind "plain" is a word, "file" and "dir" ask
    # the shell to complete a path from the value typed so far
    Completion: TypeAlias = tuple[str, str]
    Completer: TypeAlias = Callable[[str], list[Completion]]


class BadValue(ValueError):
    """A value a type refused; the parser adds which option it was given to."""


# -- value types ------------------------------------------------------------------------------


class Choice:
    """One of a fixed set of words."""

    def __init__(self, choices: Sequence[str]):
        self.choices = tuple(choices)
        self.metavar = "[" + "|".join(self.choices) + "]"

    def __call__(self, value: str) -> str:
        if value not in self.choices:
            raise BadValue(f"{value!r} is not one of {', '.join(map(repr, self.choices))}.")
        return value

    def complete(self, incomplete: str) -> list[Completion]:
        return [("plain", c) for c in self.choices if c.startswith(incomplete)]


class IntRange:
    """An integer within [lo, hi]."""

    metavar = "INTEGER RANGE"

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi

    def __call__(self, value: str) -> int:
        number = _number(int, value, "integer")
        if not self.lo <= number <= self.hi:
            raise BadValue(f"{number} is not in the range {self.lo}<=x<={self.hi}.")
        return number

    def describe(self) -> str:
        return f"{self.lo}<=x<={self.hi}"


class Path:
    """A path, checked as far as asked: when it exists, it must be readable and of an allowed
    kind; with exists=True it must exist. Unlike Click, an empty string is refused: `record ''`
    would have written into the working directory."""

    def __init__(
        self,
        *,
        exists: bool = False,
        file_okay: bool = True,
        dir_okay: bool = True,
        path_type: type = str,
    ):
        self.exists = exists
        self.file_okay = file_okay
        self.dir_okay = dir_okay
        self.path_type = path_type
        self.metavar = "FILE" if not dir_okay else "DIRECTORY" if not file_okay else "PATH"
        self.kind = self.metavar.capitalize() if self.metavar != "PATH" else "Path"

    def __call__(self, value: str) -> Any:
        if not value:
            raise BadValue("an empty path.")
        if os.path.exists(value):
            if not self.dir_okay and os.path.isdir(value):
                raise BadValue(f"{self.kind} {value!r} is a directory.")
            if not self.file_okay and not os.path.isdir(value):
                raise BadValue(f"{self.kind} {value!r} is not a directory.")
            if not os.access(value, os.R_OK):
                raise BadValue(f"{self.kind} {value!r} is not readable.")
        elif self.exists:
            raise BadValue(f"{self.kind} {value!r} does not exist.")
        return self.path_type(value)

    def complete(self, incomplete: str) -> list[Completion]:
        return [("dir" if not self.file_okay else "file", incomplete)]


def _number(kind: Callable[[str], Any], value: str, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise BadValue(f"{value!r} is not a valid {name}.") from None


def _convert(kind: Callable[[str], Any] | None, value: str) -> Any:
    if kind is None:
        return value
    if kind is int:
        return _number(int, value, "integer")
    if kind is float:
        return _number(float, value, "float")
    return kind(value)


def _metavar(kind: object) -> str:
    if kind is int:
        return "INTEGER"
    if kind is float:
        return "FLOAT"
    return str(getattr(kind, "metavar", "TEXT"))


# -- parameters -------------------------------------------------------------------------------


class Option:
    """`--name VALUE`, a flag, a counted flag or a `--x/--no-x` pair."""

    def __init__(
        self,
        decls: Sequence[str],
        *,
        is_flag: bool = False,
        count: bool = False,
        type: Callable[[str], Any] | None = None,
        default: Any = None,
        show_default: bool = False,
        metavar: str | None = None,
        help: str | None = None,
        multiple: bool = False,
        envvar: str | None = None,
        show_envvar: bool = False,
        callback: Callable[[Any], Any] | None = None,
        shell_complete: Completer | None = None,
        required: bool = False,
    ):
        names = [d for d in decls if d.startswith("-")]
        dests = [d for d in decls if not d.startswith("-")]
        self.on: list[str] = []
        self.off: list[str] = []
        for name in names:
            yes, _, no = name.partition("/")
            self.on.append(yes)
            if no:
                self.off.append(no)
        self.pair = bool(self.off)
        first = next((n for n in self.on if n.startswith("--")), self.on[0])  # Click's choice
        self.dest = dests[0] if dests else first.lstrip("-").replace("-", "_")
        self.is_flag = is_flag or self.pair or count
        self.count = count
        self.type = type
        self.multiple = multiple
        if default is None and (multiple or count or self.is_flag):
            default = () if multiple else 0 if count else False
        self.default = default
        self.show_default = show_default
        self.metavar = metavar or _metavar(type)
        self.help = help or ""
        self.envvar = envvar
        self.show_envvar = show_envvar
        self.callback = callback
        self.shell_complete = shell_complete
        self.required = required

    @property
    def label(self) -> str:
        return max(self.on, key=len)

    def record(self) -> tuple[str, str]:
        """The two columns of this option in help: its names, and what it does."""
        if self.pair:
            names = ", ".join(f"{a} / {b}" for a, b in zip(self.on, self.off, strict=False))
        else:
            names = ", ".join(sorted(self.on, key=lambda n: n.startswith("--")))
        if not self.is_flag:
            names += f" {self.metavar}"
        extra = []
        if self.show_envvar and self.envvar:
            extra.append(f"env var: {self.envvar}")
        if self.show_default:
            shown = self.default
            if self.pair:
                shown = (self.on if self.default else self.off)[0].lstrip("-")
            extra.append(f"default: {shown}")
        if isinstance(self.type, IntRange):
            extra.append(self.type.describe())
        if self.required:
            extra.append("required")
        text = self.help + (f"  [{'; '.join(extra)}]" if extra else "")
        return names, text.strip()


class Argument:
    """A positional value; nargs=-1 takes every remaining one."""

    def __init__(
        self,
        name: str,
        *,
        nargs: int = 1,
        required: bool = True,
        type: Callable[[str], Any] | None = None,
    ):
        self.dest = name
        self.nargs = nargs
        self.required = required
        self.type = type
        self.metavar = name.upper() + ("..." if nargs == -1 else "")


if TYPE_CHECKING:
    Param: TypeAlias = Option | Argument


def option(*decls: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare an option on the function a command calls (as Click's decorator reads)."""
    return _attach(Option(decls, **kwargs))


def argument(name: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return _attach(Argument(name, **kwargs))


def _attach(param: Param) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        # decorators apply bottom-up; inserting at the front keeps the order they are written in
        fn.__dict__.setdefault("__cli_params__", []).insert(0, param)
        return fn

    return deco


# -- commands ---------------------------------------------------------------------------------


class Command:
    """A named function and the parameters that feed it."""

    def __init__(self, name: str, fn: Callable[..., Any], epilog: str | None = None):
        self.name = name
        self.callback = fn
        self.params: list[Param] = list(fn.__dict__.get("__cli_params__", []))
        self.help = _dedent(fn.__doc__ or "")
        self.epilog = epilog or ""

    @property
    def short_help(self) -> str:
        return self.help.split("\n\n", 1)[0].replace("\n", " ").strip()

    def options_by_name(self) -> dict[str, tuple[Option, bool]]:
        """Every option name, with whether it sets the option on (`--x`) or off (`--no-x`)."""
        by_name: dict[str, tuple[Option, bool]] = {}
        for p in self.params:
            if isinstance(p, Option):
                by_name.update({n: (p, True) for n in p.on})
                by_name.update({n: (p, False) for n in p.off})
        return by_name

    def usage(self) -> str:
        pieces = ["[OPTIONS]"] + [
            p.metavar if p.required else f"[{p.metavar}]"
            for p in self.params
            if isinstance(p, Argument)
        ]
        return " ".join(pieces)

    def main(self, argv: Sequence[str], prog: str) -> Any:
        values = parse(self, list(argv), prog)
        if values is None:
            echo(self.format_help(prog))
            return 0
        return self.callback(**values)

    def format_help(self, prog: str) -> str:
        return render_help(self, prog)


class Group(Command):
    """A command whose first argument names a subcommand."""

    def __init__(self, name: str, fn: Callable[..., Any], epilog: str | None = None):
        super().__init__(name, fn, epilog)
        self.commands: dict[str, Command] = {}

    def command(
        self, name: str, *, epilog: str | None = None
    ) -> Callable[[Callable[..., Any]], Command]:
        def deco(fn: Callable[..., Any]) -> Command:
            self.commands[name] = Command(name, fn, epilog)
            return self.commands[name]

        return deco

    def list_commands(self) -> list[str]:
        return list(self.commands)

    def get_command(self, name: str) -> Command | None:
        return self.commands.get(name)

    def short_helps(self) -> list[tuple[str, str]]:
        return [(n, c.short_help) for n, c in self.commands.items()]

    def usage(self) -> str:
        return "[OPTIONS] COMMAND [ARGS]..."

    def main(self, argv: Sequence[str], prog: str) -> Any:
        words = list(argv)
        split = next((i for i, w in enumerate(words) if not w.startswith("-")), len(words))
        values = parse(self, words[:split], prog)
        if values is None:
            echo(self.format_help(prog))
            return 0
        self.callback(**values)  # the group's own options act first: `--version` exits here
        if split == len(words):
            names = ", ".join(self.list_commands())
            raise UsageError("Missing command.", f"one of {names}; see `{prog} --help`")
        name = words[split]
        sub = self.get_command(name)
        if sub is None:
            hint = f"see `{prog} --help`"
            raise UsageError(
                f"No such command {name!r}.", _suggest(name, self.list_commands(), hint)
            )
        return sub.main(words[split + 1 :], f"{prog} {name}")


def command(
    name: str | None = None, *, epilog: str | None = None
) -> Callable[[Callable[..., Any]], Command]:
    """Make the decorated function a command; its docstring is the help."""
    return lambda fn: Command(name or fn.__name__, fn, epilog)


def group(
    name: str | None = None, *, epilog: str | None = None
) -> Callable[[Callable[..., Any]], Group]:
    """Make the decorated function a group; `@the_group.command(...)` adds its subcommands."""
    return lambda fn: Group(name or fn.__name__, fn, epilog)


# -- parsing ----------------------------------------------------------------------------------


def parse(cmd: Command, words: list[str], prog: str) -> dict[str, Any] | None:
    """The callback's keyword arguments from `words`; None when help was asked for."""
    hint = f"see `{prog} --help`"
    by_name = cmd.options_by_name()
    values: dict[str, Any] = {}
    given: list[tuple[Option, str, str]] = []  # (option, its value as typed, the name used)
    positional: list[str] = []
    asked_for_help = False

    def find(name: str) -> tuple[Option, bool]:
        found = by_name.get(name)
        if found is None:
            raise UsageError(f"No such option {name!r}.", _suggest(name, by_name, hint))
        return found

    def flag(opt: Option, on: bool) -> None:
        values[opt.dest] = values.get(opt.dest, 0) + 1 if opt.count else on

    i = 0

    def following(name: str) -> str:
        nonlocal i
        if i == len(words):
            raise UsageError(f"Option {name!r} requires an argument.", hint)
        i += 1
        return words[i - 1]

    # First every word is sorted out; values are converted only after, so that `--help` is
    # honoured even beside a bad value (as Click does), while an unknown option never is.
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            positional += words[i:]
            break
        if not word.startswith("-") or word == "-":
            positional.append(word)
        elif word.startswith("--"):
            name, eq, inline = word.partition("=")
            if name == "--help" and name not in by_name:
                if eq:
                    raise UsageError("Option '--help' does not take a value.", hint)
                asked_for_help = True
                continue
            opt, on = find(name)
            if opt.is_flag and eq:
                raise UsageError(f"Option {name!r} does not take a value.", hint)
            if opt.is_flag:
                flag(opt, on)
            else:
                given.append((opt, inline if eq else following(name), name))
        else:  # short options: -y, -vv, -xVALUE
            for j in range(1, len(word)):
                name = "-" + word[j]
                if name == "-h" and name not in by_name:
                    asked_for_help = True
                    continue
                opt, on = find(name)
                if not opt.is_flag:
                    given.append((opt, word[j + 1 :] or following(name), name))
                    break
                flag(opt, on)
    if asked_for_help:
        return None

    def take(opt: Option, raw: str, as_name: str) -> None:
        try:
            value = _convert(opt.type, raw)
        except BadValue as exc:
            raise UsageError(f"Invalid value for {as_name!r}: {exc}", hint) from None
        if opt.multiple:
            values[opt.dest] = (*values.get(opt.dest, ()), value)
        else:
            values[opt.dest] = value  # given twice: the last one counts

    for opt, raw, as_name in given:
        take(opt, raw, as_name)
    for p in cmd.params:
        if isinstance(p, Option) and p.dest not in values:
            from_env = os.environ.get(p.envvar) if p.envvar else None
            if from_env:
                take(p, from_env, p.label)
            elif p.required:
                raise UsageError(f"Missing option {p.label!r}.", hint)
            else:
                values[p.dest] = p.default
    for p in cmd.params:
        if not isinstance(p, Argument):
            continue
        if p.nargs == -1:
            got, positional = positional, []
        else:
            got, positional = positional[: p.nargs], positional[p.nargs :]
        if p.required and (not got or (p.nargs > 0 and len(got) < p.nargs)):
            raise UsageError(f"Missing argument {p.metavar!r}.", hint)
        try:
            converted = [_convert(p.type, w) for w in got]
        except BadValue as exc:
            raise UsageError(f"Invalid value for {p.metavar!r}: {exc}", hint) from None
        values[p.dest] = tuple(converted) if p.nargs == -1 else (converted[0] if got else None)
    if positional:
        plural = "s" if len(positional) > 1 else ""
        raise UsageError(f"Got unexpected extra argument{plural} ({' '.join(positional)})", hint)
    for p in cmd.params:
        if isinstance(p, Option) and p.callback is not None:
            values[p.dest] = p.callback(values[p.dest])
    return values


def _suggest(word: str, known: Iterable[str], hint: str) -> str:
    """The hint, led by the known names closest to a mistyped one (as Click suggested them)."""
    import difflib  # only on this error path

    close = difflib.get_close_matches(word, sorted(known), n=3)
    return f"did you mean {' or '.join(close)}? {hint}" if close else hint


# -- help -------------------------------------------------------------------------------------

_HELP_RECORD = ("-h, --help", "Show this message and exit.")


def _width() -> int:
    """Click's: the terminal's columns (COLUMNS first, as shutil reads them), at most 80, less a
    margin of 2; 78 off a terminal."""
    columns = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.stdout.fileno()).columns or 80  # a fresh pty: 0
        except (OSError, ValueError):
            columns = 80
    return max(min(columns, 80) - 2, 50)


def _dedent(text: str) -> str:
    lines = text.expandtabs().splitlines()
    indents = [len(ln) - len(ln.lstrip()) for ln in lines[1:] if ln.strip()]
    cut = min(indents, default=0)
    return "\n".join([lines[0].strip() if lines else ""] + [ln[cut:] for ln in lines[1:]]).strip()


def wrap(text: str, width: int, indent: str = "", first: str | None = None) -> list[str]:
    """Greedy word wrap (no textwrap: it imports re, 5 ms of a `--help`)."""
    lines: list[str] = []
    line = first if first is not None else indent
    fresh = True
    for word in text.split():
        if not fresh and len(line) + 1 + len(word) > width:
            lines.append(line)
            line, fresh = indent, True
        line = line + word if fresh else f"{line} {word}"
        fresh = False
    lines.append(line)
    return lines


def paragraphs(text: str, width: int, indent: str) -> list[str]:
    """Text as help shows it: paragraphs re-wrapped, a `\\b` paragraph kept line by line."""
    out: list[str] = []
    for para in text.strip("\n").split("\n\n"):
        if out:
            out.append("")
        if para.startswith("\b\n"):
            out += [indent + ln if ln else "" for ln in para[2:].splitlines()]
        else:
            out += wrap(para, width, indent)
    return out


def definition_list(rows: Iterable[tuple[str, str]], width: int) -> list[str]:
    """Two columns: the first at most 30 wide; help that does not fit starts on the next line."""
    rows = list(rows)
    first = min(max((len(a) for a, _ in rows), default=0), 30)
    out: list[str] = []
    for name, text in rows:
        column = 2 + first + 2
        if len(name) > first:
            out.append("  " + name)
            if text:
                out += wrap(text, width, " " * column)
            continue
        head = "  " + name.ljust(first) + "  "
        out += wrap(text, width, " " * column, first=head) if text else [head.rstrip()]
    return out


def option_records(cmd: Command) -> list[tuple[str, str]]:
    return [p.record() for p in cmd.params if isinstance(p, Option)] + [_HELP_RECORD]


def render_help(cmd: Command, prog: str) -> str:
    width = _width()
    out = [f"Usage: {prog} {cmd.usage()}"]
    if cmd.help:
        out += ["", *paragraphs(cmd.help, width, "  ")]
    out += ["", "Options:", *definition_list(option_records(cmd), width)]
    if isinstance(cmd, Group):
        out += ["", "Commands:", *definition_list(cmd.short_helps(), width)]
    if cmd.epilog:
        out += ["", *paragraphs(cmd.epilog, width, "  ")]
    return "\n".join(out)


# -- terminal ---------------------------------------------------------------------------------


def echo(message: object = "", *, err: bool = False, nl: bool = True) -> None:
    """One line to stdout (or stderr), flushed: a progress line must show while work goes on."""
    stream = sys.stderr if err else sys.stdout
    stream.write(f"{message}\n" if nl else str(message))
    stream.flush()


def confirm(text: str, *, abort: bool = False, err: bool = False) -> bool:
    """A yes/no question; no (or end of input) is Aborted when `abort`."""
    while True:
        answer = prompt(f"{text} [y/N]", default="", err=err).strip().lower()
        if answer in ("y", "yes"):
            return True
        if answer in ("", "n", "no"):
            if abort:
                raise Aborted()
            return False


def prompt(text: str, *, default: str = "", show_default: bool = False, err: bool = False) -> str:
    """A line from the person at the terminal; end of input is Aborted."""
    stream = sys.stderr if err else sys.stdout
    stream.write(f"{text}{f' [{default}]' if show_default and default else ''}: ")
    stream.flush()
    line = sys.stdin.readline()
    if not line:
        stream.write("\n")
        raise Aborted()
    return line.rstrip("\n") or default
