"""A stand-in for torch.cuda that replays a recorded real GPU through verify's child (tests only).

verify's child (egpu_setup/verify/_child.py) knows nothing of it: tests/helpers/child_faults.py,
planted in the target venv, loads it once the child has imported torch; it lives in tests/, which
is never shipped. The scenario (a JSON file written by tests/helpers/cuda_recordings.py, its path
in child_faults' control file) holds the recorded values of real GPUs: device properties, bus ids, the arch list of a real wheel,
bandwidthTest GB/s, torch.matmul TFLOPS, each with its source.

What is real and what is replayed:
- Tensors "on the GPU" are CPU tensors and really compute: the training loss really falls.
  A torch function mode moves every `device="cuda"` to the CPU and remembers, per storage,
  which tensors live on the device and which host buffers are pinned.
- Only what needs a GPU is replayed, on a device clock that CUDA events read:
  * a host<->device copy takes bytes / the recorded GB/s (pinned); from pageable memory, the
    real CPU copy into a staging buffer plus that (how the driver copies pageable memory);
  * a matmul of two device tensors is not computed (its result is never read by the child: a
    zero-filled view of the right shape and dtype) and takes 2*m*n*k / the recorded TFLOPS of
    its precision (TF32 when torch.backends.cuda.matmul.allow_tf32);
  * any other device op takes its real CPU time.
  So the child's own arithmetic (bytes / event time, flops / event time) yields the recorded
  numbers; the device never idles between ops, so host overhead does not count.
- fp16 autocast on CUDA runs as CUDA's does on tensor cores, emulated: conv and linear round
  their inputs to fp16, compute in fp32 and return fp16; losses and softmax run in fp32. (CPU
  kernels for fp16 convolutions are about 100x slower than fp32 ones.) GradScaler("cuda") is the
  real GradScaler on those tensors.
- A device allocation of 1 GiB or more is virtual: a zero-stride view of one element, so a
  "24 GiB on the GPU" costs no RAM; fill_() and reads work on it, anything else raises.
- DDP: NCCL cannot exist without GPUs, so init_process_group("nccl") runs gloo (a real process
  group, real all-reduce between the ranks); DDP's device_ids are checked, then dropped.
- Scripted faults (the scenario's "faults") make an op raise a real CUDA error text, return
  garbage or NaN, or slow down, to drive the child's failure paths.

Keep it to the standard library and torch, and Python 3.9 syntax: it runs in the target venv.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

VIRTUAL_BYTES = 1 << 30
_STATE: Replay | None = None  # the Replay of this process


def install(torch: Any, scenario_path: str) -> None:
    """Patch torch.cuda and friends in place and enter the device mode (once per process)."""
    global _STATE
    if _STATE is not None:
        return
    with open(scenario_path, encoding="utf-8") as f:
        scenario = json.load(f)
    # One CPU thread computes what the device would: on a loaded CI machine OpenMP threads that
    # spin against each other make each op many times slower (and the DDP ranks share it too).
    torch.set_num_threads(1)
    _STATE = Replay(torch, scenario)
    _patch(torch, _STATE)
    _patch_cpu(torch, scenario.get("cpu") or {})
    _STATE.mode.__enter__()  # for the life of the process, like a CUDA context
    print(f"cuda stand-in: replaying {scenario.get('title', '?')}", file=sys.stderr)


def visible(gpus: list[Any], env: str | None) -> list[Any]:
    """The GPUs CUDA enumerates under CUDA_VISIBLE_DEVICES (a list of indices; an invalid entry
    ends the list, as the CUDA runtime does)."""
    if env is None:
        return list(gpus)
    out = []
    for item in env.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= len(gpus):
            break
        out.append(gpus[int(item)])
    return out


class Props:
    """What torch.cuda.get_device_properties returns, from recorded values."""

    def __init__(self, gpu: dict[str, Any]) -> None:
        self.name = gpu["name"]
        self.major = gpu["major"]
        self.minor = gpu["minor"]
        self.total_memory = gpu["total_memory"]
        self.multi_processor_count = gpu["multi_processor_count"]
        if gpu.get("gcn_arch"):  # a ROCm build's device: its gfx target, as HIP names it
            self.gcnArchName = gpu["gcn_arch"]
        pci = gpu.get("pci")
        if pci:  # a torch too old to report pci_* fields, or no recorded bus: no attributes
            self.pci_domain_id = pci["domain"]
            self.pci_bus_id = pci["bus"]
            self.pci_device_id = pci["device"]

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // 2**20}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


class Replay:
    """The state of the replayed GPUs in this process."""

    def __init__(self, torch: Any, scenario: dict[str, Any]) -> None:
        self.torch = torch
        self.sc = scenario
        self.gpus = visible(scenario["gpus"], os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.current = 0
        self.clock = 0.0  # device seconds
        self.kinds: weakref.WeakKeyDictionary[Any, tuple[str, int, int]] = (
            weakref.WeakKeyDictionary()
        )
        self.depth = 0
        self.autocast = None  # the dtype of an active autocast("cuda") region
        self.faults = scenario.get("faults") or {}
        self.calls: dict[str, int] = {}
        self.fired: dict[str, int] = {}  # calls a fault has hit so far
        self.runs = 0  # training runs started: each draws its data with a seeded generator
        self.mode = _mode_class(torch)(self)

    # -- devices -----------------------------------------------------------------------------

    def available(self) -> bool:
        return self.sc.get("available", True) is True and bool(self.gpus)

    def index(self, device: Any) -> int:
        if device is None:
            i = self.current
        elif isinstance(device, int):
            i = device
        else:
            d = self.torch.device(device)
            if d.type != "cuda":
                raise ValueError(f"Expected a cuda device, but got: {d}")
            i = self.current if d.index is None else d.index
        if not 0 <= i < len(self.gpus):
            raise RuntimeError("CUDA error: invalid device ordinal")
        return i

    def used(self, index: int) -> int:
        return sum(n for kind, i, n in self.kinds.values() if kind != "pinned" and i == index)

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        i = self.index(device)
        gpu = self.gpus[i]
        free, total = gpu.get("mem_get_info") or (gpu["total_memory"], gpu["total_memory"])
        return free - self.used(i), total

    # -- tags --------------------------------------------------------------------------------

    def tag(self, t: Any, kind: str, index: int = 0, nbytes: int | None = None) -> None:
        storage = t.untyped_storage()
        self.kinds[storage] = (kind, index, storage.nbytes() if nbytes is None else nbytes)

    def kind(self, t: Any) -> str | None:
        if not isinstance(t, self.torch.Tensor) or t.device.type != "cpu":
            return None
        entry = self.kinds.get(t.untyped_storage())
        return entry[0] if entry else None

    def on_device(self, t: Any) -> bool:
        return self.kind(t) in ("device", "virtual")

    # -- the device clock --------------------------------------------------------------------

    def transfer(self, nbytes: int, direction: str, pinned: bool, real: float) -> None:
        rate = self.sc.get(f"{direction}_gbps")
        if not rate:
            raise RuntimeError(f"cuda stand-in: no recorded {direction} rate in this scenario")
        self.clock += (0.0 if pinned else real) + nbytes / (rate * 1e9)

    def matmul_seconds(self, dtype: Any, k: int, flops: float) -> float:
        torch = self.torch
        precision = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype)
        if precision is None:
            precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
        table = self.sc.get("tflops") or {}
        row = table.get(str(k)) or table.get("max") or {}
        rate: float | None = row.get(precision)
        if not rate:
            raise RuntimeError(
                f"cuda stand-in: no recorded {precision} matmul rate for {self.gpus[0]['name']}"
            )
        return flops / (rate * 1e12)

    def fault(self, op: str) -> dict[str, Any] | None:
        """The scripted fault of `op` if it fires on this call: counted per op (`after` calls
        pass first), and limited to some training runs (`runs`, counted from 1) when given."""
        spec: dict[str, Any] | None = self.faults.get(op)
        if not spec:
            return None
        n = self.calls[op] = self.calls.get(op, 0) + 1
        if ("runs" in spec and self.runs not in spec["runs"]) or n <= int(spec.get("after", 0)):
            return None
        self.fired[op] = self.fired.get(op, 0) + 1
        return spec


def _mode_class(torch: Any) -> Any:
    """The torch function mode class (made here: the file must import without torch first)."""
    from torch.overrides import TorchFunctionMode

    class DeviceMode(TorchFunctionMode):  # type: ignore[misc]  # torch is not followed: Any
        def __init__(self, state: Replay) -> None:
            super().__init__()
            self.st = state

        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            st = self.st
            kwargs = dict(kwargs or {})
            if st.depth:  # inside an op we are handling: run it as it is
                return _plain_call(st, func, args, kwargs)
            st.depth += 1
            try:
                return _dispatch(st, func, args, kwargs)
            finally:
                st.depth -= 1

    return DeviceMode


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True  # a bare index names a CUDA device in torch's factory functions
    return str(device).startswith("cuda")


def _plain_call(st: Replay, func: Any, args: Any, kwargs: Any) -> Any:
    """Call with any CUDA device moved to the CPU; tag what a CUDA factory made."""
    cuda = _is_cuda(kwargs.get("device"))
    pinned = bool(kwargs.pop("pin_memory", False))
    index = st.index(kwargs["device"]) if cuda else 0
    if cuda:
        kwargs["device"] = "cpu"
    out = func(*args, **kwargs)
    if isinstance(out, st.torch.Tensor):
        if cuda:
            st.tag(out, "device", index)
        elif pinned:
            st.tag(out, "pinned")
    return out


def _tensors(obj: Any) -> Iterator[Any]:
    assert _STATE is not None, "the stand-in is installed before any op runs"
    torch = _STATE.torch
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def _dispatch(st: Replay, func: Any, args: Any, kwargs: Any) -> Any:
    torch = st.torch
    T = torch.Tensor
    F = torch.nn.functional
    if func in (T.to, T.cuda, T.cpu):
        return _to(st, func, args, kwargs)
    if func is T.copy_:
        return _copy(st, args, kwargs)
    if func is T.pin_memory:
        out = args[0].clone()
        st.tag(out, "pinned")
        return out
    if func is T.is_pinned:
        return st.kind(args[0]) == "pinned"
    if func in (torch.matmul, T.matmul, torch.mm, T.mm) and all(st.on_device(a) for a in args[:2]):
        return _matmul(st, func, args, kwargs)
    if func is torch.empty and _is_cuda(kwargs.get("device")):
        return _allocate(st, args, kwargs)
    if func is torch.randn and "generator" in kwargs:
        st.runs += 1  # the child's make_data(): one per training run
    if "device" in kwargs or "pin_memory" in kwargs:
        return _timed(
            st, lambda: _plain_call(st, func, args, kwargs), _is_cuda(kwargs.get("device"))
        )
    inputs = list(_tensors(args)) + list(_tensors(kwargs))
    device = any(st.on_device(t) for t in inputs)
    if inputs and st.kind(inputs[0]) == "virtual" and _writes(getattr(func, "__name__", "")):
        return _write_virtual(st, func, args)
    if device and st.autocast is not None and func in (F.conv2d, F.linear):
        return _lower_precision(st, func, args, kwargs)
    if device and st.autocast is not None and func in (F.cross_entropy, F.log_softmax, F.softmax):
        args = tuple(a.float() if _floating(torch, a) else a for a in args)
    out = _timed(st, lambda: func(*args, **kwargs), device)
    if device:
        index = next(st.kinds[t.untyped_storage()][1] for t in inputs if st.on_device(t))
        for t in _tensors(out):
            if st.kind(t) is None:
                st.tag(t, "device", index)
    return out


def _writes(name: str) -> bool:
    """Does a Tensor method of this name write into its tensor (add_, __setitem__, __iadd__)?"""
    if name.startswith("__"):
        return name == "__setitem__" or (name.startswith("__i") and name != "__index__")
    return name.endswith("_")


def _floating(torch: Any, x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _timed(st: Replay, call: Any, device: bool) -> Any:
    t0 = time.perf_counter()
    out = call()
    if device:
        st.clock += time.perf_counter() - t0
    return out


def _to(st: Replay, func: Any, args: Any, kwargs: Any) -> Any:
    torch = st.torch
    t = args[0]
    if func is torch.Tensor.cpu:
        target, dtype, fmt = torch.device("cpu"), None, None
    elif func is torch.Tensor.cuda:
        dev = args[1] if len(args) > 1 else kwargs.get("device")
        target, dtype, fmt = torch.device("cuda", st.index(dev)), None, None
    else:  # non_blocking changes nothing here: the stand-in's device never runs ahead
        rest = {k: v for k, v in kwargs.items() if k != "copy"}
        target, dtype, _, fmt = torch._C._nn._parse_to(*args[1:], **rest)
    src = st.on_device(t)
    extra = {} if fmt is None else {"memory_format": fmt}
    if target is None or target.type not in ("cuda", "cpu") or (target.type == "cuda") == src:
        # no move: a dtype change, or already where it is asked to be
        out = _timed(
            st, lambda: t.to(dtype=dtype or t.dtype, copy=bool(kwargs.get("copy")), **extra), src
        )
        if src and st.kind(out) is None:
            st.tag(out, "device", st.kinds[t.untyped_storage()][1])
        return out
    direction = "h2d" if target.type == "cuda" else "d2h"
    if st.fault(f"copy_{direction}"):
        raise RuntimeError(st.faults[f"copy_{direction}"]["error"])
    t0 = time.perf_counter()
    out = t.to("cpu", dtype=dtype or t.dtype, copy=True, **extra)
    real = time.perf_counter() - t0
    st.transfer(out.numel() * out.element_size(), direction, st.kind(t) == "pinned", real)
    if direction == "h2d":
        st.tag(out, "device", st.index(target))
    return out


def _copy(st: Replay, args: Any, kwargs: Any) -> Any:
    dst, src = args[0], args[1]
    if st.kind(dst) == "virtual":
        raise RuntimeError("cuda stand-in: a virtual (replayed) allocation cannot be copied into")
    to_dev, from_dev = st.on_device(dst), st.on_device(src)
    direction = "h2d" if to_dev and not from_dev else "d2h" if from_dev and not to_dev else None
    if direction and st.fault(f"copy_{direction}"):
        raise RuntimeError(st.faults[f"copy_{direction}"]["error"])
    t0 = time.perf_counter()
    dst.copy_(src)
    real = time.perf_counter() - t0
    if direction == "h2d":
        st.transfer(src.numel() * src.element_size(), "h2d", st.kind(src) == "pinned", real)
    elif direction == "d2h":
        st.transfer(src.numel() * src.element_size(), "d2h", st.kind(dst) == "pinned", real)
    elif to_dev:
        st.clock += real
    return dst


def _matmul(st: Replay, func: Any, args: Any, kwargs: Any) -> Any:
    torch = st.torch
    a, b = args[0], args[1]
    if st.fault("matmul"):
        raise RuntimeError(st.faults["matmul"]["error"])
    # shapes and dtypes checked by torch itself, on meta tensors (no data, no time)
    meta = func(
        torch.empty(a.shape, dtype=a.dtype, device="meta"),
        torch.empty(b.shape, dtype=b.dtype, device="meta"),
    )
    k = a.shape[-1]
    flops = 2.0 * meta.numel() * k
    st.clock += st.matmul_seconds(a.dtype, k, flops)
    out = torch.zeros((), dtype=meta.dtype).expand(meta.shape)
    st.tag(out, "virtual", st.kinds[a.untyped_storage()][1], meta.numel() * meta.element_size())
    return out


def _allocate(st: Replay, args: Any, kwargs: Any) -> Any:
    torch = st.torch
    index = st.index(kwargs["device"])
    dims = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
    numel = 1
    for d in dims:
        numel *= int(d)
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    free, total = st.mem_get_info(index)
    if nbytes >= VIRTUAL_BYTES and st.fault("alloc"):
        raise RuntimeError(st.faults["alloc"]["error"])
    if nbytes > free:
        gib = 2**30
        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {nbytes / gib:.2f} GiB. GPU {index} has a "
            f"total capacity of {total / gib:.2f} GiB of which {free / gib:.2f} GiB is free."
        )
    if nbytes < VIRTUAL_BYTES:
        return _plain_call(st, torch.empty, args, kwargs)
    out = torch.zeros((), dtype=dtype).expand(*dims) if dims else torch.zeros((), dtype=dtype)
    st.tag(out, "virtual", index, nbytes)
    return out


def _write_virtual(st: Replay, func: Any, args: Any) -> Any:
    torch = st.torch
    t = args[0]
    if func is torch.Tensor.fill_:
        t.as_strided((), (), t.storage_offset()).fill_(args[1])
        return t
    if func is torch.Tensor.zero_:
        t.as_strided((), (), t.storage_offset()).zero_()
        return t
    raise RuntimeError(
        f"cuda stand-in: a virtual (replayed) allocation supports fill_ and reads, not "
        f"{getattr(func, '__name__', func)}"
    )


def _lower_precision(st: Replay, func: Any, args: Any, kwargs: Any) -> Any:
    """conv/linear under autocast("cuda", float16): fp16-rounded inputs, fp32 compute, a
    fp16-rounded output. linear returns it as float16 (the logits the child checks); a conv
    keeps fp16 values in fp32 storage, so the CPU's elementwise kernels after it stay fast."""
    torch = st.torch
    low = st.autocast
    name = "conv2d" if func is torch.nn.functional.conv2d else "linear"

    def cast(x: Any) -> Any:
        return x.to(low).float() if _floating(torch, x) else x

    def call() -> Any:
        out = func(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()}).to(low)
        return out if name == "linear" else out.float()

    fault = st.fault(name)
    out = _timed(st, call, True)
    if fault is not None:
        if "error" in fault:
            raise RuntimeError(fault["error"])
        if fault.get("result") == "nan":
            out = out * float("nan")
        elif fault.get("result") == "garbage":
            out = out * 0 + torch.randn_like(out)
        if fault.get("sleep_per_call_s"):  # slower with every call: a GPU clocking down
            time.sleep(fault["sleep_per_call_s"] * st.fired[name])
    index = next(st.kinds[a.untyped_storage()][1] for a in args if st.on_device(a))
    st.tag(out, "device", index)
    return out


