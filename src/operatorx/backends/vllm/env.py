"""vLLM outside an engine: one process-wide config and single-rank distributed state.

Importing this module does not import vLLM. `vllm_missing()` answers whether it can be imported;
`VllmEnv.get()` does the one-time setup the first time a case is prepared:

- a `VllmConfig` with a `model_config` stand-in (dtype bf16, `hf_text_config.model_type`,
  `is_moe`, `quantization_config`: the fields layers read outside an engine) and
  `custom_ops=["all"]`, so activation quantization runs vLLM's CUDA custom ops (an engine
  gets fused Triton kernels from torch.compile instead; this is the eager equivalent);
- `init_distributed_environment` on a free loopback port + `initialize_model_parallel(1, 1)`
  (every vLLM parameter reads the TP rank, even replicated ones). That one-rank world is given up
  when the worker joins a multi-rank group (backends/process_state.py);
- in a rank of a multi-rank case (`VllmEnv.for_ranks`): vLLM's world and its TP group built on
  the group the worker already joined (run/ranks/group.py), with `tensor_parallel_size` and
  `enable_expert_parallel` set as an engine sets them, so layers shard themselves as in serving.
  A process keeps one such state for its life (an engine's groups are built once); a worker serves
  the cases of one split only;
- the workspace manager every modular MoE kernel allocates from.

`case_scope()` is entered once per prepared case: the config is current and the default dtype is
bf16 (vLLM's loader sets it; params_dtype and fp8 out_dtype follow it) until the case is released.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional

from operatorx.backends.vllm.quant_map import MAX_CAPTURE_SIZE, SELECTION_ENV, QuantConfigSpec, capture_sizes

__all__ = ["vllm_missing", "vllm_version", "VllmEnv", "RankSetup", "selection_env", "build_quant_config", "warm",
           "clear_blas_workspaces"]


@functools.lru_cache(maxsize=1)
def vllm_missing() -> Optional[str]:
    """None when vLLM imports; else the reason the backend is unsupported."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install operatorx[vllm])"
    try:
        import vllm  # noqa: F401
    except Exception as err:  # noqa: BLE001 - a broken install is a reason, not a crash
        return f"vLLM is installed but does not import: {type(err).__name__}: {str(err).splitlines()[0][:300]}"
    return None


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "?"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def selection_env() -> dict[str, Any]:
    """The VLLM_* variables that change kernel selection: as set, and as vLLM reads them."""
    out: dict[str, Any] = {"set": {k: os.environ[k] for k in SELECTION_ENV if k in os.environ}}
    try:
        import vllm.envs as envs

        effective = {}
        for k in SELECTION_ENV:
            try:
                effective[k] = getattr(envs, k)
            except AttributeError:
                continue
        out["effective"] = effective
    except Exception as err:  # noqa: BLE001
        out["effective_error"] = repr(err)[:200]
    return out


def eager_ir_priority(cfg: Any) -> None:
    """Dispatch vLLM IR ops (rms_norm, fused_add_rms_norm, ...) as an uncompiled engine does: its vllm_c
    kernels first, then native torch.

    Why: a default VllmConfig says inductor compiles the model, so the platform puts `native` first,
    expecting inductor to fuse it; these layers run eagerly, where `native` is a chain of unfused torch
    kernels that no served model runs. Set once per process (the worker does it in its __init__).
    """
    try:
        from vllm.config.kernel import IrOpPriorityConfig
    except ImportError:          # a vLLM without IR ops: its layers call their own kernels
        return
    cfg.kernel_config.ir_op_priority = IrOpPriorityConfig.with_default(["vllm_c", "native"])
    cfg.kernel_config.ir_op_priority.set_default()


def _set_capture_sizes(cfg: Any) -> None:
    """Put the serving capture sizes on the config after the model stand-in is set: a config built
    without a model resolves them to none (max 0), and attention builders size their graph-decode
    state from the maximum (FlashAttention's split count, GDN's graph batch)."""
    sizes = capture_sizes()
    cfg.compilation_config.cudagraph_capture_sizes = sizes
    cfg.compilation_config.max_cudagraph_capture_size = max(sizes)


