"""plan: ordered, typed steps computed as a diff against the host.

Modules: `steps` (step types, option checks, apt sources, the planners).
"""
