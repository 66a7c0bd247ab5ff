"""Paged attention for vLLM on `tpu`, in torch (no vLLM CUDA or Triton kernel).

The KV cache of a layer is one tensor `[num_blocks, block_size, 2, num_kv_heads, head_size]`
(each slot holds its key and its value side by side). A step's tokens are written to their slots
(`slot = block * block_size + offset`, computed by the model runner) with one `index_copy_` on the
whole cache seen as `[slots, 2, Hkv, D]` (an in-place update of the full tensor updates its buffer
in place; one on a slice such as `cache[0]` would copy the slice), then each request attends over
the keys its block table names.

The runner groups a step's requests into decodes (one query token) and prefills (several,
chunked prefills and prompts with a cached prefix included) and pads each group to a bucket,
so a step has few distinct shapes: per group, queries `[R, Q]` and keys `[R, L]` gathered from
the cache, one masked attention, and the rows gathered back into token order. Padding rows and
keys never reach a real token (the mask, and slot 0 of block 0: vLLM's null block, which no
request owns).
"""

from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
)


@dataclass
class TpuAttentionGroup:
    """Requests of one kind (decode or prefill), padded to `R` requests, `Q` queries, `L` keys."""

    token_index: torch.Tensor  # [R, Q] int64: the step's token each query row reads
    key_slots: torch.Tensor  # [R, L] int64: cache slots of the request's keys, in order
    mask: torch.Tensor  # [R, Q, L] bool: query row i of request r may see key j (causal)
    query_pos: torch.Tensor  # [R, Q] int64: each query row's position in its sequence


@dataclass
class TpuAttentionMetadata:
    slot_mapping: torch.Tensor  # [T_padded] int64: where each token's key and value go
    groups: list[TpuAttentionGroup]
    # [T_padded] int64: for each token, its row in the groups' outputs concatenated in order
    output_index: torch.Tensor


class TpuAttentionMetadataBuilder(AttentionMetadataBuilder[TpuAttentionMetadata]):
    """The model runner builds TpuAttentionMetadata itself (it needs the padded buckets);
    vLLM's common metadata path is not used."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        raise NotImplementedError("tpu: attention metadata comes from TpuModelRunner")


class TpuAttentionBackend(AttentionBackend):
    supported_dtypes = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes = ["auto"]
    forward_includes_kv_cache_update = True

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return TpuAttentionImpl

    @staticmethod
    def get_builder_cls():
        return TpuAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, block_size, 2, num_kv_heads, head_size)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True


class TpuAttentionImpl(AttentionImpl[TpuAttentionMetadata]):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None,
                 sliding_window=None, kv_cache_dtype="auto", logits_soft_cap=None,
                 attn_type=AttentionType.DECODER, kv_sharing_target_layer_name=None, **kwargs):
        if alibi_slopes is not None:
            raise NotImplementedError("tpu: ALiBi attention is not supported yet")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"tpu: attention type {attn_type!r} is not supported yet")
        if kv_cache_dtype != "auto":
            raise NotImplementedError(f"tpu: kv_cache_dtype {kv_cache_dtype!r} is not supported")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.logits_soft_cap = logits_soft_cap or None
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("tpu: fused output quantization is not supported")
        if attn_metadata is None:  # vLLM's profiling and dummy runs
            return output.zero_()
        md: TpuAttentionMetadata = attn_metadata
        hkv, d = self.num_kv_heads, self.head_size
        flat = kv_cache.view(-1, 2, hkv, d)  # [num_blocks * block_size, 2, Hkv, D]
        if self.kv_sharing_target_layer_name is None:
            n = md.slot_mapping.shape[0]
            flat.index_copy_(0, md.slot_mapping, torch.stack([key[:n], value[:n]], 1).to(flat.dtype))
        rows = [self._attend(query, flat, g) for g in md.groups]
        out = rows[0] if len(rows) == 1 else torch.cat(rows)
        n_out = md.output_index.shape[0]
        output[:n_out].copy_(out.index_select(0, md.output_index).to(output.dtype))
        return output

    def _attend(self, query, flat, g: TpuAttentionGroup):
        r, q = g.token_index.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_size
        grp = h // hkv  # query heads per kv head (grouped-query attention)
        # queries [R, Hkv, grp * Q, D]: each kv head's query heads side by side, so the keys are
        # read once per kv head (never repeated per query head)
        qs = query.index_select(0, g.token_index.reshape(-1)).view(r, q, hkv, grp, d)
        qs = qs.permute(0, 2, 3, 1, 4).reshape(r, hkv, grp * q, d)
        kv = flat.index_select(0, g.key_slots.reshape(-1))  # [R * L, 2, Hkv, D]
        length = g.key_slots.shape[1]
        kv = kv.view(r, length, 2, hkv, d).to(qs.dtype)
        ks = kv[:, :, 0].transpose(1, 2)  # [R, Hkv, L, D]
        vs = kv[:, :, 1].transpose(1, 2)
        mask = g.mask
        if self.sliding_window is not None:  # keys within the last `sliding_window` positions
            key_pos = torch.arange(length, device=mask.device)
            mask = mask & (key_pos > g.query_pos.unsqueeze(-1) - self.sliding_window)
        # [R, 1, grp * Q, L]: query row (j, i) is query i of query head j of the group
        mask = mask.unsqueeze(1).expand(r, grp, q, length).reshape(r, 1, grp * q, length)
        # matmul + softmax: on the XLA CPU plugin this is ~5x faster than tpu's SDPA lowering at
        # decode shapes (few query rows, many keys)
        s = torch.matmul(qs, ks.transpose(-1, -2)).float() * self.scale
        if self.logits_soft_cap is not None:
            s = torch.tanh(s / self.logits_soft_cap) * self.logits_soft_cap
        s = s.masked_fill(~mask, float("-inf"))
        o = torch.matmul(torch.softmax(s, dim=-1).to(vs.dtype), vs)
        # [R, Hkv, grp, Q, D] -> [R, Q, H, D] -> rows in (request, query) order
        o = o.view(r, hkv, grp, q, d).permute(0, 3, 1, 2, 4)
        return o.reshape(r * q, h, d)
