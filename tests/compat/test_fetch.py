"""`matrix update` against a real HTTP server on 127.0.0.1 serving recorded index pages: a good page,
a malformed one, a truncated one, a dropped connection, 5xx then success (retries), and a 304."""

from __future__ import annotations

import json
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_setup.compat import fetch
from egpu_setup.compat import overlay as overlay_mod
from egpu_setup.compat.matrix import load_matrix, load_snapshot
from egpu_setup.errors import EgpuSetupError
from egpu_setup.resolve.constraints import Constraints
from egpu_setup.resolve.resolver import resolve
from helpers.cli_runner import invoke
from helpers.torch_index import ETAG, IndexServer


@pytest.fixture
def server() -> Iterator[IndexServer]:
    s = IndexServer()
    yield s
    s.close()


def _update(server: IndexServer, tmp_path: Path, **kw: Any) -> fetch.UpdateResult:
    return fetch.update_matrix(tmp_path, server.url, timeout=(2.0, 5.0), backoff=0.01, **kw)


def test_the_cached_index_is_readable_by_every_user_and_leaves_no_temp_file(
    server: IndexServer, tmp_path: Path
) -> None:
    """root runs `matrix update`; a normal user's `resolve` reads the overlay (it was 0600)."""
    _update(server, tmp_path)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in written} == {"torch-index.json", "torch.html", "torch.meta.json"}
    assert {stat.S_IMODE(p.stat().st_mode) for p in written} == {0o644}


def test_good_page_writes_overlay_and_changes_resolution(
    server: IndexServer, tmp_path: Path
) -> None:
    result = _update(server, tmp_path)
    assert result.status == "updated"
    assert result.new_versions == ("2.15.1",)
    assert "torch 2.9.1: index lacks cu129" in result.changes
    assert "torch 2.15.0: index also has cu134" in result.changes
    overlay = json.loads((tmp_path / overlay_mod.OVERLAY_NAME).read_text())
    assert overlay["schema"] == overlay_mod.OVERLAY_SCHEMA and overlay["etag"] == ETAG
    assert overlay["releases"]["2.13.0"]["cu130"][-1] == "3.15"  # index-only Python kept
    assert "1.13.1" not in overlay["releases"]  # only Linux x86_64 CPython 2.x wheels count
    assert overlay["releases"]["2.15.0"]["cu130"] == ["3.11", "3.12", "3.13", "3.14", "3.15"]

    m = load_matrix(str(tmp_path))
    assert m.overlay is not None and m.overlay.index_url == server.url
    assert m.torch[0].version == "2.15.1"
    t291, t2150 = m.torch_version("2.9.1"), m.torch_version("2.15.0")
    assert t291 is not None and t2150 is not None
    assert t291.variant("cu129") is None
    assert any("cu134" in n and "no driver floor" in n for n in m.notes)
    inherited = m.torch[0].variant("cu132")  # 2.15.1: arch list carried over from 2.15.0
    shipped = t2150.variant("cu132")
    assert inherited is not None and shipped is not None
    assert inherited.arch == shipped.arch
    assert inherited.status == "stable" and "[inferred] from torch 2.15.0" in inherited.source
    r = resolve(None, None, Constraints(gpu="2684", distro="ubuntu-24.04", python="3.12"), matrix=m)
    assert (r.torch.version, r.torch.variant) == ("2.15.1", "cu132")


def test_304_uses_the_cached_page(server: IndexServer, tmp_path: Path) -> None:
    _update(server, tmp_path)
    second = _update(server, tmp_path)
    assert second.status == "not-modified"
    assert server.requests[-1]["if-none-match"] == ETAG
    assert second.new_versions == ("2.15.1",)


def test_malformed_page_keeps_previous_overlay(server: IndexServer, tmp_path: Path) -> None:
    _update(server, tmp_path)
    before = (tmp_path / overlay_mod.OVERLAY_NAME).read_bytes()
    server.mode = "malformed"
    # Drop the cached validators so the server answers with the page, not a 304.
    (tmp_path / fetch.CACHE_DIR / "torch.meta.json").unlink()
    with pytest.raises(EgpuSetupError) as info:
        _update(server, tmp_path)
    assert "no links" in info.value.message or "no torch" in info.value.message
    assert "stays in force" in (info.value.hint or "")
    assert (tmp_path / overlay_mod.OVERLAY_NAME).read_bytes() == before


def test_truncated_page_is_refused(server: IndexServer, tmp_path: Path) -> None:
    server.mode = "truncated"
    with pytest.raises(EgpuSetupError) as info:
        _update(server, tmp_path)
    assert "truncated or wrong page" in info.value.message
    assert not (tmp_path / overlay_mod.OVERLAY_NAME).exists()
    assert load_matrix(str(tmp_path)) == load_snapshot()


def test_dropped_connection_retries_then_fails(server: IndexServer, tmp_path: Path) -> None:
    server.mode = "drop"
    with pytest.raises(EgpuSetupError) as info:
        _update(server, tmp_path, retries=2)
    assert "could not read" in info.value.message
    assert "shipped matrix stays in force" in (info.value.hint or "")
    assert len(server.requests) == 3  # the first try plus two retries
    assert not (tmp_path / overlay_mod.OVERLAY_NAME).exists()


