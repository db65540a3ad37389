"""render: the hot-plug configuration, rendered in memory from validated values.

Modules: `context` (every value checked, the decisions), `files` (templates -> files, commands).
"""
