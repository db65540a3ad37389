"""resolve: host facts (or what-if inputs), a profile and constraints in; a Resolution out.

Pure: no I/O beyond reading our own package data. `resolver.resolve` applies the policy in order:
the target GPU (`target`), the torch wheels that qualify (`wheels`), the driver (`driver`, over the
branches in `branches` and the packages in `packages`), then the first wheel that driver runs.

Modules: `resolution` (the frozen answer and its JSON), `constraints` (what was asked for),
`target`, `wheels`, `glibc_floor` (the wheels a distribution's C library loads), `branches`,
`packages`, `driver`, `explain` (what a newer driver would unlock, and why a request is
impossible), `resolver` (the entry point), `drift` (what `--matrix updated` would choose
differently: `matrix update` prints it), `rocm` (an AMD GPU: its ROCm wheel, or why its link
cannot run ROCm).
"""
