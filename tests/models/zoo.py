"""Tiny random-weight HuggingFace models, built offline from their configs.

Every transformers `model_type` that has a base model class is an architecture here.
`tiny_config(model_type)` takes the config class's defaults and shrinks every size it
knows by name (widths, depths, heads, experts, vocabularies, images, audio), in the
config's own nested sub-configs too, then builds the config again from the shrunk
dict so derived fields (head sizes, layer-type lists) follow. `build(model_type)`
makes the model with a fixed seed; `make_inputs(model)` gives inputs its forward
accepts, from the signature and the config. Nothing is downloaded.
"""
import inspect
import math

import torch
import transformers
from transformers.models.auto import modeling_auto
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

SEQ = 8
BATCH = 2

# key -> value for an int field of that name (only when the default is larger)
_SMALL = {}
for _k in ("hidden_size", "d_model", "n_embd", "embed_dim", "hidden_dim", "model_dim", "d_embed", "dim",
           "word_embed_proj_dim", "text_embed_dim", "vision_embed_dim", "audio_embed_dim", "embedding_dim",
           "encoder_hidden_size", "decoder_hidden_size", "d_inner_hidden", "projection_size",
           "mm_hidden_size", "output_hidden_size", "qformer_hidden_size", "vision_hidden_size",
           "text_hidden_size", "latent_dim", "hidden_channels", "d_latent"):
    _SMALL[_k] = 32
for _k in ("embedding_size", "projection_dim", "proj_dim", "hidden_size_per_head", "kv_lora_rank",
           "q_lora_rank", "bottleneck_size", "rank"):
    _SMALL[_k] = 16
for _k in ("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "decoder_attention_heads",
           "num_heads", "attention_heads", "num_attention_heads_per_layer", "encoder_num_attention_heads",
           "decoder_num_attention_heads", "n_attn_heads"):
    _SMALL[_k] = 4
for _k in ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv",
           "num_key_value_groups"):
    _SMALL[_k] = 2
for _k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
           "num_encoder_layers", "num_decoder_layers", "encoder_num_layers", "decoder_num_layers",
           "num_blocks", "num_hidden_groups_layers", "depth", "n_layers_per_block"):
    _SMALL[_k] = 2
for _k in ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
           "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size", "d_inner",
           "intermediate_size_mlp", "mlp_dim", "feedforward_dim", "dim_feedforward", "encoder_ffn_embed_dim",
           "decoder_ffn_embed_dim", "ff_dim", "inner_dim", "expert_intermediate_size"):
    _SMALL[_k] = 64
for _k in ("head_dim", "d_kv", "kv_channels", "attention_head_dim", "qk_rope_head_dim", "v_head_dim",
           "qk_nope_head_dim", "key_dim", "value_dim", "d_head", "rotary_dim", "rotary_emb_base_dim"):
    _SMALL[_k] = 8
for _k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_total"):
    _SMALL[_k] = 4
for _k in ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "moe_k"):
    _SMALL[_k] = 2
for _k in ("vocab_size", "text_vocab_size", "target_vocab_size", "src_vocab_size", "tgt_vocab_size"):
    _SMALL[_k] = 128
_SMALL.update(image_size=32, max_source_positions=64, max_target_positions=64,
              num_codebooks=2, codebook_size=32, num_labels=3, num_channels=3, window_size=4,
              max_position_embeddings=128, n_positions=128, n_ctx=128, max_length=32, seq_length=32,
              num_patches=16, spatial_merge_size=2, temporal_patch_size=1, num_queries=8,
              conv_dim_size=16, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
              vocab_size_per_codebook=32, audio_vocab_size=32, max_window_layers=2, first_k_dense_replace=1,
              num_frames=4)
# lists of per-stage sizes: shrink each entry
_LIST_SMALL = {"hidden_sizes": 32, "embed_dims": 32, "dims": 32, "embedding_sizes": 32, "depths": 1,
               "num_heads": 2, "conv_dim": 32, "encoder_hidden_sizes": 32, "neck_hidden_sizes": 32,
               "num_attention_heads": 2, "block_sizes": 1, "encoder_depths": 1,
               "decoder_depths": 1, "hidden_dims": 32, "widths": 32, "channels": 32}
# fields that name layers or stages of the full-size model: dropped (the config's default follows the new depth)
_DROP = ("out_features", "out_indices", "vision_feature_layer", "kv_source_layers", "num_attention_heads_per_layer",
         "backbone_out_indices")


