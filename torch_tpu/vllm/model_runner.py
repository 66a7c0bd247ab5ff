"""`TpuModelRunner`: runs vLLM's scheduled steps on `tpu`.

Per step: follow the scheduler's request changes (the persistent `InputBatch` of vLLM, kept on
the host for sampling), lay out the step's tokens, slots and attention groups on the host (numpy),
padded to buckets so that a step has few distinct shapes, run vLLM's model on `tpu` as one fused
program per step shape (DeferAndFuse), read back the
logits of each request's last token and sample them with vLLM's own `Sampler` on the host.

vLLM's GPU runner is not reused: it is built on CUDA streams, events, pinned memory and Triton
kernels.
"""

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch_tpu
from vllm.forward_context import set_forward_context
from vllm.logger import init_logger
from vllm.model_executor.model_loader import get_model
from vllm.sampling_params import SamplingType
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm.v1.sample.logits_processor import build_logitsprocs
from vllm.v1.sample.sampler import Sampler
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

from .attention import TpuAttentionBackend, TpuAttentionGroup, TpuAttentionMetadata

logger = init_logger("vllm." + __name__)  # under vLLM's logger: its handler and level

HOST = torch.device("cpu")


def bucket(n: int, lo: int) -> int:
    """The bucket a size is padded to: a power of two, at least `lo`."""
    b = lo
    while b < n:
        b *= 2
    return b


@dataclass
class _Program:
    """The inputs of one step program: `num_tokens` token rows (padded), the attention layout,
    and `last`, the row of each request's last token (its logits are the program's result)."""

    ids: torch.Tensor
    pos: torch.Tensor
    md: TpuAttentionMetadata
    last: torch.Tensor
    num_tokens: int


