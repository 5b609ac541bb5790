"""Describe the device a run uses. torch is imported lazily: spec-only users never need it."""

from __future__ import annotations

import os
import platform as _platform
from dataclasses import asdict, dataclass
from typing import Any, Optional

__all__ = ["DeviceInfo", "describe_device", "resolve_device"]


@dataclass(frozen=True)
class DeviceInfo:
    kind: str                      # "cuda" (also ROCm builds of torch) or "cpu"
    name: str
    sm_count: Optional[int] = None
    l2_bytes: Optional[int] = None
    memory_bytes: Optional[int] = None
    capability: Optional[str] = None
    driver: Optional[str] = None
    runtime: Optional[str] = None   # "cuda 13.0" or "hip 6.4"
    cpu_threads: Optional[int] = None
    uuid: Optional[str] = None
    """The GPU's UUID (`GPU-...`), which names the card across processes and reboots."""
    pci_bus_id: Optional[str] = None
    """`domain:bus:device` in hex, as NVML and nvidia-smi print it."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def resolve_device(requested: Optional[str]) -> str:
    """`cuda` when asked or when a GPU is there; `cpu` otherwise. Asking for cuda without one fails."""
    import torch

    if requested in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch sees no GPU (torch.cuda.is_available() is False)")
    if requested not in ("cuda", "cpu"):
        raise ValueError(f"--device {requested}: use cuda or cpu")
    return requested


def _nvml_driver() -> Optional[str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:  # NVML missing (CPU machine, ROCm): the driver stays unknown
        return None


def describe_device(kind: str) -> DeviceInfo:
    import torch

    if kind == "cpu":
        return DeviceInfo(kind="cpu", name=_platform.processor() or _platform.machine(),
                          cpu_threads=torch.get_num_threads(),
                          memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    hip = getattr(torch.version, "hip", None)
    return DeviceInfo(
        kind="cuda",
        name=props.name,
        sm_count=props.multi_processor_count,
        l2_bytes=getattr(props, "L2_cache_size", None),
        memory_bytes=props.total_memory,
        capability=f"{props.major}.{props.minor}",
        driver=_nvml_driver(),
        runtime=f"hip {hip}" if hip else f"cuda {torch.version.cuda}",
        uuid=_gpu_uuid(props),
        pci_bus_id=_pci_bus_id(props),
    )


def _gpu_uuid(props: Any) -> Optional[str]:
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def _pci_bus_id(props: Any) -> Optional[str]:
    try:
        return f"{int(props.pci_domain_id):08x}:{int(props.pci_bus_id):02x}:{int(props.pci_device_id):02x}.0"
    except (AttributeError, TypeError, ValueError):
        return None
