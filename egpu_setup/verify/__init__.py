"""verify: prove the eGPU trains.

The tool process never imports torch. It checks the host side (driver loaded, kernel module and
userspace versions agree, nvidia-smi lists the GPU) through a Host, then runs `_child.py` in the
TARGET Python (the venv that received torch) in a session of its own with a hard timeout, so a
GPU that hard-locks under CUDA (NVIDIA/open-gpu-kernel-modules issues #979, #1247) cannot hang
egpu-setup. Every step of the child has a time budget; its results stream back one JSON line
each and are printed as they come. The child fsyncs a progress marker before each step; the
next run reads it and says which step a locked-up machine was in.

Modules: `checks` (the Check value and its JSON), `host_checks` (pure checks over facts and
nvidia-smi text), `progress` (the marker log), `runner` (spawn, stream, timeout, ending the
session), `session` (`run_verify`: the whole run; budgets and sizes), `references` (training
throughput of cards in an internal slot), `report` (table, JSON, saving), `live` (the table
while it happens), `records` (the child's lines read as input: known fields, capped, finite),
`_child` (runs in the target venv).
"""
