"""execute: what changes a machine, step by step, journaled, every step idempotent.

Modules: `executor` (runs a plan), `files` (managed writes and links), `undo` (their exact
reversal), `apt` (apt sources and installs), `apt_key` (a third-party key checked against its
pinned fingerprint), `dpkg_lock` (waiting for the package manager), `pip` (torch into a venv),
`console` (a child's output under its step), `eject` (safe detach), `dkms` (the module
built for every kernel the target boots), `tool` (egpu-setup's own root-owned venv), `kernels`
(`kernels check`: DKMS builds for new kernels, the rest recorded), `health` (`health sample`:
a reading folded into the bounded health.json), `hold` (the driver's pin written from dpkg's
status after the apt step).
"""
