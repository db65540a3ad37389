"""image: what `install --root IMAGE` adds so that a lab image finishes the job by itself.

Modules: `additions` (the steps `--root` adds to the plan: the tool, the first-boot marker,
the seal), `tool` (which egpu-setup the units run, and installing it root-owned: always in an
image, and on a running system whose egpu-setup a user could change). Entering the image to
run its commands is the gateway's (host/image_root.py, host/enter.py); the first boot itself
runs install again (install/firstboot.py), so it sits with install.
"""
