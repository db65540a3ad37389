"""verify: prove the eGPU trains.

The tool process never imports torch. It checks the host side (driver loaded, kernel module and
userspace versions agree, nvidia-smi lists the GPU) through a Host, then runs `_child.py` in the
TARGET Python (the venv that received torch) as a separate process group with a hard timeout,
so a GPU that hard-locks under CUDA cannot hang egpu-setup (reference/hotplug-security.md §7 rows
10 and 39). The child fsyncs a progress marker before each step; the next run reads it and says
which step a locked-up machine was in.

Modules: `checks` (the Check value and its JSON), `host_checks` (pure checks over facts and
nvidia-smi text), `progress` (the marker log), `runner` (spawn, timeout, kill), `session`
(`run_verify`: the whole run), `report` (table, JSON, saving), `_child` (runs in the target venv).
"""
