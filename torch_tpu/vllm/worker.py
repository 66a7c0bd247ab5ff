"""`TpuWorker`: one vLLM worker process on one `tpu` device (the engine core's executor calls
these methods by name)."""

import time

import torch
import torch_tpu
from vllm import envs
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
from vllm.logger import init_logger
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from . import ops  # noqa: F401  (registers the layers vLLM leaves to the platform)
from .model_runner import TpuModelRunner
from .platform import DEFAULT_HOST_KV_CACHE_BYTES

logger = init_logger(__name__)

_TPU_PRECISION = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}


class TpuWorker(WorkerBase):
    def init_device(self) -> None:
        self.device = torch.device("tpu", self.local_rank if self.local_rank >= 0 else 0)
        torch.tpu.set_device(self.device)
        # float32 matmuls as vLLM's GPU worker sets them (VLLM_FLOAT32_MATMUL_PRECISION, default
        # "highest"); tpu's own default is bf16 operands (DEFAULT), as on a TPU.
        precision = envs.VLLM_FLOAT32_MATMUL_PRECISION
        torch.set_float32_matmul_precision(precision)
        torch.tpu.set_matmul_precision(torch.tpu.Precision[_TPU_PRECISION[precision]])
        init_distributed_environment(
            self.parallel_config.world_size, self.rank, self.distributed_init_method,
            self.local_rank, self.current_platform.dist_backend)
        ensure_model_parallel_initialized(self.parallel_config.tensor_parallel_size,
                                          self.parallel_config.pipeline_parallel_size)
        set_random_seed(self.model_config.seed)
        # The runner pads every step to its own buckets; the engine's size policy (bounded
        # dynamism: programs at a bound with the size as a parameter, slower per run) would only
        # add a second padding. This process runs nothing but the engine.
        torch_tpu._C._set_dynamism(False)
        self.model_runner = TpuModelRunner(self.vllm_config, self.device)

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        if load_dummy_weights:
            raise NotImplementedError("tpu: dummy weights (elastic scale-up) are not supported")
        self.model_runner.load_model()

    def get_model(self):
        return self.model_runner.model

    def get_kv_cache_spec(self):
        return self.model_runner.get_kv_cache_spec()

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: `kv_cache_memory_bytes` when given; else
        `gpu_memory_utilization` of the device's memory less what the model holds. A plugin whose
        device memory is host memory (the XLA CPU plugin) gets at most 4 GiB by default."""
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            return int(explicit)
        free, total = torch.tpu.mem_get_info(self.device)
        budget = int(total * self.cache_config.gpu_memory_utilization) - torch.tpu.memory_allocated(self.device)
        budget = min(budget, free)
        if torch.tpu.get_device_properties(self.device).name.lower().startswith("cpu"):
            budget = min(budget, DEFAULT_HOST_KV_CACHE_BYTES)
        if budget <= 0:
            raise ValueError(
                f"tpu: no memory left for the KV cache ({free} of {total} bytes free); lower the "
                "model size or set kv_cache_memory_bytes")
        return budget

    def initialize_from_config(self, kv_cache_config) -> None:
        self.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        self.model_runner.initialize_kv_cache(kv_cache_config)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        t0 = time.perf_counter()
        set_random_seed(self.model_config.seed)
        return CompilationTimes(language_model=time.perf_counter() - t0, encoder=0.0)

    def execute_model(self, scheduler_output):
        return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output):
        return self.model_runner.sample_tokens(grammar_output)

    def execute_dummy_batch(self) -> None:
        self.model_runner.dummy_run(1)

    def take_draft_token_ids(self):
        return None

    def get_supported_tasks(self):
        return ("generate",)

    def update_max_model_len(self, max_model_len: int) -> None:
        self.model_config.max_model_len = max_model_len

    def profile(self, is_start: bool = True, profile_prefix=None, **kwargs) -> None:
        raise NotImplementedError("tpu: vLLM's profiler is not supported yet (use torch.profiler)")

    def sleep(self, level: int = 1) -> None:
        raise NotImplementedError("tpu: sleep mode is not supported yet")

    def wake_up(self, tags=None) -> None:
        raise NotImplementedError("tpu: sleep mode is not supported yet")

    def check_health(self) -> None:
        return

    def shutdown(self) -> None:
        self.model_runner = None
