"""state: what egpu-setup remembers between runs, all of it under DIR with `--root DIR`.

Modules: `paths` (where the state lives, who may touch it), `atomic` (atomic writes, the temp-file
mark a later run cleans up), `manifest` (every change, with backups), `journal` (the step journal),
`lock` (one run at a time), `verify_marker` (verify once after a reboot), `reports` (saved install
and verify reports), `output` (the folders a user names: `render --out`, `report --html`, `record`),
`tool_wheels` (the wheels egpu-setup keeps of itself, the only ones it installs into its venvs).
"""
