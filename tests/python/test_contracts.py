"""Contracts that cannot silently break: every lowering rule names a real ATen
op of this torch, and is reached: its op is not CompositeImplicitAutograd (such
an op is decomposed before any backend kernel) or one of its in-place / out=
variants runs it."""
import torch

import torch_tpu


def test_every_rule_names_a_real_non_composite_op():
    bad = []
    used = set(torch_tpu._C.lowered_op_rules().values())
    for name in torch_tpu._C.lowering_rules():
        base, _, overload = name.partition(".")
        try:
            torch._C._dispatch_find_schema_or_throw(base, overload)
        except RuntimeError:
            bad.append(f"{name}: no such op in torch {torch.__version__}")
            continue
        if name not in used:
            bad.append(f"{name}: no registered op runs it (CompositeImplicitAutograd: decomposed before any backend)"
                       if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")
                       else f"{name}: no registered op runs it")
    assert not bad, "\n".join(bad)