class TpuModelRunner:
    def __init__(self, vllm_config, device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.scheduler_config = vllm_config.scheduler_config
        self.device = device
        self.block_size = self.cache_config.block_size
        self.max_model_len = self.model_config.max_model_len
        self.max_num_reqs = self.scheduler_config.max_num_seqs
        self.max_num_tokens = self.scheduler_config.max_num_batched_tokens
        self.vocab_size = self.model_config.get_vocab_size()

        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = InputBatch(
            max_num_reqs=self.max_num_reqs,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_tokens,
            device=HOST,
            vocab_size=self.vocab_size,
            block_sizes=[self.block_size],
            max_num_blocks_per_req=[-(-self.max_model_len // self.block_size)],
            logitsprocs=build_logitsprocs(vllm_config, HOST, False, False, None),
        )
        self.sampler = Sampler(logprobs_mode=self.model_config.logprobs_mode)
        self.model = None
        self.kv_caches = []  # one per attention layer (initialize_kv_cache)
        # execute_model leaves the step's logits here for sample_tokens
        self._pending = None
        self.precompiled = False  # every step shape compiled at start-up (precompile)

    # ---- model and KV cache
    def load_model(self) -> None:
        from vllm.config import set_current_vllm_config

        t0 = time.perf_counter()
        with set_current_vllm_config(self.vllm_config):
            self.model = get_model(vllm_config=self.vllm_config)
        logger.info("tpu: model loaded in %.1f s", time.perf_counter() - t0)

    def get_kv_cache_spec(self) -> dict:
        from vllm.config import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

        specs = {}
        for name, layer in get_layers_from_vllm_config(self.vllm_config, AttentionLayerBase).items():
            if getattr(layer, "kv_sharing_target_layer_name", None):
                raise NotImplementedError("tpu: cross-layer KV cache sharing is not supported yet")
            spec = layer.get_kv_cache_spec(self.vllm_config)
            if spec is not None:
                specs[name] = spec
        return specs

    def initialize_kv_cache(self, kv_cache_config) -> None:
        """One zeroed tensor per layer (zeros: a masked-out NaN would still poison softmax)."""
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise NotImplementedError("tpu: models with several KV cache groups are not supported yet")
        spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        if spec.block_size != self.block_size:
            raise NotImplementedError(f"tpu: KV block size {spec.block_size} != {self.block_size}")
        shape = TpuAttentionBackend.get_kv_cache_shape(kv_cache_config.num_blocks, spec.block_size,
                                                       spec.num_kv_heads, spec.head_size)
        ctx = self.vllm_config.compilation_config.static_forward_context
        self.kv_caches = []
        for tensor in kv_cache_config.kv_cache_tensors:
            for name in tensor.layers:
                cache = torch.zeros(shape, dtype=spec.dtype, device=self.device)
                ctx[name].bind_kv_cache(cache)  # the layer holds its cache
                self.kv_caches.append(cache)

    # ---- per step: scheduler changes
    def _update_states(self, so) -> None:
        batch = self.input_batch
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
            batch.remove_request(req_id)
        scheduled = so.num_scheduled_tokens.keys()
        resumed = so.scheduled_cached_reqs.resumed_req_ids
        for req_id in list(batch.req_id_to_index.keys() - (scheduled - resumed)):
            batch.remove_request(req_id)  # preempted, or not scheduled this step

        to_add = []
        for new in so.scheduled_new_reqs:
            if new.prompt_embeds is not None or new.mm_features:
                raise NotImplementedError("tpu: prompt embeddings and multimodal inputs are not supported yet")
            params = new.sampling_params
            gen = None
            if params is not None and params.sampling_type == SamplingType.RANDOM_SEED:
                gen = torch.Generator(device=HOST)
                gen.manual_seed(params.seed)
            state = CachedRequestState(
                req_id=new.req_id, prompt_token_ids=new.prompt_token_ids, mm_features=[],
                sampling_params=params, pooling_params=new.pooling_params, generator=gen,
                block_ids=new.block_ids, num_computed_tokens=new.num_computed_tokens,
                output_token_ids=[], lora_request=new.lora_request,
                prompt_is_token_ids=new.prompt_is_token_ids)
            self.requests[new.req_id] = state
            to_add.append(state)

        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            new_blocks = cached.new_block_ids[i]
            index = batch.req_id_to_index.get(req_id)
            if cached.num_output_tokens[i] < len(state.output_token_ids):
                del state.output_token_ids[cached.num_output_tokens[i]:]
                if index is not None:
                    batch.num_tokens_no_spec[index] = (batch.num_prompt_tokens[index]
                                                       + cached.num_output_tokens[i])
            if req_id in cached.resumed_req_ids:
                state.block_ids = new_blocks  # resumed after preemption: a new block list
            elif new_blocks is not None:
                for ids, more in zip(state.block_ids, new_blocks):
                    ids.extend(more)
            if index is None:
                to_add.append(state)
                continue
            batch.num_computed_tokens_cpu[index] = state.num_computed_tokens
            if new_blocks is not None:
                batch.block_table.append_row(new_blocks, index)

        for state in to_add:
            batch.add_request(state)
        batch.condense()
        batch.refresh_metadata()

    # ---- per step: the host-side layout
    def _upload(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device)

    def _program(self, reqs, rpad: int, qpad: int, nblk: int) -> _Program:
        """The inputs of one program: `reqs` [(token ids, positions, block table)], at most `rpad`
        of them with at most `qpad` tokens each and at most `nblk` blocks of keys. Request k's
        tokens are rows k * qpad ... of the program (padding rows: token 0 at position 0, written
        to slot 0 of vLLM's null block, which no request owns). The shape depends on
        (rpad, qpad, nblk) only."""
        bs = self.block_size
        t = rpad * qpad
        ids = np.zeros(t, dtype=np.int64)
        pos = np.zeros(t, dtype=np.int64)
        slots = np.zeros(t, dtype=np.int64)
        last = np.zeros(rpad, dtype=np.int64)
        key_slots = np.zeros((rpad, nblk * bs), dtype=np.int64)
        mask = np.zeros((rpad, qpad, nblk * bs), dtype=bool)
        mask[:, :, 0] = True  # padding rows see one key: no all-masked softmax
        keys = np.arange(nblk * bs)
        for k, (tok, p, table) in enumerate(reqs):
            q, row = len(tok), k * qpad
            ids[row:row + q], pos[row:row + q] = tok, p
            slots[row:row + q] = table[p // bs] * bs + p % bs
            last[k] = row + q - 1
            blocks = table[:nblk]
            key_slots[k, :len(blocks) * bs] = (blocks[:, None] * bs + np.arange(bs)).reshape(-1)
            mask[k, :q] = keys[None, :] <= p[:, None]
        up = self._upload
        rows = up(np.arange(t, dtype=np.int64))
        group = TpuAttentionGroup(rows.view(rpad, qpad), up(key_slots), up(mask), up(pos).view(rpad, qpad))
        md = TpuAttentionMetadata(slot_mapping=up(slots), groups=[group], output_index=rows)
        return _Program(up(ids), up(pos), md, up(last), t)

    def _shape(self, qs, seq_lens, decode: bool):
        """(rpad, qpad, nblk) of a program for requests of `qs` tokens ending at `seq_lens`."""
        nblk = bucket(-(-max(seq_lens) // self.block_size), 1)
        if decode:
            return bucket(len(qs), 8), 1, nblk
        return 1, bucket(max(qs), 16), nblk

    def _prepare(self, so) -> list[tuple[_Program, list[int]]]:
        """A step as programs, each with the batch rows whose logits it gives: one for the
        requests with one token scheduled (decodes), one per request with more (prompts and
        chunks of them). Every program's shape is among those `precompile` enumerates."""
        batch = self.input_batch
        tables, work = [], []
        for k, r in enumerate(batch.req_ids):
            q = so.num_scheduled_tokens[r]
            done = int(batch.num_computed_tokens_cpu[k])
            p = np.arange(done, done + q, dtype=np.int64)
            tok = batch.token_ids_cpu[k, done:done + q]
            table = np.asarray(self.requests[r].block_ids[0], dtype=np.int64)
            work.append((k, (tok, p, table)))
        programs = []
        decodes = [(k, w) for k, w in work if len(w[0]) == 1]
        if decodes:
            shape = self._shape([1] * len(decodes), [int(w[1][-1]) + 1 for _, w in decodes], True)
            programs.append((self._program([w for _, w in decodes], *shape), [k for k, _ in decodes]))
        for k, w in work:
            if len(w[0]) > 1:
                shape = self._shape([len(w[0])], [int(w[1][-1]) + 1], False)
                programs.append((self._program([w], *shape), [k]))
        return programs

    # ---- the step
    def _run(self, prog: _Program) -> torch.Tensor:
        """One program (DeferAndFuse): the model on its tokens, the logits of each request's last
        token; queued to run, not waited for."""
        with torch_tpu.eager_mode(torch_tpu.EagerMode.DEFER_AND_FUSE), \
                set_forward_context(prog.md, self.vllm_config, num_tokens=prog.num_tokens, slot_mapping={}):
            hidden = self.model(input_ids=prog.ids, positions=prog.pos)
            logits = self.model.compute_logits(hidden.index_select(0, prog.last)).float()
        torch_tpu._C._flush()
        return logits

    @torch.inference_mode()
    def execute_model(self, so, intermediate_tensors=None):
        self._update_states(so)
        if so.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT
        batch = self.input_batch
        compiles = self._compiles()
        programs = self._prepare(so)
        outs = [self._run(prog) for prog, _ in programs]
        logits = None
        for out, (_, rows) in zip(outs, programs):
            out = out.to(HOST)  # whole, then sliced on the host: a slice on tpu would be a program
            if logits is None:
                logits = torch.empty(batch.num_reqs, out.shape[1], dtype=torch.float32)
            logits[rows] = out[:len(rows)]
        if self.precompiled and self._compiles() != compiles:
            logger.warning("tpu: a step compiled while serving, for a shape that the start-up "
                           "compilation did not cover: programs of (requests, tokens, keys) %s",
                           [tuple(p.md.groups[0].mask.shape) for p, _ in programs])
        # a request whose prompt is not all computed after this step (a chunked prefill) samples nothing
        partial = [int(batch.num_computed_tokens_cpu[k]) + so.num_scheduled_tokens[r] < self.requests[r].num_tokens
                   for k, r in enumerate(batch.req_ids)]
        self._pending = (so, logits, partial)
        return None

    @torch.inference_mode()
    def sample_tokens(self, grammar_output):
        if self._pending is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        so, logits, partial = self._pending
        self._pending = None
        batch = self.input_batch
        if grammar_output is not None:
            from vllm.v1.structured_output.utils import apply_grammar_bitmask

            apply_grammar_bitmask(so, grammar_output, batch, logits)
        # a chunked prefill's sample is thrown away: keep its seeded generator where it was
        saved = {i: g.get_state() for i, g in batch.generators.items() if partial[i]}
        out = self.sampler(logits=logits, sampling_metadata=batch.sampling_metadata)
        for i, state in saved.items():
            batch.generators[i].set_state(state)

        sampled = out.sampled_token_ids.tolist()
        req_ids = list(batch.req_ids)
        for i, toks in enumerate(sampled):
            if partial[i]:
                sampled[i] = []
            if not sampled[i]:
                continue
            end = batch.num_tokens_no_spec[i] + len(toks)
            batch.token_ids_cpu[i, end - len(toks):end] = toks
            batch.is_token_ids[i, end - len(toks):end] = True
            batch.num_tokens_no_spec[i] = end
            self.requests[req_ids[i]].output_token_ids.extend(toks)
        logprobs = out.logprobs_tensors.tolists() if out.logprobs_tensors is not None else None
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index=dict(batch.req_id_to_index),
            sampled_token_ids=sampled,
            logprobs=logprobs,
            prompt_logprobs_dict={},
        )

    # ---- start-up compilation
    @staticmethod
    def _compiles() -> int:
        return torch_tpu._C.metrics()["compiles"]

    def step_shapes(self) -> list[tuple[int, int, int]]:
        """Every (requests, tokens per request, key blocks) a step program can have under this
        engine's limits (`_shape` of any step the scheduler can make): decodes of 8, 16, ...
        requests up to `max_num_seqs`, and one request of 16, 32, ... tokens up to
        `max_num_batched_tokens`, each with every power of two of key blocks that a sequence of
        at most `max_model_len` tokens can need."""
        bs, limit = self.block_size, self.max_model_len
        blocks, n = [], 1  # (nblk, the longest sequence it holds)
        while n == 1 or (n // 2) * bs < limit:
            blocks.append((n, min(n * bs, limit)))
            n *= 2
        shapes, r = [], 8
        while True:
            shapes += [(r, 1, n) for n, _ in blocks]
            if r >= self.max_num_reqs:
                break
            r *= 2
        q, longest = 16, min(self.max_num_tokens, limit)
        while q == 16 or q // 2 < longest:
            shortest = 2 if q == 16 else q // 2 + 1  # the fewest tokens padded to q
            shapes += [(1, q, n) for n, hi in blocks if shortest <= hi]
            q *= 2
        return shapes

    @torch.inference_mode()
    def precompile(self) -> None:
        """Compiles (or loads from the disk cache) the program of every step shape before serving
        starts, so that serving compiles nothing; each runs once on padding (its KV writes go to
        vLLM's null block)."""
        shapes = self.step_shapes()
        t0 = last_log = time.perf_counter()
        c0 = self._compiles()
        outs = []
        for i, (r, q, n) in enumerate(shapes):
            outs.append(self._run(self._program([], r, q, n)))
            now = time.perf_counter()
            if now - last_log > 5 or i + 1 == len(shapes):
                logger.info("tpu: step programs %d/%d ready (%.1f s)", i + 1, len(shapes), now - t0)
                last_log = now
        torch.tpu.synchronize()
        del outs
        self.precompiled = True
        logger.info("tpu: %d step programs in %.1f s (%d compiled, the rest from the disk cache)",
                    len(shapes), time.perf_counter() - t0, self._compiles() - c0)

    # ---- warm-up
    @torch.inference_mode()
    def dummy_run(self, num_tokens: int) -> None:
        """The model on `num_tokens` padding tokens with no attention metadata (vLLM's
        profiling convention: attention returns zeros)."""
        ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        with set_forward_context(None, self.vllm_config, num_tokens=num_tokens, slot_mapping={}):
            hidden = self.model(input_ids=ids, positions=ids)
        self.model.compute_logits(hidden[:1]).cpu()
