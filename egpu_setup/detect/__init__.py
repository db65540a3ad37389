"""detect: pure `parse_*` functions over text, thin `probe_*` functions that fetch the text
through a Host; the result is one frozen HostFacts. Soft: a missing source gives None.

Modules: `facts` (HostFacts and its parts), `probe` (detect_host: everything merged), `system`
(OS, kernel, WSL, Secure Boot, Python), `osrelease`, `release_files` (what os-release leaves
out: the other release files through the `distro` package, and lsb-release), `pci` (the PCI
tree and which GPU is external), `pciids`, `sysfs` (attribute parsers), `lspci`, `lspci_tree`
(`lspci -t`/`-tv` trees as pasted), `nvidia` and
`nvidia_smi` (the driver), `thunderbolt` and `boltctl` (domains, devices, policies), `numa`
(nodes, each GPU's node), `kernel_log` (a recording's kernel log, bounded however big it is),
`kernels` (installed kernels, their headers and NVIDIA modules, `dkms status`), `health`
(one nvidia-smi reading of temperature, power, throttling and link; the kernel log's Xids),
`dpkg_status` (dpkg's database and apt pins: the driver's packages and the versions a hold
keeps), `rocm` (AMD's `rocminfo`, `rocm-smi`, `amd-smi`), `amdgpu_log` (amdgpu's hung rings,
resets, failed init and SMU lines), `processes` (which process holds which file: /proc's fd
links and maps, what `fuser -v` prints).
"""
