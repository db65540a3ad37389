"""`egpu-setup detect`: the host facts, as a table or as the detect JSON contract."""

from __future__ import annotations

import click

from egpu_setup.commands._options import echo_json, from_option, json_option
from egpu_setup.detect.facts import Gpu, HostFacts, TbDevice
from egpu_setup.text import plain


@click.command(
    epilog="""\b
Examples:
  egpu-setup detect
  egpu-setup detect --json | jq '.gpus[] | select(.external)'
  egpu-setup detect --from ./bug-report-bundle
  egpu-setup detect --nvidia-smi        # also ask nvidia-smi (slow on a cold GPU)
"""
)
@json_option
@from_option
@click.option(
    "--nvidia-smi",
    "run_smi",
    is_flag=True,
    help="Also run nvidia-smi for the CUDA version it reports (can take seconds).",
)
def command(as_json: bool, from_dir: str | None, run_smi: bool) -> None:
    """Show what egpu-setup sees: OS, every GPU (and which is the eGPU), driver, Thunderbolt."""
    from egpu_setup.detect.probe import detect_host
    from egpu_setup.host.machine import open_host

    facts = detect_host(open_host(from_dir), run_smi=run_smi)
    if as_json:
        echo_json(facts.to_json())
        # the JSON is a contract; the known problems are said beside it, on stderr
        for line in known_problem_lines(facts):
            click.echo(f"warning: {line}", err=True)
    else:
        click.echo(format_facts(facts))


def known_problem_lines(facts: HostFacts) -> list[str]:
    """Known-bad combinations of a GPU here and its link (doctor/known_issues.py)."""
    from egpu_setup.doctor.known_issues import known_issues

    return [hit.text() for hit in known_issues(facts)]


def _v(value: object) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _tb_generation(dev: TbDevice) -> str:
    """A device's generation named as the GPU line names the link ("TB5", "USB4", "TB3"), with
    the kernel's number beside it. sysfs says 4 for every USB4 router, Thunderbolt 5 included,
    so "gen 4" alone reads as a TB4 dock; a Thunderbolt 5 / USB4 v2 link runs 40 Gb/s on each
    lane (rx_speed is per lane, against 20 for USB4 and TB3/TB4: the kernel's
    Documentation/ABI/testing/sysfs-bus-thunderbolt, generation and rx_speed)."""
    from egpu_setup.detect.pci import _SYSFS_GENERATION

    if dev.generation is None:
        return "generation unknown"
    if dev.generation >= 4 and (dev.rx_speed_gbps or 0) >= 40:
        named = "TB5"
    else:
        named = _SYSFS_GENERATION.get(dev.generation, "")
    kernel = f"kernel generation {dev.generation}"
    return f"{named} ({kernel})" if named else kernel


def _link(g: Gpu) -> str:
    link = g.link
    if link.speed_gts is None and link.width is None:
        return "unknown"
    now = f"{_v(link.speed_gts)} GT/s x{_v(link.width)}"
    return f"{now} (max {_v(link.max_speed_gts)} GT/s x{_v(link.max_width)})"


def format_facts(facts: HostFacts) -> str:
    """The human table: short, the eGPU first, unknowns said as such."""
    o, py, nv = facts.os, facts.python, facts.nvidia
    lines = [
        f"OS        {_v(o.pretty_name or o.id)} (kernel {_v(o.kernel)}, {_v(o.arch)})"
        + (", WSL2" if o.wsl else ""),
        f"Session   {_v(o.session_type)}    Secure Boot {_v(o.secure_boot)}",
        f"Python    {_v(py.version)} ({_v(py.executable)}), externally managed (PEP 668): "
        f"{_v(py.externally_managed)}",
        f"NVIDIA    driver {_v(nv.driver_version)} ({_v(nv.module_flavour)} module), "
        f"loaded {_v(nv.module_loaded)}, CUDA {_v(nv.cuda_version)}, "
        f"nouveau {_v(nv.nouveau_loaded)}",
    ]
    if nv.smi_error:
        lines.append(f"          nvidia-smi: {nv.smi_error}")
    lines.append("")
    if not facts.gpus:
        lines.append(
            "GPUs      none found" if not facts.listed_gpus else "GPUs      none found on PCI"
        )
    for i, lg in enumerate(facts.listed_gpus):
        if i == 0:
            lines.append(
                f"{lg.source} lists {len(facts.listed_gpus)} GPU(s) without a PCI address:"
            )
        index = "?" if lg.index is None else str(lg.index)
        what = ", ".join(
            x
            for x in (
                lg.architecture,
                lg.compute_capability and f"compute capability {lg.compute_capability}",
                lg.memory_total_mib and f"{lg.memory_total_mib} MiB",
                lg.pci_bus and f"bus {lg.pci_bus}",
            )
            if x
        )
        lines.append(f"    [{index}] {_v(lg.name)}" + (f" ({what})" if what else ""))
    gpus = sorted(facts.gpus, key=lambda g: (g.external is not True, g.pci_address))
    for g in gpus:
        where = {True: "EXTERNAL", False: "internal", None: "placement unknown"}[g.external]
        ids = ":".join(i for i in (g.vendor_id, g.device_id) if i) or "ids unknown"
        lines.append(f"GPU {g.pci_address}  {_v(g.name)} [{ids}]")
        via = g.connection + (f" ({g.connection_generation})" if g.connection_generation else "")
        lines.append(f"    {where} via {via}, driver {_v(g.driver)}, link {_link(g)}")
        if len(facts.numa_nodes) > 1:
            node = "unknown (numa_node -1)" if g.numa_node is None else str(g.numa_node)
            lines.append(f"    NUMA node {node} of {len(facts.numa_nodes)}")
        if g.architecture:
            chip = f" ({g.codename})" if g.codename else ""
            lines.append(
                f"    {g.architecture}{chip}, compute capability {_v(g.compute_capability)}"
            )
        for why in g.evidence:
            lines.append(f"    - {why}")
    tb = facts.thunderbolt
    if tb.domains or tb.devices:
        lines.append("")
    for d in tb.domains:
        lines.append(
            f"Thunderbolt {d.name}: security {_v(d.security)}, "
            f"IOMMU DMA protection {_v(d.iommu_dma_protection)}"
        )
    for dev in tb.devices:
        lines.append(
            f"  {_v(dev.vendor)} {_v(dev.name)}: authorized {_v(dev.authorized)}, "
            f"{_tb_generation(dev)}, policy {_v(dev.policy)}, uuid {_v(dev.unique_id)}"
        )
    problems = known_problem_lines(facts)
    if problems:
        import textwrap

        lines += ["", "Known problems (`egpu-setup doctor` says what helps)"]
        for p in problems:
            lines += textwrap.wrap(
                p,
                100,
                initial_indent="  ! ",
                subsequent_indent="    ",
                break_long_words=False,
                break_on_hyphens=False,
            )
    return "\n".join(plain(line) for line in lines)
