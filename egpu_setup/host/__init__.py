"""host: the one gateway to the machine; every file read and every process goes through a Host.

Modules: `machine` (Host and its three kinds: live, recorded `--from`, root-prefixed `--root`),
`image_root` and `enter` (a command entered into an image with its API filesystems),
`root_owned` (may root run this file: owned by root, writable by nobody else, up to /),
`trust` (run as root only what root owns: whom to run a program as, or refuse),
`process` (starting a program: live output, a deadline, the whole session ended on timeout),
`identity` (the hash of /etc/machine-id every report records).
"""
