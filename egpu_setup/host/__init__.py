"""The one gateway to the machine: every file read and every process goes through a Host.

Modules: `machine` (Host and its three kinds: live, recorded `--from`, root-prefixed `--root`).
"""
