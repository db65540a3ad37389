"""`egpu-setup render --out DIR`: a rendered set written under DIR at its host paths.

Everything is rendered (and validated) before the first file is written; each file is replaced
atomically through the one writer (state/output.py): no host path leads outside DIR, a link at
DIR or anywhere below it (planted before, or swapped in while rendering) is refused, and a DIR
a user owns gets files that user owns.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from egpu_setup.errors import UsageError
from egpu_setup.render.files import RenderedFile, RenderedLink
from egpu_setup.state.output import OutputTree


def open_out(out_dir: Path) -> OutputTree:
    """The --out folder, checked by the trust rule before the first write."""
    if out_dir.exists() and not out_dir.is_symlink() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: not a directory", "pass a directory path")
    return OutputTree.open(out_dir, what="--out")


def write_tree(out: OutputTree, files: Sequence[RenderedFile]) -> list[Path]:
    """Write every file at out/<host path>; everything is rendered before this is called."""
    targets = [out.path / f.path.lstrip("/") for f in files]
    written = []
    try:
        for f, target in zip(files, targets, strict=True):
            written.append(out.write(target, f.content.encode("utf-8"), f.mode))
    except OSError as exc:
        raise UsageError(
            f"cannot write under {out.path}: {exc.strerror or exc}",
            "choose a directory you can write to",
        ) from exc
    return written


def write_links(out: OutputTree, links: Sequence[RenderedLink]) -> list[Path]:
    """Create each symlink at out/<host path>, pointing to its host target (which need not
    exist here: the Xorg link's target appears on the host at boot)."""
    made = []
    try:
        for ln in links:
            made.append(out.link(out.path / ln.path.lstrip("/"), ln.target))
    except OSError as exc:
        raise UsageError(
            f"cannot write under {out.path}: {exc.strerror or exc}",
            "choose a directory you can write to",
        ) from exc
    return made
