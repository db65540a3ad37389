"""egpu-setup: a Linux laptop plus an NVIDIA or AMD eGPU, turned into a verified PyTorch machine."""

__version__ = "0.1.0"
