"""state: what egpu-setup remembers between runs.

Modules: `manifest` (manifest, journal, backups, run lock, atomic writes), `reports` (saved
install and verify reports).
"""
