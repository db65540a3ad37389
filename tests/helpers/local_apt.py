"""Packages built inside a Debian root with its own dpkg-deb, and a flat apt repository of them
at file:/tmp/repo in that root (its lists fetched): what rollback --packages and the apt kill
tests install, with no mirror involved."""

from __future__ import annotations

from pathlib import Path

from helpers.debroot import chroot


def build_deb(
    root: Path,
    name: str,
    depends: str = "",
    prerm: str = "",
    files: tuple[str, ...] = (),
    arch: str = "all",
    multi_arch: str = "",
    postinst: str = "",
    version: str = "1.0",
    source: str = "",
    texts: dict[str, str] | None = None,
    triggers: str = "",
) -> Path:
    """A package built in the root with its own dpkg-deb: `depends`, prerm and postinst scripts,
    `files` (a path ending in / is an empty directory), `texts` (path -> content), the `source`
    package it says it is built from, its `triggers` control file (deb-triggers(5))."""
    build = root / "tmp" / "build" / f"{name}_{version}_{arch}"
    (build / "DEBIAN").mkdir(parents=True)
    control = (
        f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\n"
        + (f"Source: {source}\n" if source else "")
        + "Maintainer: Lab <lab@example.org>\n"
        + (f"Multi-Arch: {multi_arch or 'same'}\n" if arch != "all" or multi_arch else "")
        + (f"Depends: {depends}\n" if depends else "")
        + "Description: a lab package\n"
    )
    (build / "DEBIAN/control").write_text(control)
    if triggers:
        (build / "DEBIAN/triggers").write_text(triggers)
    for script, body in (("prerm", prerm), ("postinst", postinst)):
        if body:
            (build / "DEBIAN" / script).write_text(f"#!/bin/sh\n{body}\n")
            (build / "DEBIAN" / script).chmod(0o755)
    (build / "usr/share/doc" / name).mkdir(parents=True)
    (build / "usr/share/doc" / name / "README").write_text(f"{name}\n")
    for path in files:
        target = build / path.strip("/")
        if path.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"{name}\n")
    for path, text in (texts or {}).items():
        target = build / path.strip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    out = f"/tmp/repo/{name}_{version}_{arch}.deb"
    (root / "tmp/repo").mkdir(exist_ok=True)
    done = chroot(
        root, "dpkg-deb", "--root-owner-group", "--build", f"/tmp/build/{build.name}", out
    )
    assert done.returncode == 0, done.stderr
    return root / out.lstrip("/")


def local_repository(root: Path, debs: list[Path], uri: str = "file:/tmp/repo") -> None:
    """A flat apt repository of `debs` inside the root (/tmp/repo), its lists fetched from
    `uri`: the directory itself, or a server on this machine that serves it."""
    import hashlib

    stanzas = []
    for deb in debs:
        fields = chroot(root, "dpkg-deb", "-f", f"/tmp/repo/{deb.name}").stdout.strip()
        data = deb.read_bytes()
        stanzas.append(
            f"{fields}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    (root / "tmp/repo/Packages").write_text("\n".join(stanzas))
    lst = root / "etc/apt/sources.list.d/lab.list"
    lst.write_text(f"deb [trusted=yes] {uri} ./\n")
    done = chroot(
        root, "apt-get", "update", "-o", "Dir::Etc::sourcelist=sources.list.d/lab.list",
        "-o", "Dir::Etc::sourceparts=-", "-o", "APT::Get::List-Cleanup=0",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
