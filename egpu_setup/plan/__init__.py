"""plan: ordered, typed steps computed as a diff against the host; nothing is changed here.

Modules: `steps` (the step types and Plan), `options` (what the planner is asked for), `apt_sources`
(apt's sources as apt reads them), `installed` (what the target already has), the three planners
`driver`, `config` and `torch` (with `venv`: ensurepip and a half-made venv), `hold` (the
driver held for the term), `triggers` (the driver's dpkg triggers run once, after the files),
`amd` (an AMD GPU's plan: the render and video groups, no NVIDIA
files), and `build` (build_plan: all of them, in order, plus the reboot).
"""
