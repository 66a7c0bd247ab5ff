"""vLLM layers that an out-of-tree platform must supply itself, in torch, registered with vLLM's
`register_oot` (imported by the worker, before the model is built).

- `UnquantizedFusedMoEMethod`: vLLM leaves unquantized mixture-of-experts to out-of-tree
  platforms ("OOT handles internally"). Ours runs every expert on every token and weights the
  results by the router's top-k weights (zero for experts not chosen): shapes never depend on the
  routing, so one program serves every step; the cost is num_experts / top_k times the routed
  FLOPs, fine for small expert counts and a known cost for large ones.
"""

import torch
import torch.nn.functional as F
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

_GATED = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


@UnquantizedFusedMoEMethod.register_oot(name="UnquantizedFusedMoEMethod")
class TpuUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    @property
    def is_monolithic(self) -> bool:
        return False

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
        if shared_experts is not None:
            raise NotImplementedError("tpu: MoE shared experts inside the fused kernel are not supported yet")
        if layer.expert_map is not None:
            raise NotImplementedError("tpu: expert parallelism is not supported yet")
        act = getattr(layer.activation, "value", layer.activation)
        if act not in _GATED:
            raise NotImplementedError(f"tpu: MoE activation {act!r} is not supported yet")
        w13, w2 = layer.w13_weight, layer.w2_weight  # [E, 2I, H], [E, H, I]
        num_experts = w13.shape[0]
        # [T, E]: each token's weight for each expert (zero where not routed)
        route = torch.zeros(x.shape[0], num_experts, dtype=torch.float32, device=x.device)
        route = route.scatter_add(1, topk_ids.long(), topk_weights.float())
        if layer.apply_router_weight_on_input:
            xs = x.unsqueeze(0) * route.t().unsqueeze(-1).to(x.dtype)  # [E, T, H]
            route = (route > 0).to(route.dtype)
        else:
            xs = x.unsqueeze(0).expand(num_experts, -1, -1)
        h = torch.bmm(xs, w13.transpose(1, 2))  # [E, T, 2I]
        d = h.shape[-1] // 2
        h = _GATED[act](h[..., :d]) * h[..., d:]
        y = torch.bmm(h, w2.transpose(1, 2))  # [E, T, H]
        return torch.einsum("te,eth->th", route.to(y.dtype), y)

    forward_oot = apply  # vLLM calls either


# vLLM's top-k router calls `torch.ops._moe_C.topk_softmax`, an op of its CUDA build. Without that
# build the op does not exist; we define it (torch.library: a new op in that namespace, nothing of
# vLLM is replaced) with a torch implementation for tpu.
_moe_lib = None


def _topk_softmax(topk_weights, topk_ids, token_expert_indices, gating_output, renormalize,
                  bias=None, is_padding=None):
    probs = torch.softmax(gating_output.float(), dim=-1)
    k = topk_weights.shape[1]
    if bias is not None:  # the bias picks the experts; the weights stay the softmax's
        ids = torch.topk(probs + bias.float(), k, dim=-1).indices
        weights = probs.gather(1, ids)
    else:
        weights, ids = torch.topk(probs, k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if is_padding is not None:
        weights = weights.masked_fill(is_padding.view(-1, 1).bool(), 0.0)
    topk_weights.copy_(weights)
    topk_ids.copy_(ids)
    rows = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
    token_expert_indices.copy_(torch.arange(k, device=ids.device) * ids.shape[0] + rows)


def _define_moe_ops():
    global _moe_lib
    if hasattr(torch.ops, "_moe_C") and hasattr(torch.ops._moe_C, "topk_softmax"):
        return  # vLLM's own build provides it
    _moe_lib = torch.library.Library("_moe_C", "FRAGMENT")
    _moe_lib.define("topk_softmax(Tensor(a!) topk_weights, Tensor(b!) topk_ids, "
                    "Tensor(c!) token_expert_indices, Tensor gating_output, bool renormalize, "
                    "Tensor? bias=None, Tensor? is_padding=None) -> ()")
    _moe_lib.impl("topk_softmax", _topk_softmax, "PrivateUse1")


_define_moe_ops()
