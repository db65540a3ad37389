"""execute: what changes a machine, step by step, journaled, every step idempotent.

Modules: `executor` (runs a plan), `files` (managed writes and links, and their undo), `apt` (apt
sources and installs), `apt_key` (a third-party key checked against its pinned fingerprint),
`dpkg_lock` (waiting for the package manager), `pip` (torch into a venv), `eject` (safe detach).
"""
