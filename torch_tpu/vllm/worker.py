"""`TpuWorker`: one vLLM worker process on one `tpu` device (the engine core's executor calls
these methods by name)."""

import contextlib
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

logger = init_logger("vllm." + __name__)  # under vLLM's logger: its handler and level

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
        self.model_runner = TpuModelRunner(self.vllm_config, self.device)
        self._asleep = {}  # tag -> [(storage, nbytes)] shrunk by sleep
        self._host_weights = {}  # level-1 sleep: parameter name -> host copy

    @contextlib.contextmanager
    def _padded_steps(self):
        """The runner pads every step to its own buckets; the engine's size policy (bounded
        dynamism: programs at a bound with the size as a parameter, slower per run) would only
        add a second padding. Off while the engine works, as it was for the rest of the process
        (a trainer in the same process keeps its own setting)."""
        was = torch_tpu._C._get_dynamism()
        torch_tpu._C._set_dynamism(False)
        try:
            yield
        finally:
            torch_tpu._C._set_dynamism(was)

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        if load_dummy_weights:
            raise NotImplementedError("tpu: dummy weights (elastic scale-up) are not supported")
        with self._padded_steps():
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
        with self._padded_steps():
            self.model_runner.initialize_kv_cache(kv_cache_config)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        t0 = time.perf_counter()
        if not self.model_config.enforce_eager:
            with self._padded_steps():
                self.model_runner.precompile()
        set_random_seed(self.model_config.seed)
        return CompilationTimes(language_model=time.perf_counter() - t0, encoder=0.0)

    def execute_model(self, scheduler_output):
        with self._padded_steps():
            return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output):
        with self._padded_steps():
            return self.model_runner.sample_tokens(grammar_output)

    def execute_dummy_batch(self) -> None:
        with self._padded_steps():
            self.model_runner.dummy_run(1)

    def take_draft_token_ids(self):
        return None

    def get_supported_tasks(self):
        return ("generate",)

    def update_max_model_len(self, max_model_len: int) -> None:
        self.model_config.max_model_len = max_model_len

    def profile(self, is_start: bool = True, profile_prefix=None, **kwargs) -> None:
        raise NotImplementedError("tpu: vLLM's profiler is not supported yet (use torch.profiler)")

    # ---- sleep mode (LLM.sleep / LLM.wake_up, LLM(enable_sleep_mode=True)). Device memory is
    # given back by shrinking a storage to 0 bytes and taken again by growing it to its size (its
    # contents then read as zeros), as FSDP2 frees parameters: the tensors stay the same objects,
    # so the layers, the runner and the programs built for them need nothing new after a wake-up.
    def _storages(self, tag):
        if tag == "weights":
            tensors = [p for p in self.model_runner.model.parameters()]
        else:
            tensors = self.model_runner.kv_caches
        seen, out = set(), []
        for t in tensors:
            st = t.untyped_storage()
            if st._cdata not in seen and t.device.type == "tpu":
                seen.add(st._cdata)
                out.append((st, st.nbytes()))
        return out

    def sleep(self, level: int = 1) -> None:
        """Level 1: the weights go to host memory and the KV cache is discarded; level 2: both are
        discarded (the weights are loaded again, e.g. by `LLM.collective_rpc("reload_weights")` or
        `LLM.apply_model(lambda m: m.load_weights(...))` from a trainer). Buffers (rotary tables)
        stay on the device."""
        if level not in (1, 2):
            raise ValueError(f"tpu: sleep level {level} (the worker takes 1 or 2)")
        torch.tpu.synchronize(self.device)
        before = torch.tpu.memory_reserved(self.device)
        if level == 1 and "weights" not in self._asleep:
            self._host_weights = {n: p.detach().to("cpu") for n, p in self.model_runner.model.named_parameters()}
        self._shrink(("weights", "kv_cache"))
        after = torch.tpu.memory_reserved(self.device)
        logger.info("tpu sleep (level %d) freed %.3f GiB; %.3f GiB still in use", level,
                    (before - after) / 2**30, after / 2**30)

    def discard(self, tags) -> None:
        """Frees the memory of `tags` without keeping their contents (wake_up takes it again)."""
        torch.tpu.synchronize(self.device)
        self._shrink(tags)

    def _shrink(self, tags):
        for tag in tags:  # a tag already given back keeps the sizes it had
            if tag in ("weights", "kv_cache") and tag not in self._asleep:
                self._asleep[tag] = self._storages(tag)
                for st, _ in self._asleep[tag]:
                    st.resize_(0)
        torch.tpu.synchronize(self.device)

    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format: bool = True) -> None:
        """`LLM.collective_rpc("reload_weights")`: the checkpoint (or `weights_iterator`) loaded
        again into the model's parameters in place (after a level-2 sleep, or new weights)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        with set_current_vllm_config(self.vllm_config), self._padded_steps():
            reload_weights(self.vllm_config, self.model_runner.model, weights_iterator=weights_iterator,
                           weights_path=weights_path, is_checkpoint_format=is_checkpoint_format)

    def reset_encoder_cache(self) -> None:
        return  # no encoder cache (text models only)

    def wake_up(self, tags=None) -> None:
        tags = list(self._asleep) if tags is None else tags
        for tag in tags:
            for st, nbytes in self._asleep.pop(tag, ()):
                st.resize_(nbytes)
            if tag == "weights" and self._host_weights:
                with torch.no_grad():
                    for n, p in self.model_runner.model.named_parameters():
                        p.copy_(self._host_weights[n])
                self._host_weights = {}
        torch.tpu.synchronize(self.device)

    def check_health(self) -> None:
        return

    def shutdown(self) -> None:
        self.model_runner = None