def test_503_then_success_with_backoff(server: IndexServer, tmp_path: Path) -> None:
    server.fail_first = 2
    result = _update(server, tmp_path, retries=3)
    assert result.status == "updated" and len(server.requests) == 3


def test_unreachable_port_is_a_clean_error(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(EgpuSetupError):
        fetch.update_matrix(
            tmp_path, f"http://127.0.0.1:{port}/whl/", timeout=(1.0, 1.0), retries=0
        )


def test_bad_index_url_is_usage_error(tmp_path: Path) -> None:
    from egpu_setup.errors import UsageError

    with pytest.raises(UsageError):
        fetch.update_matrix(tmp_path, "ftp://example.invalid/whl/")


@pytest.mark.parametrize(
    "url",
    [
        "http://mirror.example/whl/",  # plain http off this machine
        "https://user:secret@mirror.example/whl/",  # credentials end up in reports
        "https://mirror.example/whl/ --extra-index-url https://x/",  # two URLs in one
        "file:///srv/whl/",  # allowed for pip, not readable by this fetcher
    ],
)
def test_matrix_update_refuses_the_urls_install_refuses(tmp_path: Path, url: str) -> None:
    from egpu_setup.compat.index_url import check_index_url
    from egpu_setup.errors import UsageError

    with pytest.raises(UsageError) as info:
        fetch.update_matrix(tmp_path, url)
    assert info.value.message.startswith("--index-url")
    if not url.startswith("file:"):
        with pytest.raises(UsageError):
            check_index_url(url)  # the same rule install and bundle apply
    assert not (tmp_path / overlay_mod.OVERLAY_NAME).exists()


def test_corrupt_overlay_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / overlay_mod.OVERLAY_NAME
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert load_matrix(str(tmp_path)) == load_snapshot()
    path.write_text(json.dumps({"schema": "something/else", "releases": {}}))
    assert overlay_mod.load_overlay(tmp_path) is None
    releases: object
    for releases in (
        {"2.9.1": "cu128"},
        {"2.9.1": {"rocm6": ["3.12"]}},
        {"x": {}},
        {"2.9.1": {"cu128": [3.12]}},
    ):
        path.write_text(json.dumps({"schema": overlay_mod.OVERLAY_SCHEMA, "releases": releases}))
        assert overlay_mod.load_overlay(tmp_path) is None, releases
        assert load_matrix(str(tmp_path)) == load_snapshot()


def test_parse_index_skips_what_the_resolver_cannot_use() -> None:
    html = (
        '<html><body><a href="/whl/cu128/torch-2.9.1%2Bcu128-cp312-cp312-manylinux_2_28_x86_64.whl#sha256=ab">x</a>'
        '<a href="/whl/cu128/torch-2.9.1%2Bcu128-cp313-cp313t-manylinux_2_28_x86_64.whl">t</a>'
        '<a href="/whl/cu128/torch-2.9.1%2Bcu128-cp312-cp312-win_amd64.whl">w</a>'
        '<a href="/whl/torch-2.9.1-cp312-cp312-manylinux_2_28_x86_64.whl">no label</a>'
        '<a href="torch-2.10.0.dev20250101%2Bcu128-cp312-cp312-manylinux_2_28_x86_64.whl">dev</a>'
        "</body></html>"
    )
    assert fetch.parse_index(html) == {"2.9.1": {"cu128": ["3.12"]}}
    with pytest.raises(ValueError):
        fetch.parse_index("<html><body>nothing</body></html>")
    with pytest.raises(ValueError):
        fetch.parse_index('<a href="/whl/readme.txt">r</a>')


def test_cli_update_and_show(server: IndexServer, tmp_path: Path) -> None:
    env = {"EGPU_SETUP_STATE_DIR": str(tmp_path), "EGPU_SETUP_TORCH_INDEX": server.url}
    done = invoke("matrix", "update", "--json", env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["status"] == "updated" and data["new_versions"] == ["2.15.1"]
    shown = invoke("matrix", "show", "--json", env=env)
    info = json.loads(shown.stdout)
    assert info["overlay"]["versions"] == len(
        json.loads((tmp_path / overlay_mod.OVERLAY_NAME).read_text())["releases"]
    )
    assert info["torch"][0]["version"] == "2.15.1"
    text = invoke("matrix", "show", env=env).stdout
    assert "releases read" in text and "2.15.1" in text


def test_cli_update_malformed_exit_code(server: IndexServer, tmp_path: Path) -> None:
    server.mode = "malformed"
    done = invoke(
        "matrix", "update", "--index-url", server.url, env={"EGPU_SETUP_STATE_DIR": str(tmp_path)}
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and "\nhint: " in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / overlay_mod.OVERLAY_NAME).exists()


def test_unwritable_state_dir_is_a_clean_error(server: IndexServer, tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory should be")
    with pytest.raises(EgpuSetupError) as info:
        fetch.update_matrix(blocker, server.url, timeout=(2.0, 5.0))
    # the one writer (state/atomic.py) refuses it before anything is written: exit 2
    assert info.value.exit_code == 2
    assert (
        info.value.message
        == f"{blocker} is not a directory: egpu-setup writes only through real directories"
    )
    assert "replace" in (info.value.hint or "") and "real directory" in (info.value.hint or "")
