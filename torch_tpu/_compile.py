"""Compiled mode: the `torch.compile` backend "tpu".

    model = torch.compile(model, backend="tpu")   # or plain torch.compile(model): see below

Dynamo captures the Python code into FX graphs, AOTAutograd splits training
graphs into a forward and a backward graph, and each graph is compiled here
into one program: its nodes run through the same kernels (Meta kernels,
lowering rules, views as loads and stores) as eager mode, on stand-in tpu
tensors whose storages stand for the graph's inputs, and what they build is
compiled once by the PJRT plugin. Each later call is one program execution
over the callers' buffers, with no per-op dispatch.

A node the capture cannot hold -- an op without a lowering (it would take the
CPU fallback), an op on CPU tensors, an op that needs data on the host -- runs
eagerly between programs ("eager nodes", counted in torch_tpu.metrics). Random
ops draw from the device generator on every call.

Shapes: a static graph is one program. A graph with symbolic sizes (`dynamic=True`,
`torch._dynamo.mark_dynamic`, or Dynamo's automatic dynamic shapes after a second
size) is captured once per concrete shape, with its symbolic dims dynamic
(torch_tpu.dynamic): the program text depends on their bucket only, so a new size in
a bucket reuses the compiled executable (a capture, no compile).
"""
import operator
import threading
import time
import warnings

import torch
import torch.fx

from . import _C
from . import dynamic as _dynamic

__all__ = ["tpu_backend", "stats"]

_stats = {"graphs": 0, "eager_nodes": 0, "eager_graphs": 0, "call_seconds": 0.0}
_lock = threading.RLock()


def stats():
    """Counters of compiled mode (see torch_tpu.metrics.report)."""
    return dict(_stats)


def reset_stats():
    for k in _stats:
        _stats[k] = type(_stats[k])(0)


def _is_tpu(x):
    return isinstance(x, torch.Tensor) and x.device.type == "tpu"


def _vals(node):
    """The FakeTensors (or other values) a node produces, flattened."""
    v = node.meta.get("val", node.meta.get("example_value"))
    if isinstance(v, (list, tuple)):
        return list(v)
    return [v]


def _on_tpu(node):
    return any(_is_tpu(v) for v in _vals(node))


