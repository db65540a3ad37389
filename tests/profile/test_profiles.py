"""Profiles: the shipped data, the strict loader (one test per error class, exact positions),
the search path, `extends:`, and the `profiles` commands."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from egpu_setup.errors import UsageError
from egpu_setup.profile import load as P
from egpu_setup.profile import schema as profile_schema
from egpu_setup.profile import search as profile_search
from helpers.cli_runner import invoke

SHIPPED = {
    "gtx1080ti",
    "rtx3060",
    "rtx3080",
    "rtx3090",
    "rtx4070",
    "rtx4080",
    "rtx4090",
    "rtx5080",
    "rtx5090",
    "rtx-a4000",
    "generic-nvidia",
    "rx7900xtx",
    "rx9070xt",
    "w7900",
}
UUID = "d6010000-0080-8e08-2362-a91cd1b06221"

GOOD = """\
name: lab-4090
description: Lab RTX 4090 boxes
gpu:
  name: GeForce RTX 4090
  device_ids: ["2684"]
  architecture: Ada Lovelace
  compute_capability: "8.9"
  memory_gib: 24
hotplug:
  enclosure_unique_id: D6010000-0080-8E08-2362-A91CD1B06221
"""


@pytest.fixture(autouse=True)
def _no_local_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Only the package's profiles plus what a test puts in its own directory."""
    local = tmp_path / "local-profiles"
    local.mkdir()
    monkeypatch.setenv(profile_search.ENV_PATH, str(local))
    return local


