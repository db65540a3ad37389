"""The error family: every expected failure carries what went wrong, one next step, an exit code."""

from __future__ import annotations

TYPE_CHECKING = False  # `--help` imports this module; collections.abc is 1 ms it does not need
if TYPE_CHECKING:
    from collections.abc import Sequence

# Exit codes are a contract (docs/design.md, "Exit codes").
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REBOOT = 3
EXIT_ACTION = 4
EXIT_BUSY = 5
EXIT_INTERRUPTED = 130


class EgpuSetupError(Exception):
    """An expected failure: printed as `error: …` / `hint: …`, never as a traceback."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class Aborted(Exception):
    """A person answered no at a prompt, or closed its input: exit 130, as for Ctrl-C."""


class UsageError(EgpuSetupError):
    """Bad input: an unknown profile, a malformed file or value, a path that is not there."""

    exit_code = EXIT_USAGE


class UnsupportedHardware(EgpuSetupError):
    """The machine or GPU is outside what egpu-setup can provision (macOS, AMD for CUDA...)."""

    exit_code = EXIT_USAGE


class MatrixError(EgpuSetupError):
    """No driver/CUDA/torch combination satisfies the facts and the constraints."""

    exit_code = EXIT_USAGE


class BusyError(EgpuSetupError):
    """Another run or the package manager holds a lock."""

    exit_code = EXIT_BUSY


class ActionRequired(EgpuSetupError):
    """A person must act (firmware setting, MOK enrolment at the console)."""

    exit_code = EXIT_ACTION


class ExecutionError(EgpuSetupError):
    """A command of the plan failed; carries its argv, exit status and the tail of stderr."""

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        argv: Sequence[str] = (),
        rc: int | None = None,
        stderr_tail: str = "",
        exit_code: int | None = None,
    ):
        super().__init__(message, hint, exit_code=exit_code)
        self.argv = list(argv)
        self.rc = rc
        self.stderr_tail = stderr_tail


class TimedOut(ExecutionError):
    """A command missed its deadline and was ended (its session killed, host/process.py)."""

    def __init__(
        self, message: str, hint: str | None = None, *, argv: Sequence[str], timeout: float
    ):
        super().__init__(message, hint, argv=argv)
        self.timeout = timeout