def _shrink(d):
    """Shrinks the sizes of a config dict (nested sub-config dicts too), in place."""
    for k, v in list(d.items()):
        if isinstance(v, dict):
            _shrink(v)
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int) and k in _SMALL and v > _SMALL[k]:
            d[k] = _SMALL[k]
        elif isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v) \
                and _LIST_SMALL.get(k) is not None:
            d[k] = [min(x, _LIST_SMALL[k]) for x in v]
    vocab = d.get("vocab_size")
    if isinstance(vocab, int):
        # special tokens must stay inside the (shrunk) vocabulary, each distinct
        used = set()
        for k in sorted(d):
            v = d[k]
            if k.endswith("_token_id") or k.endswith("_token_index") or k.endswith("_id") and "token" in k:
                if isinstance(v, int) and not isinstance(v, bool) and v >= vocab:
                    nid = vocab - 1
                    while nid in used:
                        nid -= 1
                    d[k] = nid
                if isinstance(d[k], int):
                    used.add(d[k])
    _layers(d)
    for k in _DROP:
        if k in d and isinstance(d[k], (list, tuple)):
            d.pop(k)
    _rope(d)
    return d


_LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
_TYPE_LISTS = ("layer_types", "block_types", "attention_layers", "mlp_layer_types", "layers_block_type",
               "hybrid_override_pattern")


def _layers(d):
    """Per-layer lists and dicts follow the shrunk layer count. A hybrid model keeps one
    layer of each kind its type list names (2 linear-attention layers alone would not be
    that model), so its depth becomes the number of kinds."""
    key = next((k for k in _LAYER_KEYS if isinstance(d.get(k), int)), None)
    if key is None:
        return
    n = d[key]
    for lk in _TYPE_LISTS:
        v = d.get(lk)
        if isinstance(v, (list, str)) and len(v) > n:
            kinds = []
            for t in v:
                if t not in kinds:
                    kinds.append(t)
            keep = kinds if len(kinds) > n else (kinds + [v[0]] * n)[:max(n, len(kinds))]
            d[lk] = "".join(keep) if isinstance(v, str) else keep
            n = len(keep)
            d[key] = n
    for k, v in list(d.items()):
        if isinstance(v, dict) and v and all(isinstance(i, str) and i.isdigit() for i in v):  # per-layer overrides
            d[k] = {i: c for i, c in v.items() if int(i) < n}
        elif isinstance(v, dict) and v and all(isinstance(i, int) for i in v):
            d[k] = {i: c for i, c in v.items() if i < n}
        elif k in ("intermediate_size", "layer_intermediate_sizes") and isinstance(v, list) and len(v) > n:
            d[k] = [min(x, 64) for x in v[:n]]