def write(tmp_path: Path, body: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def error_of(path: Path) -> UsageError:
    with pytest.raises(UsageError) as info:
        P.load_file(path)
    return info.value


# -- the shipped profiles ---------------------------------------------------------------------------


def test_every_required_profile_ships_and_loads() -> None:
    loaded = {e.name: p for e, p in P.iter_profiles()}
    assert set(loaded) >= SHIPPED
    bad = {n: p.message for n, p in loaded.items() if isinstance(p, UsageError)}
    assert bad == {}
    assert all(e.origin == "package" for e, _ in P.iter_profiles())


def test_shipped_numbers_are_the_real_ones() -> None:
    r4090 = P.load_profile("rtx4090")
    assert r4090.gpu.device_ids == ("2684",) and r4090.gpu.compute_capability == "8.9"
    assert r4090.power.psu_watts == 850 and r4090.expect.max_power_w == 450
    assert r4090.expect.h2d_gbps == {"thunderbolt": 2.0, "usb4": 2.0, "oculink": 5.0, "pcie": 20.0}
    r5090 = P.load_profile("rtx5090")
    assert r5090.gpu.compute_capability == "12.0" and r5090.driver.flavour == "open"
    assert r5090.driver.min_branch == 570 and r5090.torch.spec == ">=2.7"
    pascal = P.load_profile("gtx1080ti")
    assert (pascal.driver.flavour, pascal.driver.max_branch, pascal.torch.cuda) == (
        "proprietary",
        580,
        "cu126",
    )
    generic = P.load_profile("generic-nvidia")
    assert generic.gpu.device_ids == () and generic.gpu.matches("2b85")
    assert not r4090.gpu.matches("2b85") and r4090.gpu.matches("2684")


def test_extends_merges_variants() -> None:
    ti = P.load_profile("rtx3090ti")
    assert ti.extends == "rtx3090"
    assert ti.gpu.device_ids == ("2203",) and ti.gpu.memory_gib == 24.0  # inherited
    assert ti.expect.fp32_tflops == 40.0 and ti.power.psu_watts == 850  # overridden
    assert ti.expect.h2d_gbps["oculink"] == 5.0  # deep-merged mapping
    assert [Path(c).name for c in ti.chain] == ["rtx3090.yaml", "rtx3090ti.yaml"]


def test_each_device_id_names_one_shipped_profile() -> None:
    """A card's PCI id leads to one profile (generic ones list none), so a lab can tell which."""
    owners: dict[str, list[str]] = {}
    for entry, loaded in P.iter_profiles():
        assert not isinstance(loaded, Exception), entry.path
        for device_id in loaded.gpu.device_ids:
            owners.setdefault(device_id, []).append(loaded.name)
    assert owners["2684"] == ["rtx4090"]
    assert owners["24c7"] == ["rtx3060-8gb"]
    assert "ffff" not in owners
    assert {d: n for d, n in owners.items() if len(n) > 1} == {}


def test_good_profile_defaults_and_uuid_normalised(tmp_path: Path) -> None:
    p = P.load_file(write(tmp_path, GOOD))
    assert p.hotplug.enclosure_unique_id == UUID
    assert p.mode == "compute" and p.driver.flavour == "auto"
    assert p.expect.amp_steps == 200 and p.expect.min_link_width == 4
    assert p.hotplug.thunderbolt_policy == "iommu" and p.hotplug.runtime_pm_off is True
    assert p.origin == "file"


# -- the JSON Schema and the loader agree ------------------------------------------------------------

BAD_DOCS = {
    "unknown-key": GOOD + "colour: blue\n",
    "wrong-type": GOOD.replace("memory_gib: 24", "memory_gib: lots"),
    "bad-uuid": GOOD.replace("D6010000-0080-8E08-2362-A91CD1B06221", "d601-0080"),
    "udev-injection": GOOD.replace(
        "D6010000-0080-8E08-2362-A91CD1B06221", f"'{UUID}\", RUN+=\"/bin/sh -c reboot'"
    ),
    "shell-in-description": GOOD.replace("Lab RTX 4090 boxes", "'x $(reboot)'"),
    "missing-gpu": "name: lonely\ndescription: no gpu here\n",
    "bad-device-id": GOOD.replace('["2684"]', '["26840"]'),
    "duplicate-device-id": GOOD.replace('["2684"]', '["2684", "2684"]'),
    "bad-enum": GOOD + "mode: gaming\n",
    "bad-branch": GOOD + "driver:\n  min_branch: 42\n",
    "bad-spec": GOOD + "torch:\n  spec: '>=2.7; rm -rf /'\n",
    "bad-extra": GOOD + "torch:\n  extras: [torchtext]\n",
    "cc-as-number": GOOD.replace('"8.9"', "8.9"),
}


def test_json_schema_and_loader_agree(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(profile_schema.load_schema())
    validator = jsonschema.Draft202012Validator(profile_schema.load_schema())
    for entry, _ in P.iter_profiles():
        data = yaml.safe_load(entry.path.read_text())
        assert list(validator.iter_errors(data)) == [], entry.name
    for label, body in BAD_DOCS.items():
        path = write(tmp_path, body, f"{label}.yaml")
        assert list(validator.iter_errors(yaml.safe_load(body))), f"jsonschema accepts {label}"
        with pytest.raises(UsageError):
            P.load_file(path)


def test_schema_keywords_are_all_interpreted() -> None:
    profile_schema.load_schema()  # vets the shipped file
    with pytest.raises(RuntimeError, match="not interpreted"):
        profile_schema._vet_schema({"properties": {"x": {"type": "string", "format": "uuid"}}}, "#")


# -- one test per loader error class, with the exact position -----------------------------------------


def test_duplicate_key(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD + "gpu:\n  name: again\n"))
    assert err.message.startswith(
        f"{tmp_path}/p.yaml:11:1: gpu: duplicate key (first defined at line 3)"
    )
    assert "silently" in (err.hint or "")


def test_unknown_key_did_you_mean(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD.replace("  memory_gib: 24", "  memory_gb: 24")))
    assert err.message == f"{tmp_path}/p.yaml:8:3: gpu.memory_gb: unknown key"
    assert (err.hint or "").startswith("did you mean `memory_gib`?")


def test_wrong_type(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD.replace("memory_gib: 24", "memory_gib: 24 GB")))
    assert (
        err.message
        == f'{tmp_path}/p.yaml:8:15: gpu.memory_gib: expected a number or null, got "24 GB"'
    )
    assert "GiB" in (err.hint or "")


