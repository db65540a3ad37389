"""commands: the command-line layer, one module per command; each turns its flags into one typed
options value, makes one core call, prints the result and maps it to an exit code.

Each command is a Click command (https://click.palletsprojects.com/) named `command` in its
module, which egpu_setup/cli.py imports only when that command runs. Modules: `_options` (every
option more than one command takes, declared once; JSON printing), `detect`, `record`, `doctor`,
`resolve`, `install`, `verify`, `render`, `rollback`, `eject`, `profiles`, `matrix`, `bundle`,
`report`, `firstboot` (a lab image's first boot), `venv` (a user's own venv on the verified
torch), `kernels` (an NVIDIA module for every installed kernel), `mok_key` (`mok-key new`: a
lab's Secure Boot module signing key), `resume_check` (the eGPU after a suspend), `sleep_guard`
(no sleep while CUDA runs on the eGPU), `health` (the eGPU's temperature, power, throttling, link
and Xid events while people train).
"""
