"""host: the one gateway to the machine; every file read and every process goes through a Host.

Modules: `machine` (Host and its three kinds: live, recorded `--from`, root-prefixed `--root`),
`process` (starting a program: live output, a deadline, the whole session ended on timeout),
`trust` (run as root only what root owns: whom to run a program as, or refuse).
"""