def test_yaml11_boolean(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD + "  runtime_pm_off: yes\n"))
    assert (
        err.message
        == f"{tmp_path}/p.yaml:11:19: hotplug.runtime_pm_off: `yes` is a YAML 1.1 boolean"
    )
    assert "true or false" in (err.hint or "")


def test_yaml11_boolean_on_in_a_string_field(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD.replace("name: GeForce RTX 4090", "name: on")))
    assert err.message == f"{tmp_path}/p.yaml:4:9: gpu.name: `on` is a YAML 1.1 boolean"


def test_tab(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD.replace("  memory_gib: 24", "\tmemory_gib: 24")))
    assert err.message == f"{tmp_path}/p.yaml:8:1: tab character"
    assert "spaces" in (err.hint or "")


def test_non_uuid_unique_id(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD.replace("D6010000-0080-8E08-2362-A91CD1B06221", "0-1")))
    assert (
        err.message == f'{tmp_path}/p.yaml:10:24: hotplug.enclosure_unique_id: invalid value "0-1"'
    )
    assert "boltctl" in (err.hint or "")


def test_udev_metacharacters_in_unique_id(tmp_path: Path) -> None:
    body = BAD_DOCS["udev-injection"]
    err = error_of(write(tmp_path, body))
    assert err.message.startswith(
        f"{tmp_path}/p.yaml:10:24: hotplug.enclosure_unique_id: invalid value"
    )


def test_shell_metacharacters_in_text(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD.replace("Lab RTX 4090 boxes", "Lab boxes; reboot")))
    assert err.message == f'{tmp_path}/p.yaml:2:14: description: invalid value "Lab boxes; reboot"'
    assert "no quotes, $, ;" in (err.hint or "")


def test_yaml_syntax_error(tmp_path: Path) -> None:
    err = error_of(
        write(tmp_path, GOOD.replace("  architecture: Ada Lovelace", "  architecture: [Ada"))
    )
    assert err.message.startswith(f"{tmp_path}/p.yaml:7:")
    assert "YAML syntax" in err.message


def test_python_tag_is_refused(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD + "mode: !!python/object/apply:os.system ['reboot']\n"))
    assert (
        err.message
        == f"{tmp_path}/p.yaml:11:7: mode: YAML tag !!python/object/apply:os.system is not allowed"
    )


def test_anchors_and_merge_keys_are_refused(tmp_path: Path) -> None:
    err = error_of(
        write(tmp_path, GOOD.replace('["2684"]', '&ids ["2684"]') + "torch:\n  extras: *ids\n")
    )
    assert err.message == f"{tmp_path}/p.yaml:5:15: &ids: anchors and aliases are not supported"
    merge = GOOD + "power:\n  <<: {psu_watts: 100}\n"
    err = error_of(write(tmp_path, merge, "m.yaml"))
    assert err.message == f"{tmp_path}/m.yaml:12:3: power: merge keys (<<) are not supported"


def test_date_value(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD.replace("Lab RTX 4090 boxes", "2024-11-25")))
    assert err.message == f"{tmp_path}/p.yaml:2:14: description: a date is not a valid value here"


def test_missing_gpu_without_extends(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, "name: lonely\ndescription: no gpu here\n"))
    assert err.message == f"{tmp_path}/p.yaml:1:1: missing required key `gpu`"
    assert "extends" in (err.hint or "")


def test_empty_and_non_mapping_and_non_utf8(tmp_path: Path) -> None:
    assert (
        error_of(write(tmp_path, "# nothing\n")).message
        == f"{tmp_path}/p.yaml: the profile is empty"
    )
    assert error_of(write(tmp_path, "- a\n- b\n", "l.yaml")).message == (
        f"{tmp_path}/l.yaml:1:1: expected a mapping of keys, got array"
    )
    raw = tmp_path / "latin1.yaml"
    raw.write_bytes(b"name: x\ndescription: caf\xe9\n")
    with pytest.raises(UsageError, match=r"latin1.yaml:2:17: not UTF-8 text"):
        P.load_file(raw)