def build_quant_config(spec: Optional[QuantConfigSpec]) -> Any:
    """Instantiate the config class from the checkpoint-style dict (None → unquantized)."""
    if spec is None:
        return None
    from operatorx.backends.base import Unsupported

    for pkg in spec.requires:
        if importlib.util.find_spec(pkg) is None:
            raise Unsupported(f"{spec.cls} needs the {pkg!r} package, which is not installed next to vLLM "
                              f"(pip install {pkg.replace('_', '-')})")
    module = importlib.import_module(spec.module)
    cls = getattr(module, spec.cls)
    return cls.from_config(dict(spec.config))


@dataclass(frozen=True)
class RankSetup:
    """This process's place in vLLM's parallel state for a multi-rank case (dp=1: tp = world)."""

    world: int
    rank: int
    tp: int
    expert_parallel: bool

    def describe(self) -> str:
        return f"tp={self.tp}" + (" with expert parallelism" if self.expert_parallel else "")


class VllmEnv:
    """The process-wide vLLM state. Layers register into `config`; one config for all cases."""

    _instance: Optional[VllmEnv] = None
    _lock = threading.Lock()

    def __init__(self, ranks: Optional[RankSetup] = None) -> None:
        import torch
        from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
        from vllm.distributed import parallel_state as ps

        try:
            cfg = VllmConfig(compilation_config=CompilationConfig(
                custom_ops=["all"], cudagraph_capture_sizes=capture_sizes(),
                max_cudagraph_capture_size=MAX_CAPTURE_SIZE))
        except Exception:  # noqa: BLE001 - sizes are metadata here; custom ops are what matter
            cfg = VllmConfig(compilation_config=CompilationConfig(custom_ops=["all"]))
        stub = SimpleNamespace(dtype=torch.bfloat16, is_moe=True, quantization_config=None,
                               hf_text_config=SimpleNamespace(model_type="operatorx"),
                               hf_config=SimpleNamespace(model_type="operatorx"),
                               enforce_eager=False, model="operatorx")
        try:
            cfg.model_config = stub
        except Exception:  # noqa: BLE001 - a validating setter: bypass it
            object.__setattr__(cfg, "model_config", stub)
        _set_capture_sizes(cfg)
        eager_ir_priority(cfg)
        self.config = cfg
        self.ranks = ranks
        self.layer_count = 0
        self.workspace_holders = 0
        if ranks is not None:
            cfg.parallel_config.tensor_parallel_size = ranks.tp
            cfg.parallel_config.enable_expert_parallel = ranks.expert_parallel
        with set_current_vllm_config(cfg):
            if ranks is not None:          # on the group run/ranks/group.py formed (NCCL, this GPU as cuda:0)
                ps.init_distributed_environment(world_size=ranks.world, rank=ranks.rank, local_rank=0,
                                                distributed_init_method="env://", backend="nccl")
                ps.initialize_model_parallel(ranks.tp, 1)
            elif not ps.model_parallel_is_initialized():
                if not torch.distributed.is_initialized():
                    ps.init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                                    distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
                                                    backend="nccl")
                ps.initialize_model_parallel(1, 1)
        from vllm.v1.worker.workspace import init_workspace_manager, is_workspace_manager_initialized

        if not is_workspace_manager_initialized():
            init_workspace_manager(torch.device("cuda"))
        self.capture_sizes = list(getattr(cfg.compilation_config, "cudagraph_capture_sizes", None)
                                  or capture_sizes())

    def drop_workspace(self) -> None:
        """Give back the process-wide workspaces a case grew: vLLM's (its modular MoE and attention
        kernels share one, grown to the largest batch seen) and torch's cuBLAS workspaces (one per
        stream cuBLAS ran on: a case's own streams, such as DeepSeek-V4's aux GEMM streams, leave one
        each). Both are kept for the process's life, as a server sizes them once; a benchmark that
        releases a case must not leave them behind for the next one."""
        import torch
        from vllm.v1.worker.workspace import init_workspace_manager, reset_workspace_manager

        reset_workspace_manager()
        init_workspace_manager(torch.device("cuda"))
        clear_blas_workspaces()

    def hold_workspace(self) -> Callable[[], None]:
        """Count one live case that may use vLLM's workspace; the returned call lets go of it and gives
        the workspace back (drop_workspace) once no live case is left. Why counted: `--placements` holds
        copies of one case together, whose captured graphs replay views of that one workspace; a copy
        that fails to build must not free it under the others."""
        self.workspace_holders += 1
        released = False

        def let_go() -> None:
            nonlocal released
            if released:
                return
            released = True
            self.workspace_holders -= 1
            if self.workspace_holders == 0:
                self.drop_workspace()

        return let_go

    @classmethod
    def get(cls) -> VllmEnv:
        """The process's state: the multi-rank one when `for_ranks` made it, else the one-rank one."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
                from operatorx.backends.process_state import on_group_change

                on_group_change(cls._leave_one_rank_world)
            return cls._instance

    @classmethod
    def for_ranks(cls, setup: RankSetup) -> VllmEnv:
        """The state of a rank of a multi-rank case, made the first time; a worker whose state is
        another split's raises (the scheduler sends a worker the cases of one split only)."""
        with cls._lock:
            have = cls._instance
            if have is None:
                cls._instance = have = cls(setup)
            if have.ranks != setup:
                raise RuntimeError(f"this worker's vLLM parallel state is "
                                   f"{have.ranks.describe() if have.ranks else 'one rank'}; the case needs "
                                   f"{setup.describe()} (vLLM builds its groups once per process)")
            return have

    @classmethod
    def _leave_one_rank_world(cls) -> None:
        """Destroy the one-rank world (vLLM's groups and torch's default group) before a rank group forms."""
        with cls._lock:
            if cls._instance is None or cls._instance.ranks is not None:
                return
            from vllm.distributed import parallel_state as ps

            ps.destroy_model_parallel()
            ps.destroy_distributed_environment()
            cls._instance = None

    def tp_all_reduce(self) -> dict[str, Optional[str]]:
        """Which of vLLM's all-reduce implementations its TP group holds (custom, pynccl, symmetric
        memory, ...): the one an engine's layers would use at this world size."""
        from vllm.distributed import parallel_state as ps

        comm = getattr(ps.get_tp_group(), "device_communicator", None)
        out: dict[str, Optional[str]] = {"communicator": type(comm).__name__ if comm is not None else None}
        for attr in ("ca_comm", "pynccl_comm", "symm_mem_comm", "fi_ar_comm"):
            held = getattr(comm, attr, None)
            out[attr] = type(held).__name__ if held is not None else None
        return out

    def unique_prefix(self, kind: str) -> str:
        """A layer name never used before in this process (FusedMoE refuses duplicates)."""
        self.layer_count += 1
        return f"operatorx.layers.{self.layer_count}.{kind}"

    @contextmanager
    def case_scope(self, forward_context: bool = False) -> Iterator[ExitStack]:
        """Config current + default dtype bf16 (+ vLLM's forward context for FusedMoE)."""
        import torch
        from vllm.config import set_current_vllm_config

        with ExitStack() as stack:
            old_dtype = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            stack.callback(torch.set_default_dtype, old_dtype)
            stack.enter_context(set_current_vllm_config(self.config))
            if forward_context:
                from vllm.forward_context import set_forward_context

                stack.enter_context(set_forward_context(None, self.config))
            yield stack

    def forget_layer(self, prefix: str) -> None:
        """Drop a released FusedMoE from the config's layer registry so its memory can go."""
        comp = self.config.compilation_config
        getattr(comp, "static_forward_context", {}).pop(prefix, None)
        layers = getattr(comp, "static_all_moe_layers", None)
        if isinstance(layers, list) and prefix in layers:
            layers.remove(prefix)


def clear_blas_workspaces() -> None:
    """Free torch's cached cuBLAS / cuBLASLt workspaces (the next cuBLAS call on a stream makes a new
    one). Only while no live case holds a captured graph: a graph replays the workspace it captured."""
    import torch

    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def warm(backend_name: str, device_kind: str) -> None:
    """vLLM's process state (its config, the distributed group, the workspace) before the first case:
    about 1 GiB of host memory and its time belong to the worker, not to the first case."""
    if device_kind == "cuda" and vllm_missing() is None:
        VllmEnv.get()
