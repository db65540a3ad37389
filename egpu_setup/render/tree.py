"""`egpu-setup render --out DIR`: a rendered set written under DIR at its host paths.

Everything is rendered (and validated) before the first file is written; each file is replaced
atomically, and no host path may lead outside DIR.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from egpu_setup.errors import UsageError
from egpu_setup.host.machine import refuse_links_below
from egpu_setup.render.files import RenderedFile, RenderedLink
from egpu_setup.state.atomic import atomic_symlink, atomic_write


def write_tree(out_dir: Path, files: Sequence[RenderedFile]) -> list[Path]:
    """Write every file at out_dir/<host path>; everything is rendered before this is called."""
    out_dir = out_dir.absolute()
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: not a directory", "pass a directory path")
    targets = [out_dir / f.path.lstrip("/") for f in files]
    for f, target in zip(files, targets, strict=False):
        if out_dir not in target.parents:  # host paths are ours, but never write outside --out
            raise UsageError(
                f"refusing to write {f.path} outside {out_dir}", "report this as a bug"
            )
        refuse_links_below(out_dir, target)
    written = []
    try:
        for f, target in zip(files, targets, strict=False):
            atomic_write(target, f.content.encode("utf-8"), f.mode)
            written.append(target)
    except OSError as exc:
        raise UsageError(
            f"cannot write under {out_dir}: {exc.strerror or exc}",
            "choose a directory you can write to",
        ) from exc
    return written


def write_links(out_dir: Path, links: Sequence[RenderedLink]) -> list[Path]:
    """Create each symlink at out_dir/<host path>, pointing to its host target (which need not
    exist here: the Xorg link's target appears on the host at boot)."""
    out_dir = out_dir.absolute()
    made = []
    try:
        for ln in links:
            target = out_dir / ln.path.lstrip("/")
            if out_dir not in target.parents:
                raise UsageError(
                    f"refusing to link {ln.path} outside {out_dir}", "report this as a bug"
                )
            refuse_links_below(out_dir, target)
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_symlink(target, ln.target)
            made.append(target)
    except OSError as exc:
        raise UsageError(
            f"cannot write under {out_dir}: {exc.strerror or exc}",
            "choose a directory you can write to",
        ) from exc
    return made