def test_cross_field_rules(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD + "driver:\n  min_branch: 580\n  preferred_branch: 550\n"))
    assert err.message == f"{tmp_path}/p.yaml:13:21: driver.preferred_branch: 550 is below 580"
    pascal = GOOD.replace("Ada Lovelace", "Pascal") + "driver:\n  flavour: open\n"
    err = error_of(write(tmp_path, pascal, "pascal.yaml"))
    assert (
        err.message
        == f"{tmp_path}/pascal.yaml:12:12: driver.flavour: open kernel modules do not support Pascal GPUs"
    )


AMD_GOOD = """\
name: lab-7900
description: Lab RX 7900 XTX boxes
gpu:
  vendor: amd
  name: Radeon RX 7900 XTX
  device_ids: ["744c"]
  architecture: RDNA 3
  gfx: gfx1100
hotplug:
  persistenced: false
"""


def test_amd_profiles_ship_with_their_gfx_target_and_no_driver() -> None:
    xtx = P.load_profile("rx7900xtx")
    assert (xtx.gpu.vendor, xtx.gpu.gfx, xtx.gpu.device_ids) == ("amd", "gfx1100", ("744c",))
    assert xtx.driver.min_branch is None and xtx.driver.preferred_branch is None
    assert xtx.power.psu_watts == 800 and xtx.expect.max_power_w == 355
    assert P.load_profile("rx9070xt").gpu.gfx == "gfx1201"
    assert P.load_profile("w7900").gpu.memory_gib == 48.0
    # the vendor defaults to nvidia, so every NVIDIA profile reads as before
    assert P.load_profile("rtx4090").gpu.vendor == "nvidia"
    assert P.load_profile("rtx4090").to_json()["gpu"]["gfx"] is None


@pytest.mark.parametrize(
    ("change", "where", "message"),
    [
        (("  gfx: gfx1100\n", ""), "gpu.gfx", "an AMD profile needs its gfx target"),
        (("RDNA 3", "Ada Lovelace"), "gpu.architecture", "Ada Lovelace is not an AMD family"),
        (
            ("  gfx: gfx1100\n", '  gfx: gfx1100\n  compute_capability: "8.9"\n'),
            "gpu.compute_capability",
            "no CUDA compute capability",
        ),
        (
            ("hotplug:", "driver:\n  min_branch: 580\nhotplug:"),
            "driver.min_branch",
            "no driver branch",
        ),
        (
            ("hotplug:", "driver:\n  flavour: open\nhotplug:"),
            "driver.flavour",
            "NVIDIA's kernel module flavours",
        ),
        (("hotplug:", "torch:\n  cuda: cu128\nhotplug:"), "torch.cuda", "cu128 is a CUDA build"),
        (("persistenced: false", "persistenced: true"), "hotplug.persistenced", "NVIDIA's daemon"),
        (("vendor: amd", "vendor: intel"), "gpu.vendor", "is not one of: nvidia, amd"),
    ],
)
def test_amd_profile_rules(
    tmp_path: Path, change: tuple[str, str], where: str, message: str
) -> None:
    body = AMD_GOOD.replace(*change)
    assert body != AMD_GOOD
    err = error_of(write(tmp_path, body))
    assert f": {where}: " in err.message and message in err.message, err.message


def test_amd_profile_loads_and_nvidia_keys_stay_nvidias(tmp_path: Path) -> None:
    amd = P.load_file(write(tmp_path, AMD_GOOD))
    assert (amd.gpu.vendor, amd.gpu.gfx, amd.torch.cuda) == ("amd", "gfx1100", None)
    assert (
        P.load_file(
            write(
                tmp_path, AMD_GOOD.replace("hotplug:", "torch:\n  cuda: cpu\nhotplug:"), "cpu.yaml"
            )
        ).torch.cuda
        == "cpu"
    )
    err = error_of(
        write(
            tmp_path,
            GOOD.replace("  memory_gib: 24\n", "  memory_gib: 24\n  gfx: gfx1100\n"),
            "n.yaml",
        )
    )
    assert "gpu.gfx: a gfx target is AMD's" in err.message
    err = error_of(write(tmp_path, GOOD.replace("Ada Lovelace", "RDNA 3"), "r.yaml"))
    assert "gpu.architecture: RDNA 3 is an AMD family" in err.message


