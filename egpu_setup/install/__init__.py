"""install: the provisioning pipeline around plan and execute.

Modules: `preflight` (checks before anything changes).
"""