def _mutates(node):
    t = node.target
    schema = getattr(t, "_schema", None)
    if schema is None:
        return False
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _stand_in(val, device, fake=None):
    """A tpu tensor laid out like `val` (a FakeTensor or a real tensor) over a storage of the same size.
    Bounded dynamism: dims that are symbolic in `fake` (the graph's FakeTensor) are dynamic in it,
    at their bucket, so the program serves the bucket (its text depends on nothing else: inputs
    of other layouts are padded or staged to it at each call)."""
    if val.device.type != "tpu":  # a CPU value a tpu op reads: uploaded at run time
        return torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=device)
    nbytes = val.untyped_storage().nbytes()
    n = max(nbytes // val.element_size(), 0)
    base = torch.empty(n, dtype=val.dtype, device=device)
    t = base.as_strided(val.shape, val.stride(), val.storage_offset())
    if isinstance(fake, torch.Tensor):
        for d, s in enumerate(fake.shape):
            if not isinstance(s, int) and t.size(d) >= 2:
                _dynamic.mark_dynamic(t, d)
    return t


class _Segment:
    """Tpu nodes of one stage, captured into one program."""

    def __init__(self, nodes):
        self.nodes = nodes  # in graph order
        self.inputs = []    # nodes whose values the program reads, in input order
        self.outputs = []   # nodes (or None) whose values it returns, in output order
        self.program = None


class _Variant:
    """One capture of a graph (for one precision mode and one set of input shapes)."""

    def __init__(self, steps, single, static):
        self.steps = steps    # [("host", node) | ("program", segment)]
        self.single = single  # (program, input indices): the whole graph is one program over its inputs
        self.static = static  # node -> value fixed for this variant (shape arithmetic)


class _Pack:
    """One program input holding CPU scalars (0-dim values of `nodes`, in order)."""

    def __init__(self, nodes):
        self.nodes = nodes


class _Restart(Exception):
    """A node could not be captured: plan again with it on the host."""


class CompiledGraph:
    """The callable AOTAutograd gets for one FX graph (boxed or unboxed arguments)."""

    def __init__(self, gm, example_inputs, name):
        self._boxed_call = True  # an instance attribute: wrappers (functools.wraps) copy it
        self.gm = gm
        self.name = name
        self.nodes = list(gm.graph.nodes)
        self.calls = [n for n in self.nodes if n.op == "call_function"]
        self.placeholders = [n for n in self.nodes if n.op == "placeholder"]
        out = next(n for n in reversed(self.nodes) if n.op == "output").args[0]
        self.out_args = list(out) if isinstance(out, (list, tuple)) else [out]
        self.order = {n: i for i, n in enumerate(self.nodes)}
        self.device = self._device(example_inputs)
        self.dynamic = any(isinstance(x, torch.SymInt) or (isinstance(x, torch.Tensor) and any(
            isinstance(s, torch.SymInt) for s in x.shape)) for x in example_inputs)

        self.variants = {}
        self.host_forced = set()  # nodes the capture could not hold
        _stats["graphs"] += 1

    def _device(self, example_inputs):
        for x in example_inputs:
            if _is_tpu(x):
                return x.device.index or 0
        for n in self.nodes:
            for v in _vals(n):
                if _is_tpu(v):
                    return v.device.index or 0
        return torch.tpu.current_device()

    def device_obj(self):
        return torch.device("tpu", self.device)

    # ------------------------------------------------------------ calls
    def __call__(self, *args):
        t0 = time.perf_counter()
        if len(args) == 1 and isinstance(args[0], list):  # boxed: one list of arguments
            args = args[0]
        key = self._key(args)
        v = self.variants.get(key)
        if v is None:
            with _lock:
                v = self.variants.get(key)
                if v is None:
                    v = self._capture(args)
                    self.variants[key] = v
        if v.single is not None:
            prog, idx = v.single
            out = prog.run([args[i] for i in idx])
        else:
            out = self._interpret(v, args)
        _stats["call_seconds"] += time.perf_counter() - t0
        return out

    def _key(self, args):
        key = []
        if self.dynamic:
            for a in args:
                key.append(tuple(a.shape) if isinstance(a, torch.Tensor) else a)
        # the precision mode shapes every contraction: a graph with matmuls has one program per mode
        key.append(_C._current_precision())
        return tuple(key)

    # ------------------------------------------------------------ planning
    def _kinds(self, static):
        kind = {}
        for n in self.calls:
            if n in static:
                kind[n] = "static"
            elif n in self.host_forced:
                kind[n] = "host"
            elif n.target is operator.getitem:
                kind[n] = kind.get(n.args[0], "host")
            else:
                kind[n] = "tpu" if _on_tpu(n) else "host"
        # CPU work whose results only tpu nodes read (an optimizer's step counts turned into bias
        # corrections) moves into the program: its CPU inputs are uploaded instead of its results
        for n in reversed(self.calls):
            if kind[n] == "host" and n not in self.host_forced and not _mutates(n) and n.users and all(
                    kind.get(u) == "tpu" for u in n.users):
                kind[n] = "tpu"
        return kind

    def _deps(self):
        """Each call's producers, plus ordering around mutations: a node that writes
        an input comes after the other readers before it and before the readers after it."""
        deps = {n: [p for p in n.all_input_nodes if p.op == "call_function"] for n in self.calls}
        for n in self.calls:
            if not _mutates(n) or not n.args or not isinstance(n.args[0], torch.fx.Node):
                continue
            for u in n.args[0].users:
                if u is n or u not in deps:
                    continue
                if self.order[u] < self.order[n]:
                    deps[n].append(u)
                else:
                    deps[u].append(n)
        return deps

    def _plan(self, static):
        """Stages: even ones run on the host, odd ones are programs; each node
        takes the earliest stage of its kind after everything it depends on."""
        kind = self._kinds(static)
        deps = self._deps()
        stage = {}
        for n in self.calls:
            if kind[n] == "static":
                continue
            s = 1 if kind[n] == "tpu" else 0
            for p in deps[n]:
                if p in stage:
                    s = max(s, stage[p] if kind[p] == kind[n] else stage[p] + 1)
            if (s % 2 == 1) != (kind[n] == "tpu"):
                s += 1
            stage[n] = s
        steps = []
        for s in sorted(set(stage.values())):
            members = [n for n in self.calls if stage.get(n) == s]
            if s % 2 == 0:
                steps += [("host", n) for n in members]
            else:
                steps.append(("program", _Segment(members)))
        return steps

    def _static_values(self, args):
        """Non-tensor results computable from the inputs alone (shape arithmetic of
        dynamic graphs): fixed for one variant."""
        known = {}
        for n, a in zip(self.placeholders, args):
            known[n] = a
        static = {}
        for n in self.calls:
            vals = _vals(n)
            if any(isinstance(v, torch.Tensor) for v in vals) or not all(
                    p in known or p in static for p in n.all_input_nodes):
                continue
            if not self.dynamic:
                continue
            a, kw = torch.fx.node.map_arg((n.args, n.kwargs), lambda x: static[x] if x in static else known[x])
            static[n] = n.target(*a, **kw)
        return static

    # ------------------------------------------------------------ capture
    def _capture(self, args):
        for _ in range(len(self.calls) + 1):
            try:
                return self._capture_once(args)
            except _Restart:
                continue
            except Exception as e:  # anything unexpected: the graph runs eagerly, correct but slow
                _C._capture_abort(self.device)
                _stats["eager_graphs"] += 1
                warnings.warn(f"torch_tpu: the {self.name} graph could not be compiled ({type(e).__name__}: {e}); "
                              "it runs eagerly op by op")
                return _Variant([("host", n) for n in self.calls], None, {})
        raise RuntimeError("torch_tpu: capture did not converge")

    def _capture_once(self, args):
        static = self._static_values(args)
        steps = self._plan(static)
        readers = {}  # node -> the steps that read it
        for k, (kind, x) in enumerate(steps):
            for n in ([x] if kind == "host" else x.nodes):
                for p in n.all_input_nodes:
                    readers.setdefault(p, set()).add(k)
        graph_outs = {a for a in self.out_args if isinstance(a, torch.fx.Node)}
        real = dict(zip(self.placeholders, args))
        for n in self.nodes:
            if n.op == "get_attr":
                real[n] = getattr(self.gm, n.target)
        only = len(steps) == 1 and steps[0][0] == "program" and all(
            p.op != "call_function" for n in steps[0][1].nodes for p in n.all_input_nodes
            if p not in steps[0][1].nodes)
        dev = self.device_obj()
        with torch.no_grad(), torch._C._DisableAutocast():
            for k, (kind, seg) in enumerate(steps):
                if kind == "program":
                    self._capture_segment(seg, k, readers, graph_outs, real, static, dev, only)
        single = None
        seg = steps[0][1] if only else None
        if seg is not None and seg.outputs == self.out_args and all(
                not isinstance(n, _Pack) and _is_tpu(real.get(n)) for n in seg.inputs):
            # the whole graph is one program over tpu inputs: calls skip the step loop
            single = (seg.program, [self.placeholders.index(n) for n in seg.inputs])
        else:
            _stats["eager_nodes"] += sum(1 for kind, n in steps if kind == "host" and _on_tpu(n)
                                         and n.target is not operator.getitem)
        return _Variant(steps, single, static)

    def _capture_segment(self, seg, k, readers, graph_outs, real, static, dev, only):
        stand = {}
        members = set(seg.nodes)
        _C._capture_begin(self.device)
        # CPU scalars the program reads (optimizer step counts, their powers): packed into
        # one tensor per dtype, uploaded once per call
        scalars = {}
        for n in seg.nodes:
            for p in n.all_input_nodes:
                v = _vals(p)[0] if p.op != "get_attr" else None
                if p not in members and p not in static and isinstance(v, torch.Tensor) and v.device.type == "cpu" \
                        and v.dim() == 0 and p not in scalars.get(v.dtype, []):
                    scalars.setdefault(v.dtype, []).append(p)
        for dtype, nodes in scalars.items():
            base = torch.empty(len(nodes), dtype=dtype, device=dev)
            _C._capture_input(base, len(seg.inputs))
            seg.inputs.append(_Pack(nodes))
            stand[seg.inputs[-1]] = base
            for i, p in enumerate(nodes):
                stand[p] = base[i]

        def seg_input(n):
            if n in stand:
                return stand[n]
            v = real.get(n)
            if not isinstance(v, torch.Tensor):
                v = _vals(n)[0]
            t = _stand_in(v, dev, _vals(n)[0])
            _C._capture_input(t, len(seg.inputs))
            seg.inputs.append(n)
            stand[n] = t
            return t

        def arg(n):
            if n in stand:
                return stand[n]
            if n in static:
                return static[n]
            if n.op == "get_attr":
                v = real[n]
                if not isinstance(v, torch.Tensor) or v.device.type == "tpu" or v.dim() == 0:
                    return v  # a tpu constant is bound as it is; a CPU scalar constant is a number
                return seg_input(n)
            vals = _vals(n)
            if len(vals) == 1 and isinstance(vals[0], torch.Tensor):
                return seg_input(n)
            if n.op == "placeholder" and not isinstance(real.get(n), torch.Tensor):
                return real[n]  # an int input of a dynamic graph (in the variant's key)
            raise _HostValue(n)

        try:
            for n in seg.nodes:
                try:
                    a, kw = torch.fx.node.map_arg((n.args, n.kwargs), arg)
                    stand[n] = n.target(*a, **kw)
                except Exception as e:
                    if isinstance(e, _HostValue) or _C._capture_broken():
                        self.host_forced.add(n)
                        raise _Restart() from None
                    raise
            if only and all(a is None or (isinstance(a, torch.fx.Node) and isinstance(_vals(a)[0], torch.Tensor) and (
                    a in members or a.op == "placeholder")) for a in self.out_args):
                seg.outputs = list(self.out_args)  # the whole graph: its outputs, in order
                for a in seg.outputs:
                    if a is not None and a not in stand:
                        seg_input(a)
            else:
                seg.outputs = [n for n in seg.nodes if isinstance(stand[n], torch.Tensor) and (
                    n in graph_outs or any(r != k for r in readers.get(n, ())))]
        except BaseException:
            _C._capture_abort(self.device)
            raise
        seg.program = _C._capture_end(self.device, [stand[n] for n in seg.inputs],
                                      [None if n is None else stand[n] for n in seg.outputs])

    # ------------------------------------------------------------ general runs
    def _interpret(self, v, args):
        env = dict(zip(self.placeholders, args))
        env.update(v.static)
        dev = self.device_obj()
        for n in self.nodes:
            if n.op == "get_attr":
                env[n] = getattr(self.gm, n.target)
        get = env.__getitem__
        with torch.no_grad(), torch._C._DisableAutocast():
            for kind, s in v.steps:
                if kind == "host":
                    if s.target is operator.getitem:
                        env[s] = env[s.args[0]][s.args[1]]
                    else:
                        a, kw = torch.fx.node.map_arg((s.args, s.kwargs), get)
                        env[s] = s.target(*a, **kw)
                    continue
                ins = []
                for n in s.inputs:
                    if isinstance(n, _Pack):
                        ins.append(torch.stack([env[p] for p in n.nodes]).to(dev, non_blocking=True))
                        continue
                    t = env[n]
                    ins.append(t if t.device.type == "tpu" else t.to(dev))
                for n, t in zip(s.outputs, s.program.run(ins)):
                    if n is not None:
                        env[n] = t
        return [env[a] if isinstance(a, torch.fx.Node) else a for a in self.out_args]


class _HostValue(Exception):
    """A captured node reads a value that is not a tensor computed on the device."""


def _compiler(name):
    def compile_graph(gm, example_inputs):
        return CompiledGraph(gm, example_inputs, name)
    return compile_graph


def _has_tpu(gm, example_inputs):
    if any(_is_tpu(x) for x in example_inputs):
        return True
    return any(_is_tpu(v) for n in gm.graph.nodes for v in _vals(n))


def tpu_backend(gm, example_inputs, mode=None, options=None):
    """The Dynamo backend "tpu". A graph with tpu tensors goes through AOTAutograd
    (forward and backward graphs for training, one inference graph otherwise),
    each graph one program; a graph without tpu tensors goes to Inductor with
    the given mode and options, exactly as `torch.compile` would send it."""
    if not _has_tpu(gm, example_inputs):
        return torch._TorchCompileInductorWrapper(mode, options, None)(gm, example_inputs)
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(fw_compiler=_compiler("forward"), bw_compiler=_compiler("backward"),
                           inference_compiler=_compiler("inference"), keep_inference_input_mutations=True)
    return backend(gm, example_inputs)


def _make_default():
    """Makes "tpu" the default backend of `torch.compile` (torch.compiler.set_default_backend),
    unless the user already chose another one. Graphs without tpu tensors still go to Inductor."""
    from torch._dynamo.backends import registry

    if registry.get_default_backend() == "inductor":
        registry.set_default_backend("tpu")
    if "tpu" not in registry._BACKENDS:
        registry.register_backend(tpu_backend, name="tpu")


class _DefaultBackendHook:
    """A meta path finder that calls _make_default once torch's backend registry is
    imported (importing it eagerly would add over a second to `import torch`)."""

    name = "torch._dynamo.backends.registry"

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.util
        import sys

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            try:
                _make_default()
            except Exception as e:  # never break torch.compile for a default
                warnings.warn(f"torch_tpu: could not make 'tpu' the default torch.compile backend: {e}")

        spec.loader.exec_module = exec_module
        return spec


def install_default_backend():
    import os
    import sys

    if os.environ.get("TORCH_TPU_DEFAULT_COMPILE_BACKEND", "1") == "0":
        return
    if "torch._dynamo.backends.registry" in sys.modules:
        _make_default()
    elif not any(isinstance(f, _DefaultBackendHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _DefaultBackendHook())
