"""execute: what changes a machine, step by step, journaled.

Modules: `executor` (runs a plan), `files` (managed writes and their undo), `apt`, `pip`,
`eject` (safe detach).
"""
