"""Hostile: an index that redirects stays on its host and on https; a token never goes in argv.

Was: a loopback or https index that redirected sent pip and `matrix update` to a plain-http host;
an index URL's `?token=` was kept out of the journal but put in pip's argv, which every user of
the machine reads in /proc/PID/cmdline.
"""

from __future__ import annotations

import http.server
from pathlib import Path

import pytest

from egpu_setup.compat import fetch
from egpu_setup.compat.index_url import (
    check_index_redirects,
    installer_index,
    redirect_problem,
)
from egpu_setup.errors import UsageError
from egpu_setup.execute.pip import commands
from egpu_setup.plan.steps import PipInstall
from helpers.loopback import LoopbackServer, Respond


def _redirect_to(target: str) -> Respond:
    def respond(h: http.server.BaseHTTPRequestHandler) -> bool:
        h.send_response(302)
        h.send_header("Location", target + h.path.lstrip("/"))
        h.send_header("Content-Length", "0")
        h.end_headers()
        return True

    return respond


@pytest.mark.parametrize(
    ("source", "target", "why"),
    [
        ("https://mirror.lab/whl/", "http://mirror.lab/whl/", "from https down to http"),
        ("https://mirror.lab/whl/", "https://cdn.elsewhere/whl/", "to another host"),
        ("http://127.0.0.1:8080/", "http://10.0.0.9:8080/", "to another host"),
        ("https://mirror.lab/whl/", "ftp://mirror.lab/whl/", "from https down to ftp"),
        ("http://127.0.0.1:8080/", "file:///etc/", "to another host"),
    ],
)
def test_a_redirect_off_the_host_or_down_to_http_is_refused(
    source: str, target: str, why: str
) -> None:
    problem = redirect_problem(source, target)
    assert problem is not None and why in problem


def test_a_redirect_on_the_same_host_is_followed() -> None:
    assert redirect_problem("https://mirror.lab/whl/", "https://mirror.lab/pytorch/whl/") is None
    assert redirect_problem("http://127.0.0.1:8080/a/", "http://127.0.0.1:8080/b/") is None
    assert redirect_problem("http://127.0.0.1:8080/a/", "https://127.0.0.1:8443/b/") is None


def test_matrix_update_does_not_follow_a_redirect_to_another_host(tmp_path: Path) -> None:
    with LoopbackServer() as other:
        elsewhere = other.url.replace("127.0.0.1", "localhost")  # another host name, plain http
        with (
            LoopbackServer(respond=_redirect_to(elsewhere)) as mirror,
            pytest.raises(UsageError, match="redirects to another host") as err,
        ):
            fetch.update_matrix(tmp_path, mirror.url, timeout=(2.0, 5.0), retries=0)
        assert other.requests == []  # never asked
    assert err.value.hint and not list(tmp_path.glob("*.json"))


def test_pip_is_never_started_on_an_index_that_redirects_elsewhere(tmp_path: Path) -> None:
    from egpu_setup.errors import EgpuSetupError
    from egpu_setup.execute.executor import ExecOptions, execute
    from egpu_setup.host.machine import LiveHost
    from egpu_setup.plan.build import build_plan
    from egpu_setup.plan.options import PlanOptions
    from egpu_setup.state.lock import RunLock
    from egpu_setup.state.paths import StatePaths
    from helpers import install_values as values

    venv = tmp_path / "venv"
    with LoopbackServer() as other:
        elsewhere = other.url.replace("127.0.0.1", "localhost")
        with LoopbackServer(respond=_redirect_to(elsewhere)) as mirror:
            plan = build_plan(
                values.facts(),
                values.profile(),
                values.resolution(torch_requirements=("egpu-probe",), index_url=mirror.url),
                (),
                LiveHost(),
                PlanOptions(only=frozenset({"torch"}), venv=str(venv), target="live"),
            )
            paths = StatePaths.for_root(Path("/"))
            with RunLock(paths.lock), pytest.raises(EgpuSetupError) as err:
                execute(plan, LiveHost(), paths, ExecOptions(installer="pip"), lambda _t: None)
            assert [r["path"] for r in mirror.requests] == ["/torch/"]
        assert other.requests == []
    assert "redirects to another host" in err.value.message
    assert not venv.exists()  # refused before the venv was made


def test_check_index_redirects_leaves_file_indexes_and_silent_servers_alone() -> None:
    check_index_redirects("file:///srv/wheels/")
    check_index_redirects("http://127.0.0.1:9/", timeout=2.0)  # nothing listens: pip will say


def test_a_token_goes_in_the_installers_environment_never_its_argv() -> None:
    url = "https://mirror.lab/whl/cu128?token=s3cret"
    assert installer_index(url, uv=False) == ([], {"PIP_INDEX_URL": url})
    assert installer_index(url, uv=True) == ([], {"UV_INDEX_URL": url})
    plain = "https://mirror.lab/whl/cu128"
    assert installer_index(plain, uv=False) == (["--index-url", plain], {})
    step = PipInstall("/opt/v", ("torch==2.13.0+cu128",), url, True, "python3")
    for uv in (None, "/usr/bin/uv"):
        flat = [a for argv in commands(step, uv) for a in argv]
        assert not any("s3cret" in a for a in flat) and "--index-url" not in flat