class Event:
    """torch.cuda.Event on the replayed device clock."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: Any = False
    ) -> None:
        self.enable_timing = enable_timing
        self.t: float | None = None

    def record(self, stream: Any = None) -> None:
        assert _STATE is not None, "the stand-in is installed before any op runs"
        self.t = _STATE.clock

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Event) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.t is None or end.t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.t - self.t) * 1000.0


def _patch(torch: Any, st: Replay) -> None:
    cuda = torch.cuda
    sc = st.sc
    unavailable = sc.get("available", True)

    def is_available() -> bool:
        if isinstance(unavailable, dict):
            warnings.warn(unavailable["warning"], UserWarning, stacklevel=2)
        return st.available()

    def init() -> None:
        if isinstance(unavailable, dict):
            raise RuntimeError(unavailable["init_error"])

    def set_device(device: Any) -> None:
        st.current = st.index(device)

    def synchronize(device: Any = None) -> None:
        st.index(device)

    cuda.is_available = is_available
    cuda.init = init
    cuda.device_count = lambda: len(st.gpus) if st.available() else 0
    cuda.get_device_properties = lambda device=None: Props(st.gpus[st.index(device)])
    cuda.get_device_name = lambda device=None: st.gpus[st.index(device)]["name"]
    cuda.get_device_capability = lambda device=None: (
        st.gpus[st.index(device)]["major"],
        st.gpus[st.index(device)]["minor"],
    )
    cuda.get_arch_list = lambda: list(sc["arch_list"])
    cuda.mem_get_info = st.mem_get_info
    cuda.set_device = set_device
    cuda.current_device = lambda: st.current
    cuda.synchronize = synchronize
    cuda.empty_cache = lambda: None
    cuda.Event = Event
    torch.version.cuda = sc["torch_cuda"]
    # a ROCm build sets torch.version.hip and leaves .cuda None, keeping the torch.cuda API
    # (https://pytorch.org/docs/stable/notes/hip.html)
    torch.version.hip = sc.get("torch_hip")
    if sc.get("driver_cuda"):
        torch._C._cuda_getDriverVersion = lambda: int(sc["driver_cuda"])

    real_autocast = torch.autocast

    class Autocast:
        """torch.autocast: the real one for the CPU, the emulated fp16 one for "cuda"."""

        def __init__(
            self,
            device_type: Any,
            dtype: Any = None,
            enabled: Any = True,
            cache_enabled: Any = None,
        ) -> None:
            self.cuda = device_type == "cuda"
            self.dtype = dtype or torch.float16
            self.enabled = enabled
            self.real = None if self.cuda else real_autocast(device_type, dtype, enabled)

        def __enter__(self) -> Any:
            if self.real is not None:
                return self.real.__enter__()
            self.prev = st.autocast
            st.autocast = self.dtype if self.enabled and not st.faults.get("autocast") else None
            return self

        def __exit__(self, *exc: Any) -> Any:
            if self.real is not None:
                return self.real.__exit__(*exc)
            st.autocast = self.prev
            return False

    torch.autocast = Autocast
    real_scaler = torch.amp.GradScaler

    def grad_scaler(device: Any = "cuda", *args: Any, **kwargs: Any) -> Any:
        return real_scaler("cpu" if device == "cuda" else device, *args, **kwargs)

    torch.amp.GradScaler = grad_scaler
    _patch_distributed(torch, st)


def _patch_distributed(torch: Any, st: Replay) -> None:
    import torch.distributed as dist
    import torch.nn.parallel as parallel

    real_init = dist.init_process_group

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if backend == "nccl":
            print("cuda stand-in: nccl runs as gloo (no GPU here)", file=sys.stderr)
            backend = "gloo"
        return real_init(backend, *args, **kwargs)

    dist.init_process_group = init_process_group
    real_ddp = parallel.DistributedDataParallel

    class DistributedDataParallel(real_ddp):  # type: ignore[misc, valid-type]  # torch: Any
        def __init__(self, module: Any, device_ids: Any = None, *args: Any, **kwargs: Any) -> None:
            for d in device_ids or ():
                st.index(d)
            spec = st.faults.get("ddp")
            if spec and spec.get("rank") in ("all", dist.get_rank()):
                if spec.get("hang"):
                    while True:
                        time.sleep(3600)
                raise RuntimeError(spec["error"])
            super().__init__(module, None, *args, **kwargs)

    parallel.DistributedDataParallel = DistributedDataParallel


def _patch_cpu(torch: Any, spec: dict[str, Any]) -> None:
    """CPU-side fakes for the CPU path's branches: a CPU without native bf16 (torch's own probes
    say no), a torch whose probes raise, a capability query that fails."""
    cpu = torch.cpu
    if spec.get("native_bf16") is False:
        cpu._is_avx512_bf16_supported = lambda: False
        cpu._is_amx_tile_supported = lambda: False
    if spec.get("probes") == "raise":

        def broken() -> None:
            raise RuntimeError("cuda stand-in: this probe fails")

        cpu._is_avx512_bf16_supported = broken
        torch.backends.cpu.get_cpu_capability = broken
