"""render: the hot-plug configuration, rendered in memory from validated values.

Modules: `checks` (every value's one allowed shape), `thunderbolt` (how the enclosure is
authorized), `sleep` (display mode's video-memory preservation and NVIDIA's suspend units,
where the driver ships them), `context` (the decisions and the RenderContext), `headers` (the
header that marks our files), `files` (templates -> files, links and the commands an install
runs after them), `tree` (`render --out DIR`: the set written under a directory), `hold` (the driver
hold's apt pin and unattended-upgrades drop-in, from dpkg's status), `amd` (an AMD eGPU's one
udev rule: runtime PM off).
"""