def test_several_problems_reports_the_first_and_counts(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, GOOD + "colour: blue\nmode: gaming\n"))
    assert err.message == f"{tmp_path}/p.yaml:11:1: colour: unknown key (and 1 more problem)"


# -- extends ----------------------------------------------------------------------------------------


def test_extends_a_shipped_profile(tmp_path: Path) -> None:
    p = P.load_file(
        write(tmp_path, f"name: lab\nextends: rtx4090\nhotplug:\n  enclosure_unique_id: {UUID}\n")
    )
    assert p.gpu.name == "GeForce RTX 4090" and p.hotplug.enclosure_unique_id == UUID
    assert p.description == P.load_profile("rtx4090").description


def test_extends_cycle(tmp_path: Path, _no_local_profiles: Path) -> None:
    local = _no_local_profiles
    write(local, "name: a\nextends: b\n", "a.yaml")
    write(local, "name: b\nextends: a\n", "b.yaml")
    with pytest.raises(UsageError) as info:
        P.load_profile("a")
    assert info.value.message == f"{local}/b.yaml:2:10: extends: extends cycle: a -> b -> a"


def test_extends_unknown(tmp_path: Path) -> None:
    err = error_of(write(tmp_path, "name: x\nextends: rtx4091\n"))
    assert err.message == f"{tmp_path}/p.yaml:2:10: extends: unknown profile 'rtx4091'"
    assert "rtx4090" in (err.hint or "")


# -- the search path --------------------------------------------------------------------------------


def test_local_directory_overrides_the_package(_no_local_profiles: Path) -> None:
    local = _no_local_profiles
    body = P.load_profile("rtx4090").path
    text = Path(body).read_text().replace("psu_watts: 850", "psu_watts: 1000")
    write(local, text, "rtx4090.yaml")
    p = P.load_profile("rtx4090")
    assert p.origin == "custom" and p.power.psu_watts == 1000
    entry = profile_search.available()["rtx4090"]
    assert entry.shadows and entry.shadows[0].endswith("profiles/rtx4090.yaml")


def test_name_must_match_file_name_in_search_dirs(_no_local_profiles: Path) -> None:
    write(_no_local_profiles, GOOD, "other.yaml")
    with pytest.raises(UsageError) as info:
        P.load_profile("other")
    assert (
        info.value.message
        == f"{_no_local_profiles}/other.yaml:1:7: name: 'lab-4090' differs from the file name 'other.yaml'"
    )


def test_default_dirs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(profile_search.ENV_PATH)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("SUDO_USER", "nobody")  # never consulted: root reads no user's folder
    dirs = profile_search.search_dirs()
    assert dirs[1] == ("system", Path("/etc/egpu-setup/profiles"))
    if os.geteuid() == 0:  # as a user: tests/profile/test_profile_trust.py
        assert [o for o, _ in dirs] == ["package", "system"]
    else:
        assert dirs[2] == ("user", tmp_path / "xdg" / "egpu-setup" / "profiles")


def test_unknown_name_and_missing_path() -> None:
    with pytest.raises(UsageError) as info:
        P.load_profile("rtx4009")
    assert info.value.message == "unknown profile 'rtx4009'" and "rtx4090" in (
        info.value.hint or ""
    )
    with pytest.raises(UsageError, match=r"profile file not found: \./nope\.yaml"):
        P.load_profile("./nope.yaml")


# -- the commands -------------------------------------------------------------------------------------


def test_cli_list_and_json() -> None:
    res = invoke("profiles", "list")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].split() == ["NAME", "GPU", "ARCH", "CC", "MEM", "PSU", "FROM"]
    assert any(line.startswith("rtx4090 ") and "850 W" in line for line in res.stdout.splitlines())
    data = json.loads(invoke("profiles", "list", "--json").stdout)
    assert data["schema"] == "egpu-setup/profiles/1"
    assert {p["name"] for p in data["profiles"]} >= SHIPPED


