"""Execution providers for the engine: which one, its session settings (pure functions), and SessionRunner,
which runs one session plainly or through IO binding.

    device      provider                 session settings
    cpu         CPUExecutionProvider     defaults
    cuda        CUDAExecutionProvider    device_id; use_tf32 0 unless allowed (TF32 matmuls broke fp32's
                                         padding invariance on an H100: 1.7e-3, 1.1 % of argmaxes moved;
                                         3.8e-6 and none with use_tf32=0); enable_cuda_graph when asked
    directml    DmlExecutionProvider     enable_mem_pattern off, sequential execution; device_id, or
                                         performance_preference + device_filter when no adapter is named

`auto` tries CUDA, then DirectML, then CPU, keeping only those this onnxruntime build contains
(`get_available_providers()` lists what was built, not what works: the engine checks the provider a
session really started). The environment variable INFERENCE_DEVICE is read here and nowhere else.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from .errors import ProviderError

log = logging.getLogger(__name__)

_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int32)": np.int32,
                "tensor(int64)": np.int64}
DEVICE_ENV = "INFERENCE_DEVICE"
DEVICES = ("auto", "cpu", "cuda", "directml")
DEVICE_ALIASES = {"dml": "directml"}
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "directml": "DmlExecutionProvider"}
AUTO_ORDER = ("cuda", "directml", "cpu")
DML_PREFERENCES = ("default", "high_performance", "minimum_power")
DML_FILTERS = ("gpu", "npu", "any")
# Substrings of ONNX Runtime error messages that mean the device itself failed (lost, reset, out of
# memory), as opposed to a bad input: DXGI device-removed/hung/reset HRESULTs and CUDA runtime failures.
DEVICE_FAILURE_MARKERS = (
    "887a0005", "887a0006", "887a0007", "dxgi_error", "device removed", "device_removed",
    "cuda failure", "cuda error", "cudaerror", "cublas", "cudnn", "out of memory",
)


ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino",
                     "onnxruntime-qnn", "onnxruntime-windowsml", "onnxruntime-training")


def conflicting_runtimes(installed: list[str] | None = None) -> list[str]:
    """The ONNX Runtime packages installed side by side (they share the import name `onnxruntime` and
    overwrite each other's files, so which provider loads is an accident): a list of two or more, or []."""
    if installed is None:
        from importlib import metadata

        installed = [d.metadata["Name"] or "" for d in metadata.distributions()]
    found = sorted({name.lower().replace("_", "-") for name in installed} & set(ORT_DISTRIBUTIONS))
    return found if len(found) > 1 else []


def resolve_device(cli_value: str | None = None) -> str:
    """The device to use: the CLI value if given, else $INFERENCE_DEVICE, else "auto"; ValueError if unknown."""
    raw = cli_value if cli_value else os.environ.get(DEVICE_ENV, "") or "auto"
    value = DEVICE_ALIASES.get(raw.strip().lower(), raw.strip().lower())
    if value not in DEVICES:
        source = "--device" if cli_value else DEVICE_ENV
        raise ValueError(f"{source}: unknown device {raw!r} (expected one of {', '.join(DEVICES)})")
    return value


INSTALL_HINTS = {"cuda": "install onnxruntime-gpu instead of onnxruntime",
                 "directml": "install onnxruntime-directml instead of onnxruntime (Windows x64)", "cpu": ""}


def candidate_devices(device: str, available: list[str]) -> list[str]:
    """The devices to try in order: for "auto", those of AUTO_ORDER whose provider is in `available`."""
    if device == "auto":
        return [d for d in AUTO_ORDER if PROVIDERS[d] in available]
    return [device]


def devices_to_try(device: str) -> list[str]:
    """candidate_devices() for this onnxruntime build; ProviderError for an explicit device it lacks."""
    conflict = conflicting_runtimes()
    if conflict:
        log.warning("%s are installed together; they overwrite each other, so the provider that loads is "
                    "an accident: uninstall all of them and install one", " and ".join(conflict))
    available = ort.get_available_providers()
    devices = candidate_devices(device, available)
    missing = [d for d in devices if PROVIDERS[d] not in available]
    if missing:  # an explicit device this build lacks (auto only lists built ones)
        raise ProviderError(f"{missing[0]} requested, but this onnxruntime {ort.__version__} build has only "
                            f"{', '.join(available)} ({INSTALL_HINTS[missing[0]]})", device=missing[0])
    return devices


@dataclass(frozen=True)
class ProviderConfig:
    """Everything provider-specific that goes into creating one session."""

    device: str
    providers: tuple[str, ...]  # priority order; CPU last takes nodes the GPU provider lacks
    provider_options: tuple[dict[str, str], ...]  # one dict per provider (values are strings)
    session_config: dict[str, str] = field(default_factory=dict)  # SessionOptions.add_session_config_entry
    enable_mem_pattern: bool = True
    io_binding: bool = False  # run through IO binding with device-resident buffers (CUDA graphs)

    @property
    def provider(self) -> str:
        return self.providers[0]


def provider_config(
    device: str,
    device_id: int | None = None,
    cuda_graph: bool = False,
    allow_tf32: bool = False,
    dml_performance_preference: str = "high_performance",
    dml_device_filter: str = "gpu",
    cpu_spin_us: int = 0,
) -> ProviderConfig:
    """Session settings for one concrete device ("cpu", "cuda" or "directml"), per ONNX Runtime's docs."""
    cpu = PROVIDERS["cpu"]
    if device == "cpu":
        # No spinning: idle intra-op threads busy-wait by default, which on a few shared cores steals the
        # CPU from the event loop and the other containers' sessions (measured with bench on 2 busy
        # cores: a 15 s int8 run 0.49-0.55 s without spinning, 1.0-1.16 s with it; docs/benchmarks.md).
        # `cpu_spin_us` > 0 spins that long at most and never past the end of a run (a quiet machine's choice).
        if not cpu_spin_us:
            return ProviderConfig(device, (cpu,), ({},), session_config={"session.intra_op.allow_spinning": "0"})
        return ProviderConfig(device, (cpu,), ({},), session_config={
            "session.intra_op.allow_spinning": "1", "session.intra_op.spin_duration_us": str(cpu_spin_us),
            "session.force_spinning_stop": "1"})
    if device == "cuda":
        options = {"device_id": str(device_id or 0), "use_tf32": "1" if allow_tf32 else "0"}
        if cuda_graph:
            # One graph per session (one session per batch size and container, so no gpu_graph_id is
            # needed); static shapes, fixed input/output addresses (SessionRunner), every node on CUDA
            # (ONNX Runtime refuses to create the session otherwise).
            options["enable_cuda_graph"] = "1"
        return ProviderConfig(device, (PROVIDERS["cuda"], cpu), (options, {}), io_binding=cuda_graph)
    if device == "directml":
        if dml_performance_preference not in DML_PREFERENCES:
            raise ValueError(f"DirectML performance preference must be one of {', '.join(DML_PREFERENCES)}")
        if dml_device_filter not in DML_FILTERS:
            raise ValueError(f"DirectML device filter must be one of {', '.join(DML_FILTERS)}")
        if device_id is not None:  # an explicit adapter index overrides preference and filter
            options = {"device_id": str(device_id)}
        else:
            options = {"performance_preference": dml_performance_preference, "device_filter": dml_device_filter}
        # DML needs memory patterns off and sequential execution (the engine always runs sequentially).
        return ProviderConfig(device, (PROVIDERS["directml"], cpu), (options, {}), enable_mem_pattern=False)
    raise ValueError(f"no provider settings for device {device!r}")


def is_device_failure(exc: BaseException) -> bool:
    """Whether an ONNX Runtime error says the device failed (worth rebuilding sessions), not the input."""
    if type(exc).__name__ == "EPFail":
        return True
    text = str(exc).lower()
    return any(marker in text for marker in DEVICE_FAILURE_MARKERS)


class SessionRunner:
    """One (batch, container) session, fed with the dtypes the graph declares, fetching only the outputs a
    call names. With `config.io_binding` (CUDA graphs) it runs through IO binding on buffers at fixed
    addresses: every input and output is allocated once on the device, *before the first run*, and
    inputs are overwritten in place (OrtValue.update_inplace) on every call.

    Why before the first run: ONNX Runtime captures the CUDA graph inside the first run_with_iobinding
    call (a regular run, then a second, captured one, in the same call), recording the addresses bound at
    that moment. The former runner bound its outputs to ORT-allocated buffers for that first run and
    rebound them to new buffers afterwards: every replay then wrote into the first, since freed, buffers
    and the caller read buffers nothing wrote (output lengths 0, unrelated log-probs on the H100).
    Output shapes are known before any run because every free dimension is fixed by the overrides.
    """

    def __init__(self, session: ort.InferenceSession, batch: int, size: int, config: ProviderConfig,
                 device_id: int) -> None:
        self.session, self.batch, self.size, self.config, self.device_id = session, batch, size, config, device_id
        self.memory = "cuda" if config.device == "cuda" else "cpu"  # where bound buffers live
        self.dtypes = {i.name: _NUMPY_TYPES.get(i.type, np.float32) for i in session.get_inputs()}
        self.output_names = tuple(o.name for o in session.get_outputs())
        self.warmed = False
        self.weights: dict = {}  # shared weights given to the session with add_initializer (pipeline/sessions.py)
        self._binding: ort.IOBinding | None = None
        self._inputs: dict[str, ort.OrtValue] = {}
        self._outputs: dict[str, ort.OrtValue] = {}

    def run(self, feed: dict[str, np.ndarray], names: tuple[str, ...] | None = None) -> list[np.ndarray]:
        """The outputs `names` (default: all) for one batch; the host receives only those."""
        names = tuple(names or self.output_names)
        # only the inputs this graph has (a Paraformer takes no language or text-norm prompt)
        feed = {k: np.ascontiguousarray(v, dtype=self.dtypes[k]) for k, v in feed.items() if k in self.dtypes}
        if not self.config.io_binding:
            return self.session.run(list(names), feed)
        if self._binding is None:
            self._bind(feed)
        else:
            for name, value in feed.items():  # CUDA graphs replay fixed addresses: copy into the bound buffers
                self._inputs[name].update_inplace(value)
        self.session.run_with_iobinding(self._binding)
        # numpy() of a CPU OrtValue aliases its buffer, which the next run overwrites; from CUDA it copies
        return [self._outputs[n].numpy().copy() if self.memory == "cpu" else self._outputs[n].numpy() for n in names]

    def _bind(self, feed: dict[str, np.ndarray]) -> None:
        outputs = {o.name: (o.shape, _NUMPY_TYPES.get(o.type)) for o in self.session.get_outputs()}
        unknown = {n: shape for n, (shape, dtype) in outputs.items()
                   if dtype is None or not all(isinstance(d, int) for d in shape)}
        if unknown:
            raise RuntimeError(f"IO binding needs static output shapes and known types, got {unknown}")
        binding = self.session.io_binding()
        self._inputs = {k: ort.OrtValue.ortvalue_from_numpy(v, self.memory, self.device_id) for k, v in feed.items()}
        self._outputs = {n: ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, self.memory, self.device_id)
                         for n, (shape, dtype) in outputs.items()}
        for name, value in self._inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name, value in self._outputs.items():  # every output: the captured graph writes them all
            binding.bind_ortvalue_output(name, value)
        self._binding = binding


