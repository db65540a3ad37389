"""rollback: what the manifest says egpu-setup did, undone, and only that.

    plan    = plan_rollback(options)     # read-only: the files, packages, venvs, commands
    outcome = apply_rollback(plan)       # under the run lock; or preview(plan) without --yes

Modules: `core` (what rollback restores, and doing it), `purge` (`--packages`: purging what
egpu-setup's apt runs installed, and only that). The exact reversal of one managed file or link
is execute/undo.py's: execute uses it too, to put apt sources back when an update fails.
"""
