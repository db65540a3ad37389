"""install: the provisioning pipeline around plan and execute.

    options  = InstallOptions(...)              # the flags, frozen (the command builds it)
    prepared = prepare(options)                 # detect -> resolve -> render -> plan
    show: plan_text(prepared) / plan_json(...)  # --dry-run
    outcome  = apply(prepared, warn, confirm)   # preflight, lock, plan again, execute, verify

Modules: `options` (InstallOptions), `prepared` (Prepared, Outcome), `pipeline` (prepare and
apply), `inputs` (what prepare gathers), `offline` (`--bundle DIR`), `show` (the plan and the
outcome as text and JSON), `report` (the saved install report), `preflight` (checks before
anything changes), `review` (the plan reviewed: `attention` for what a person must do, `advice`
for the summary), `day_after` (the verify after the reboot),
`enrol` (enrolling the enclosure: one core for install and the first boot), `firstboot`
(`egpu-setup firstboot`, a lab image's first boot), `mok_key` (a lab's Secure Boot key, made
and planned into an image), `user_venv` (`egpu-setup venv`: a user's own venv on the root-owned
torch venv), `resume` (`egpu-setup resume-check`: the eGPU after a suspend, and what was on it
before), `sleep_guard` (`egpu-setup sleep-guard`: a logind sleep lock naming the CUDA processes
on the eGPU while there are any).
"""
