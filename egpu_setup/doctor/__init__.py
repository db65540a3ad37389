"""doctor: recognise known eGPU failure modes and say what to do.

    facts  = detect_host(host)                 # HostFacts
    inputs = collect(host, facts)              # raw text: dmesg, lspci, nvidia-smi, rule files...
    found  = diagnose(facts, inputs, torch)    # pure: tuple[Finding, ...], worst first

`collect` is the only part that touches the host (through its methods); `diagnose` is pure, so
every finding is tested by replaying real text through the same code path.

Modules: `catalog` (the finding ids, severities and sources), `findings` (Finding, DoctorInput),
`collect`, `diagnose`, `checks` (one check per failure mode), `rules` (udev/Xorg parsers),
`managers` (other GPU managers: mode, effect, undo), `known_issues` (known-bad GPU and link
combinations), `dmesg` (the kernel-log scanner), `torchcheck` (a venv's torch build), `record` (the
`--from` diagnostics bundle), `kernels` (which installed kernel lacks its NVIDIA module, and the
fix), `hold` (a held driver, a split one, a hold removed by hand), `amd` (amdgpu's troubles in
the kernel log, a /dev/kfd ROCm cannot open).
"""
