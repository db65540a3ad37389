"""host: the one gateway to the machine; every file read and every process goes through a Host.

Modules: `machine` (Host and its three kinds: live, recorded `--from`, root-prefixed `--root`),
`image_root` and `enter` (a command entered into an image with its API filesystems),
`trust` (run as root only what root owns: may root run this file, whom to run a program as,
or refuse),
`process` (starting a program: live output, a deadline, the whole session ended on timeout),
`tracked_session` (verify's child: every descendant, setsid() ones too, ended afterwards),
`identity` (the hash of /etc/machine-id every report records),
`libc` (syncfs(2), prctl(2) and capset(2), which the os module lacks),
`dpkg_lock` (who holds dpkg's lock, from /proc/locks),
`umask` (the floor every run and child takes: no group or world write bits).
"""
