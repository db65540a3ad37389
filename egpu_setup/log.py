"""Loggers that import `logging` only when a message could be shown.

`logging` brings threading, traceback, string and weakref with it: 3 ms of the 50 that `detect`
takes, and a run without -v shows no debug or info line. While `logging` is not imported, it is
also not configured: its root level is still WARNING, so a debug or info record would be dropped,
and dropping it here without the import is the same outcome. Once anything has imported it (the
command line does for -v and -q, cli.py; a test's log capture does), every call goes to the real
logger. Each module keeps the usual one-liner, `log = get_logger("egpu_setup.x")`.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from typing import Any


class _Deferred:
    """Stands in for logging.getLogger(name)."""

    def __init__(self, name: str):
        self._name = name

    def _logger(self) -> logging.Logger:
        import logging

        return logging.getLogger(self._name)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        if "logging" in sys.modules:
            self._logger().debug(msg, *args, **_caller(kwargs))

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        if "logging" in sys.modules:
            self._logger().info(msg, *args, **_caller(kwargs))

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._logger().warning(msg, *_shown(args), **_caller(kwargs))

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._logger().error(msg, *_shown(args), **_caller(kwargs))

    def __getattr__(self, attr: str) -> object:  # exception, isEnabledFor...
        return getattr(self._logger(), attr)


def _shown(args: tuple[object, ...]) -> tuple[object, ...]:
    """A warning's arguments through the terminal sanitizer (egpu_setup/text.py): they name
    files, devices and reports of the machine, and a warning is a line on root's terminal.
    Numbers stay numbers for %d and %.1f."""
    from egpu_setup.text import plain

    return tuple(
        a if isinstance(a, int | float) else plain(a if isinstance(a, str) else str(a))
        for a in args
    )


def _caller(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The record names the line that logged, not this module's (logging's stacklevel)."""
    return {**kwargs, "stacklevel": kwargs.get("stacklevel", 1) + 1}


def get_logger(name: str) -> logging.Logger:
    """A logger named `name` that imports `logging` when a record could be shown."""
    return _Deferred(name)  # type: ignore[return-value]