def test_cli_list_reports_an_invalid_local_profile(tmp_path: Path) -> None:
    local = tmp_path / "more"
    local.mkdir()
    (local / "broken.yaml").write_text(
        "name: broken\ndescription: x\ngpu: "
        "{name: X, device_ids: [], architecture: Ampere}\nmode: yes\n"
    )
    res = invoke("profiles", "list", env={profile_search.ENV_PATH: str(local)})
    assert res.returncode == 2
    assert "broken" in res.stdout and "INVALID" in res.stdout
    assert f"error: {local}/broken.yaml:4:7: mode: `yes` is a YAML 1.1 boolean" in res.stderr


def test_cli_show_output_is_a_valid_profile(tmp_path: Path) -> None:
    res = invoke("profiles", "show", "rtx3090ti")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("# rtx3090ti: ")
    copy = tmp_path / "copy.yaml"
    copy.write_text(res.stdout)
    again = P.load_file(copy)
    assert again.to_json() | {"path": "", "chain": [], "origin": "", "extends": None} == (
        P.load_profile("rtx3090ti").to_json()
        | {"path": "", "chain": [], "origin": "", "extends": None}
    )


def test_cli_check(tmp_path: Path) -> None:
    good = write(tmp_path, GOOD, "lab-4090.yaml")
    res = invoke("profiles", "check", str(good))
    assert res.returncode == 0 and res.stdout == f"ok: {good} (lab-4090: GeForce RTX 4090)\n"
    bad = write(tmp_path, GOOD + "  runtime_pm_off: on\n", "bad.yaml")
    res = invoke("profiles", "check", str(bad))
    assert res.returncode == 2
    assert (
        res.stderr.splitlines()[0]
        == f"error: {bad}:11:19: hotplug.runtime_pm_off: `on` is a YAML 1.1 boolean"
    )
    assert res.stderr.splitlines()[1].startswith("hint: ")
    assert "Traceback" not in res.stderr
    res = invoke("profiles", "check", str(good), str(bad), str(tmp_path / "missing.yaml"))
    assert res.returncode == 2 and "error: 2 of 3 profiles are invalid" in res.stderr


def test_cli_check_refuses_a_name_that_differs_from_the_file_name(
    tmp_path: Path, _no_local_profiles: Path
) -> None:
    """As install does when it finds the profile by name: `profiles check` says so first."""
    renamed = write(tmp_path, GOOD, "lab.yaml")
    res = invoke("profiles", "check", str(renamed))
    assert res.returncode == 2, res.stdout
    first, hint = res.stderr.splitlines()[:2]
    assert first == (
        f"error: {renamed}:1:7: name: 'lab-4090' differs from the file name 'lab.yaml'"
    )
    assert hint == (
        "hint: profiles are found by file name: rename the file to lab-4090.yaml or set name: lab"
    )
    # and install, finding it by name in a profile directory, refuses it the same way
    (_no_local_profiles / "lab.yaml").write_text(GOOD)
    res = invoke("install", "--profile", "lab", "--dry-run")
    assert res.returncode == 2 and "differs from the file name 'lab.yaml'" in res.stderr


def test_cli_show_unknown() -> None:
    res = invoke("profiles", "show", "rtx9999")
    assert res.returncode == 2 and res.stderr.startswith("error: unknown profile 'rtx9999'")


def test_an_unknown_profile_name_points_at_the_generic_one() -> None:
    # an RTX 5070, which has no profile of its own: the refusal names generic-nvidia
    res = invoke("install", "--profile", "rtx5070", "--dry-run")
    assert res.returncode == 2 and res.stderr.startswith("error: unknown profile 'rtx5070'")
    hint = next(ln for ln in res.stderr.splitlines() if ln.startswith("hint: "))
    assert "did you mean" in hint
    assert hint.endswith("a card with no profile of its own: --profile generic-nvidia"), hint
    assert "Traceback" not in res.stderr
    # a name close to the generic one is suggested once, not twice
    res = invoke("profiles", "show", "generic-nvida")
    assert res.stderr.count("generic-nvidia") == 1, res.stderr