# One MatMulInteger: u8 [1, 2] times the s8 initializer [[127], [127]] (tests/pipeline/test_int8_kernels.py makes
# these bytes again with the onnx package, which serving does not import).
_SATURATION_PROBE = (b"\x08\x05\x12\x06unipad:j\n\x18\n\x01a\n\x01b\x12\x01y\"\rMatMulInteger\x12\x15int8_saturation"
                     b"_probe*\r\x08\x02\x08\x01\x10\x03B\x01bJ\x02\x7f\x7fZ\x13\n\x01a\x12\x0e\n\x0c\x08\x02\x12\x08\n"
                     b"\x02\x08\x01\n\x02\x08\x02b\x13\n\x01y\x12\x0e\n\x0c\x08\x06\x12\x08\n\x02\x08\x01\n\x02\x08"
                     b"\x01B\x04\n\x00\x10\n")


@functools.cache
def int8_kernels_saturate() -> bool:
    """Whether this onnxruntime's CPU int8 kernels add u8 x s8 products in 16 bits with saturation (x86 without
    VNNI: pipeline/modeldir.py INT8_WEIGHT_BITS says what follows): 255 x 127 twice is 64770, or 32767 there."""
    try:
        session = ort.InferenceSession(_SATURATION_PROBE, providers=["CPUExecutionProvider"])
        answer = int(session.run(None, {"a": np.full((1, 2), 255, np.uint8)})[0][0, 0])
    except Exception as exc:  # noqa: BLE001 - a build without the kernel runs no int8 graph either
        log.warning("the int8 kernel probe did not run (%s); int8 graphs are taken as exact", exc)
        return False
    return answer != 2 * 255 * 127