def _rope(d):
    """RoPE section splits (multimodal RoPE) sum to half the shrunk head size."""
    rp = d.get("rope_parameters") or d.get("rope_scaling")
    heads = d.get("num_attention_heads")
    width = d.get("hidden_size")
    hd = d.get("head_dim") or (width // heads if isinstance(width, int) and isinstance(heads, int) and heads else None)
    if isinstance(rp, dict) and isinstance(rp.get("mrope_section"), list) and hd:
        sec = rp["mrope_section"]
        half = hd // 2
        new = [max(1, half * x // sum(sec)) for x in sec]
        new[0] += half - sum(new)
        rp["mrope_section"] = new


def architectures():
    """Every model_type with a base model class, sorted."""
    return sorted(modeling_auto.MODEL_MAPPING_NAMES)


def tiny_config(model_type):
    cls = CONFIG_MAPPING[model_type]
    d = _shrink(cls().to_dict())
    for k in ("transformers_version", "model_type", "architectures", "_name_or_path"):
        d.pop(k, None)
    # heads must divide the width
    cfg = cls.from_dict(d)
    return cfg


# task mappings tried in order: the first that has this model_type gives the class tested
_TASKS = [
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("base", "MODEL_MAPPING_NAMES"),
]


def model_class(model_type, task=None):
    order = _TASKS
    if getattr(CONFIG_MAPPING[model_type], "is_encoder_decoder", False) is True or \
            model_type in modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES:
        order = [_TASKS[1], _TASKS[0], _TASKS[2]]  # the seq2seq head is the model; its decoder-only LM a part
    for name, mapping in order:
        if task is not None and name != task:
            continue
        names = getattr(modeling_auto, mapping)
        if model_type in names:
            cls_name = names[model_type]
            if isinstance(cls_name, (list, tuple)):
                cls_name = cls_name[0]
            cls = getattr(transformers, cls_name, None)
            if cls is not None:
                return name, cls
    raise LookupError(f"no model class for {model_type}")


def build(model_type, task=None, seed=0):
    task, cls = model_class(model_type, task)
    cfg = tiny_config(model_type)
    # sampling noise inside forward (VITS's durations and waveform) draws from each device's
    # own generator, so CPU and tpu would sample differently: sample nothing
    for k in ("noise_scale", "noise_scale_duration"):
        if hasattr(cfg, k):
            setattr(cfg, k, 0.0)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    # Parameters the init leaves constant (zero router gates, unit norm weights) get a
    # little noise: with equal router scores, which experts top-k picks is unspecified
    # on every device (CPU and tpu break such ties differently), and trained
    # checkpoints have no such ties.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and p.is_floating_point() and bool((p == p.reshape(-1)[0]).all()):
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * 0.02)
    return task, model


def _sub(cfg, *names):
    for n in names:
        c = getattr(cfg, n, None)
        if c is not None:
            return c
    return cfg


def _get(cfg, names, default):
    for c in (cfg, _sub(cfg, "vision_config", "encoder", "backbone_config"), _sub(cfg, "text_config"),
              _sub(cfg, "audio_config")):
        for n in names:
            v = getattr(c, n, None)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
            if isinstance(v, (list, tuple)) and v and isinstance(v[0], int):
                return v[0]
    return default


def _dual_encoder(cfg):
    """A text tower and a vision tower side by side (CLIP-like): both inputs, no image tokens."""
    has = lambda n: getattr(cfg, n, None) is not None
    tokens = ("image_token_id", "image_token_index", "image_token", "boi_token_id", "vision_start_token_id")
    return has("text_config") and has("vision_config") and not any(has(t) for t in tokens)


def make_inputs(model, seed=1):
    """Inputs for model.forward, from its signature and config (CPU tensors)."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    params = inspect.signature(model.forward).parameters
    vocab = _get(_sub(cfg, "text_config"), ("vocab_size",), 128)
    main = getattr(model, "main_input_name", "input_ids")
    out = {}
    hi = max(2, min(vocab, 128) - 8)
    if "input_ids" in params and (main == "input_ids" or "pixel_values" not in params):
        out["input_ids"] = torch.randint(3, hi, (BATCH, SEQ), generator=g)
        if "attention_mask" in params:
            out["attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
    if main == "pixel_values" or ("pixel_values" in params and ("input_ids" not in out or _dual_encoder(cfg))):
        size = _get(cfg, ("image_size",), 32)
        ch = _get(cfg, ("num_channels",), 3)
        frames = _get(cfg, ("num_frames",), None)
        shape = (BATCH, ch, size, size) if frames is None else (BATCH, frames, ch, size, size)
        out["pixel_values"] = torch.randn(*shape, generator=g)
    if main == "input_values":
        out["input_values"] = torch.randn(BATCH, 1600, generator=g)
    if main == "input_features":
        bins = _get(cfg, ("num_mel_bins", "feature_size", "input_feat_per_channel"), 16)
        frames = 2 * _get(cfg, ("max_source_positions",), 32)
        out["input_features"] = torch.randn(BATCH, bins, frames, generator=g)
    if main == "past_values":
        ctx = getattr(cfg, "context_length", 16) + max(getattr(cfg, "lags_sequence", [0]) or [0])
        out["past_values"] = torch.randn(BATCH, ctx, generator=g)
    if "noise" in params and "pixel_values" in out:  # random patch masking (ViT-MAE): the same noise on both
        n = (_get(cfg, ("image_size",), 32) // _get(cfg, ("patch_size",), 4)) ** 2
        out["noise"] = torch.rand(BATCH, n, generator=g)
    if getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        out["decoder_input_ids"] = torch.randint(3, hi, (BATCH, SEQ // 2), generator=g)
    if not out:
        raise LookupError(f"no input recipe for main input {main!r}")
    return out


def to(x, device):
    """Moves tensors in nested outputs/inputs to device."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, dict):
        return {k: to(v, device) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to(v, device) for v in x)
    return x


def tensors(out, prefix="out"):
    """(name, tensor) pairs of every floating tensor in a model output, in order."""
    if isinstance(out, torch.Tensor):
        if out.is_floating_point() or out.is_complex():
            yield prefix, out
        return
    if hasattr(out, "to_tuple") and not isinstance(out, (list, tuple, dict)):
        out = dict(out.items()) if hasattr(out, "items") else out.to_tuple()
    if isinstance(out, dict):
        for k, v in out.items():
            if k in ("past_key_values",):
                continue
            yield from tensors(v, f"{prefix}.{k}")
    elif isinstance(out, (list, tuple)):
        for i, v in enumerate(out):
            yield from tensors(v, f"{prefix}[{i}]")
