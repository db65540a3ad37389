"""compat: what is known about drivers, CUDA and torch wheels, as data with sources.

Modules: `versions` (driver, CUDA, Python and compute-capability values), `matrix` (the shipped
snapshot, plus the overlay), `overlay` (the cached `matrix update` result), `fetch` (`matrix
update`: the PyTorch wheel index, read and validated), `index_url` (the one rule for an index
URL), `gpus` (the GPU table), `glibc` (each torch release's glibc floor and each distribution's
glibc), `shipped` (the data files, read from their compiled form once a process), `rocm` (AMD GPUs'
gfx targets and the torch ROCm wheels' targets).
"""
