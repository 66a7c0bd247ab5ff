"""`TpuPlatform`: what vLLM asks of a device, answered for `tpu` (any PJRT plugin).

vLLM's own model code runs unchanged on `tpu` tensors: every CustomOp takes its `forward_oot`
(= `forward_native`, plain torch) path, and only attention (torch_tpu.vllm.attention), the worker
and the model runner are ours. vLLM's CUDA kernels (`vllm._C`), Triton kernels and CUDA graphs are
never used.
"""

import os

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

logger = init_logger("vllm." + __name__)  # under vLLM's logger: its handler and level

# On a plugin that reports no memory limit (the XLA CPU plugin: device memory is host memory),
# the KV cache gets at most this much unless `kv_cache_memory_bytes` says otherwise; vLLM's own
# CPU backend has the same default (VLLM_CPU_KVCACHE_SPACE).
DEFAULT_HOST_KV_CACHE_BYTES = 4 << 30


class TpuPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "tpu"
    device_type: str = "tpu"
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = ""
    device_control_env_var: str = "TORCH_TPU_VISIBLE_DEVICES"
    # vLLM's small helpers decorated with torch.compile (logprob counting, ...) run eagerly.
    simple_compile_backend: str = "eager"
    # One device per engine today; the c10d backend `tpu_dist` serves tensor parallelism later.
    dist_backend: str = "gloo"
    supported_quantization: list[str] = []

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def import_kernels(cls) -> None:
        # vLLM's compiled kernels (vllm._C) are CUDA/CPU builds; `tpu` runs vLLM's torch paths.
        return

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        cfg = attn_selector_config
        if cfg.use_mla or cfg.use_sparse:
            raise NotImplementedError("tpu: MLA and sparse attention are not supported yet")
        if cfg.attn_type not in ("decoder", "encoder_only"):
            raise NotImplementedError(f"tpu: attention type {cfg.attn_type!r} is not supported yet")
        if selected_backend is not None and selected_backend.name != "CUSTOM":
            logger.info("tpu: attention backend %s is not available, using TPU_TORCH",
                        selected_backend.name)
        return "torch_tpu.vllm.attention.TpuAttentionBackend"

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.tpu.get_device_name(device_id)

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        return f"tpu:{device_id}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.tpu.mem_get_info(device_id)[1]

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        return float(torch.tpu.memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.tpu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.tpu.manual_seed_all(seed)

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"tpu: model dtype {dtype} is not supported")

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def inference_mode(cls):
        return torch.inference_mode(mode=True)

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"

    def is_sleep_mode_available(self) -> bool:
        # TpuWorker.sleep / wake_up free and retake device memory by resizing storages
        return True

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        from vllm.config import CompilationMode, CUDAGraphMode

        parallel = vllm_config.parallel_config
        if parallel.world_size > 1:
            raise NotImplementedError(
                "tpu: tensor/pipeline parallelism is not supported yet (world_size "
                f"{parallel.world_size}); run one engine per device")
        if parallel.worker_cls == "auto":
            parallel.worker_cls = "torch_tpu.vllm.worker.TpuWorker"
        if vllm_config.speculative_config is not None:
            raise NotImplementedError("tpu: speculative decoding is not supported yet")
        if vllm_config.lora_config is not None:
            raise NotImplementedError("tpu: LoRA is not supported yet")

        cache = vllm_config.cache_config
        if not cache.user_specified_block_size:
            cache.block_size = 16
        if cache.cache_dtype not in ("auto", None):
            raise NotImplementedError(f"tpu: kv_cache_dtype {cache.cache_dtype!r} is not supported yet")

        # The runner samples on the host after each step; async scheduling (placeholder tokens
        # resolved on the device) is a CUDA-runner feature.
        vllm_config.scheduler_config.async_scheduling = False

        comp = vllm_config.compilation_config
        comp.cudagraph_mode = CUDAGraphMode.NONE
        comp.cudagraph_capture_sizes = []
        comp.max_cudagraph_capture_size = 0
        # Every CustomOp on its torch path (forward_oot -> forward_native), never wrapped in
        # per-op torch.compile calls.
        comp.custom_ops = ["all"]
        # vLLM's graph capture (Inductor, piecewise CUDA graphs) does not apply; the runner runs
        # the model eagerly on `tpu` (bucketed shapes, DeferAndFuse where enabled).
        if comp.mode != CompilationMode.NONE:
            comp.mode = CompilationMode.NONE

        # vLLM forks its engine process unless CUDA is initialised; torch_tpu creates its PJRT
        # client when torch is imported, and a forked child cannot use the parent's client (its
        # threads are gone). So spawn, as vLLM does for an initialised CUDA: a script then needs
        # the `if __name__ == "__main__":` guard vLLM's documentation asks for.
        if torch.tpu.is_initialized():
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
