"""Custom kernels on `tpu`: StableHLO modules and JAX (Pallas) functions as PyTorch ops.

    rmsnorm = torch_tpu.kernels.stablehlo_op(
        "mylib::rmsnorm", text_for_shapes, schema="(Tensor x, Tensor w, float eps) -> Tensor")
    y = rmsnorm(x, w, 1e-6)                 # same as torch.ops.mylib.rmsnorm(x, w, 1e-6)

    @torch_tpu.kernels.jax_op("mylib::xent", vjp=True)
    def xent(logits: jax.Array, labels: jax.Array) -> jax.Array: ...

A kernel is a StableHLO module with one public `@main` and static shapes. It is
checked once per specialisation (input shapes, dtypes and static arguments) --
its signature against the op's inputs and declared outputs, then a compile of
the module alone through the PJRT plugin -- and then inlined into the program
around it: `@main` and its helper functions become private functions of that
program with unique names, called with `func.call`. In Strict mode a call is a
program of its own; in DeferAndFuse mode and under `torch.compile` it fuses with
the ops before and after it (one execution per step).

JAX is imported only to export a `jax_op` kernel for a specialisation that is in
neither the memory nor the disk cache (`torch_tpu._C._get_cache_dir()/kernels`);
`import torch_tpu` never imports it, and StableHLO kernels never need it.
See docs/KERNELS.md.
"""
import functools
import hashlib
import inspect
import json
import os
import re
import typing

import torch

from . import _C

__all__ = ["stablehlo_op", "jax_op", "Kernel", "KernelError", "TensorSpec"]


class KernelError(RuntimeError):
    """A kernel that cannot run: bad module text, a signature that does not match
    the op, an unsupported custom_call, or a JAX function that cannot be exported."""


# ---------------------------------------------------------------- types
_ELEMENT = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "ui8",
    torch.uint16: "ui16", torch.uint32: "ui32", torch.uint64: "ui64", torch.bool: "i1",
    torch.complex64: "complex<f32>", torch.complex128: "complex<f64>",
}
_TORCH = {v: k for k, v in _ELEMENT.items()}
# numpy / JAX dtype names
_NP_TO_TORCH = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64, "bool": torch.bool,
    "complex64": torch.complex64, "complex128": torch.complex128,
}
_TORCH_TO_NP = {v: k for k, v in _NP_TO_TORCH.items()}


class TensorSpec(typing.NamedTuple):
    """Shape and dtype of a kernel input or output. `mlir` is its StableHLO type
    ("tensor<4x8xf32>"), handy when a function writes the module text."""

    shape: tuple
    dtype: torch.dtype

    @property
    def element(self):
        if self.dtype not in _ELEMENT:
            raise KernelError(f"torch_tpu kernels: dtype {self.dtype} is not supported on tpu")
        return _ELEMENT[self.dtype]

    @property
    def mlir(self):
        return "tensor<" + "".join(f"{d}x" for d in self.shape) + self.element + ">"

    def __str__(self):
        return self.mlir


def _spec(x):
    """A TensorSpec from a TensorSpec, a tensor, or a (shape, dtype) pair."""
    if isinstance(x, TensorSpec):
        return x
    if isinstance(x, torch.Tensor):
        return TensorSpec(tuple(int(d) for d in x.shape), x.dtype)
    if isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[1], torch.dtype):
        return TensorSpec(tuple(int(d) for d in x[0]), x[1])
    raise TypeError(f"torch_tpu kernels: an output must be a TensorSpec, a tensor or (shape, dtype), got {x!r}")


def _parse_type(t, what):
    m = re.fullmatch(r"tensor<((?:[0-9?]+x)*)(.+)>", t.strip())
    if not m:
        raise KernelError(f"{what} has type {t}: kernels take and return tensors only")
    dims = m.group(1)[:-1].split("x") if m.group(1) else []
    if "?" in dims:
        raise KernelError(f"{what} has dynamic type {t}: kernels need static shapes "
                          "(a function of the input shapes may produce the text)")
    if m.group(2) not in _TORCH:
        raise KernelError(f"{what} has element type {m.group(2)}, which tpu tensors do not have")
    return TensorSpec(tuple(int(d) for d in dims), _TORCH[m.group(2)])


# ---------------------------------------------------------------- module text
def _skip_string(s, i):
    """Index just past the string literal starting at s[i] == '"'."""
    i += 1
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        if s[i] == '"':
            return i + 1
        i += 1
    raise KernelError("the module text has an unterminated string literal")


def _match(s, i, open_, close):
    """Index just past the bracket closing s[i] == open_ (strings skipped)."""
    depth = 0
    while i < len(s):
        c = s[i]
        if c == '"':
            i = _skip_string(s, i)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise KernelError(f"the module text has an unbalanced '{open_}'")


def _outside_strings(s):
    """(start, end, is_string) pieces of s."""
    i, start = 0, 0
    while i < len(s):
        if s[i] == '"':
            if start < i:
                yield start, i, False
            j = _skip_string(s, i)
            yield i, j, True
            i = start = j
            continue
        if s[i] == "/" and s.startswith("//", i):  # a comment runs to the end of the line
            j = s.find("\n", i)
            j = len(s) if j < 0 else j
            if start < i:
                yield start, i, False
            i = start = j
            continue
        i += 1
    if start < len(s):
        yield start, len(s), False


def _strip_locations(text):
    """The text without comments, location attributes (`loc(...)`) and location aliases
    (`#loc3 = loc(...)`), which would clash between kernels inlined into one module."""
    s = "".join(text[a:b] for a, b, _ in _outside_strings(text))  # comments dropped
    # loc(...) outside strings: rebuild with the parenthesised part dropped
    res, i = [], 0
    pat = re.compile(r"(?<![\w.$#-])loc\(")
    while i < len(s):
        if s[i] == '"':
            j = _skip_string(s, i)
            res.append(s[i:j])
            i = j
            continue
        m = pat.match(s, i)
        if m:
            i = _match(s, i + 3, "(", ")")
            while res and res[-1] in (" ", "\t"):
                res.pop()
            continue
        res.append(s[i])
        i += 1
    s = "".join(res)
    return "\n".join(line for line in s.split("\n") if not re.match(r"\s*#loc[\w.$-]*\s*=", line))


def _split_top(s):
    """s split at commas outside brackets and strings."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == '"':
            i = _skip_string(s, i)
            continue
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
        i += 1
    if s[start:].strip():
        parts.append(s[start:])
    return [p.strip() for p in parts]


def _type_prefix(s):
    """The type at the start of s (up to its attributes)."""
    s = s.strip()
    if s.startswith("tensor<"):
        depth = 0
        for i, c in enumerate(s):
            if c == "<":
                depth += 1
            elif c == ">":
                depth -= 1
                if depth == 0:
                    return s[:i + 1]
    return re.split(r"[\s{]", s, maxsplit=1)[0]


class _Func(typing.NamedTuple):
    name: str
    args: list   # TensorSpec
    results: list


def _parse_module(text, what):
    """(body, functions): the module's body text and its functions. Accepts an
    explicit `module ... { ... }` or bare top-level functions."""
    s = text.strip()
    m = re.match(r"module\b", s)
    if m:
        i = m.end()
        start = s.find("{", i)
        head = s[i:start] if start >= 0 else ""
        if start < 0:
            raise KernelError(f"{what}: the module has no body")
        hm = re.fullmatch(r"\s*(@[\w$.-]+|@\"[^\"]*\")?\s*(attributes\s*)?", head)
        if hm is None:
            raise KernelError(f"{what}: cannot read the module header {head.strip()!r}")
        if hm.group(2):  # attributes {...} then the body's brace
            start = s.find("{", _match(s, start, "{", "}"))
        end = _match(s, start, "{", "}")
        if s[end:].strip():
            raise KernelError(f"{what}: unexpected text after the module: {s[end:].strip()[:60]!r}")
        body = s[start + 1:end - 1]
    else:
        body = s
    funcs = []
    i = 0
    fn_re = re.compile(r"\s*func\.func\s+(?:(public|private|nested)\s+)?@([\w$.-]+)\s*\(")
    while True:
        while i < len(body) and body[i].isspace():
            i += 1
        if i >= len(body):
            break
        fm = fn_re.match(body, i)
        if not fm:
            tok = body[i:i + 40].split("\n")[0]
            raise KernelError(f"{what}: expected `func.func` in the module, found {tok!r} (kernels are "
                              "modules of func.func functions in the custom form, as jax.export prints them)")
        name = fm.group(2)
        a0 = fm.end() - 1
        a1 = _match(body, a0, "(", ")")
        args = [_type_prefix(p.split(":", 1)[1]) for p in _split_top(body[a0 + 1:a1 - 1]) if ":" in p]
        j = a1
        rest = body[j:].lstrip()
        j = len(body) - len(rest)
        results = []
        if rest.startswith("->"):
            j += 2
            while body[j].isspace():
                j += 1
            if body[j] == "(":
                r1 = _match(body, j, "(", ")")
                results = [_type_prefix(p) for p in _split_top(body[j + 1:r1 - 1])]
                j = r1
            else:
                t = _type_prefix(body[j:])
                results = [t]
                j += len(t)
        rest = body[j:].lstrip()
        j = len(body) - len(rest)
        if rest.startswith("attributes"):
            j = _match(body, body.index("{", j), "{", "}")
        j = body.index("{", j)
        j = _match(body, j, "{", "}")
        fwhat = f"{what}: @{name}"
        funcs.append(_Func(name, [_parse_type(t, f"{fwhat} argument {k}") for k, t in enumerate(args)],
                           [_parse_type(t, f"{fwhat} result {k}") for k, t in enumerate(results)]))
        i = j
    return body, funcs


def _privatize(body, names, prefix):
    """The module body with every function made private and renamed prefix + name."""
    alt = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    sym = re.compile(r"@(" + alt + r")(?![\w$.-])")
    vis = re.compile(r"func\.func\s+(?:(?:public|private|nested)\s+)?@")
    out = []
    for a, b, is_str in _outside_strings(body):
        piece = body[a:b]
        if not is_str:
            piece = vis.sub("func.func private @", piece)
            piece = sym.sub(lambda m: "@" + prefix + m.group(1), piece)
        out.append(piece)
    return "".join(out).strip("\n")


def _custom_calls(text):
    return sorted(set(re.findall(r"custom_call\s*@([\w$.-]+)", text) +
                      re.findall(r"call_target_name\s*=\s*\"([^\"]*)\"", text)))


# ---------------------------------------------------------------- ops
class _Spec(typing.NamedTuple):
    id: int
    outputs: list  # TensorSpec per op output


_registry = {}


def _platform():
    return _C.platform_name()


def _scalar_type(t):
    t = str(t)
    return t.startswith(("int", "float", "bool", "str", "SymInt")) and "[]" not in t


class Kernel:
    """A custom op backed by a StableHLO kernel. Call it like a function (or as
    `torch.ops.ns.name`); `.op` is the OpOverload."""

    def __init__(self, name, schema, mutates_args=(), donate=()):
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_]\w*::[A-Za-z_]\w*", name):
            raise ValueError(f"torch_tpu kernels: the name must look like 'namespace::op', got {name!r}")
        if name in _registry:
            raise KernelError(f"torch_tpu kernels: {name} is already registered in this process")
        self.name = name
        ns, opname = name.split("::")
        schema = schema.strip()
        if not schema.startswith("("):
            raise ValueError(f"torch_tpu kernels: the schema looks like '(Tensor x, float eps) -> Tensor', got {schema!r}")
        try:
            parsed = torch._C.parse_schema(name + schema)
        except RuntimeError as e:
            raise ValueError(f"torch_tpu kernels: bad schema {schema!r}: {e}") from None
        self.schema = parsed
        args = parsed.arguments
        self._names = [a.name for a in args]
        self._defaults = {a.name: a.default_value for a in args if a.has_default_value()}
        self._tensor_pos, self._static_pos = [], []
        written = set()
        for k, a in enumerate(args):
            t = str(a.type)
            if t == "Tensor":
                self._tensor_pos.append(k)
                if a.alias_info is not None and a.alias_info.is_write:
                    written.add(a.name)
            elif _scalar_type(t):
                self._static_pos.append(k)
            else:
                raise KernelError(f"{name}: argument {a.name} has type {t}; kernels take Tensors and "
                                  "int/float/bool/str static arguments")
        for r in parsed.returns:
            if str(r.type) != "Tensor" or r.alias_info is not None:
                raise KernelError(f"{name}: kernels return new Tensors (in-place results are declared with "
                                  f"mutates_args), got {r.type} in {schema}")
        self.n_outputs = len(parsed.returns)
        tensor_names = [self._names[k] for k in self._tensor_pos]
        for a in list(mutates_args) + list(donate):
            if a not in tensor_names:
                raise KernelError(f"{name}: {a!r} is not a tensor argument of {schema}")
        if written and mutates_args and set(mutates_args) != written:
            raise KernelError(f"{name}: mutates_args {tuple(mutates_args)} differs from the schema's (a!) arguments")
        mutated = list(mutates_args) or [n for n in tensor_names if n in written]
        if set(mutated) & set(donate):
            raise KernelError(f"{name}: an argument cannot be both mutated and donated")
        self._mutated = [tensor_names.index(n) for n in mutated]  # tensor indices
        self._donate = [tensor_names.index(n) for n in donate]
        if self.n_outputs + len(self._mutated) == 0:
            raise KernelError(f"{name}: a kernel must return or mutate at least one tensor")
        if mutated and not written:  # the schema needs the (a!) annotations
            for k, n in enumerate(mutated):
                schema = re.sub(r"\bTensor\s+" + re.escape(n) + r"\b", f"Tensor({chr(97 + k)}!) {n}", schema,
                                count=1)
            parsed = torch._C.parse_schema(name + schema)
            self.schema = parsed
        self._specs = {}
        self._lib = torch.library.Library(ns, "FRAGMENT")
        try:
            self._lib.define(opname + schema)
        except RuntimeError as e:
            raise KernelError(f"torch_tpu kernels: cannot define {name}: {e}") from None
        self._lib.impl(opname, self._impl, "PrivateUse1")
        torch.library.register_fake(name, self._fake, lib=self._lib)
        self.op = getattr(getattr(torch.ops, ns), opname).default
        _registry[name] = self

    # ------------------------------------------------------------ calls
    def __call__(self, *args, **kwargs):
        return self.op(*args, **kwargs)

    def __repr__(self):
        return f"<torch_tpu kernel {self.name}{str(self.schema)[len(self.name):]}>"

    def _args(self, args, kwargs):
        """All arguments in schema order (the dispatcher passes keyword-only ones as
        keywords and may leave trailing defaults out)."""
        if kwargs or len(args) < len(self._names):
            args = list(args)
            for n in self._names[len(args):]:
                if n in kwargs:
                    args.append(kwargs[n])
                elif n in self._defaults:
                    args.append(self._defaults[n])
                else:
                    raise TypeError(f"{self.name}() missing argument {n!r}")
        return args

    def _key(self, args):
        return (tuple([(a.shape, a.dtype) for a in (args[k] for k in self._tensor_pos)]),
                tuple([args[k] for k in self._static_pos]))

    def _impl(self, *args, **kwargs):
        args = self._args(args, kwargs)
        key = self._key(args)
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specialize(key, args)
        tensors = [args[k] for k in self._tensor_pos]
        outs = _C._kernel_call(spec.id, tensors)
        if self._mutated:  # as for PyTorch's in-place ops: autograd sees that they changed
            torch._C._increment_version([tensors[i] for i in self._mutated])
        if self.n_outputs == 0:
            return None
        return outs[0] if self.n_outputs == 1 else tuple(outs)

    def _fake(self, *args, **kwargs):
        args = self._args(args, kwargs)
        tensors = [args[k] for k in self._tensor_pos]
        # kernels have static shapes: a symbolic size (dynamic=True, automatic dynamic
        # shapes) is specialised to its value here, with a guard
        key = (tuple([(torch.Size([int(d) for d in t.shape]), t.dtype) for t in tensors]),
               tuple([args[k] for k in self._static_pos]))
        outs = self._output_specs(key, args)
        dev = tensors[0].device if tensors else torch.device("tpu")
        res = [torch.empty(s.shape, dtype=s.dtype, device=dev) for s in outs]
        if self.n_outputs == 0:
            return None
        return res[0] if self.n_outputs == 1 else tuple(res)

    def _in_specs(self, args):
        return [TensorSpec(tuple(int(d) for d in args[k].shape), args[k].dtype) for k in self._tensor_pos]

    def _named(self, args, in_specs):
        """Arguments by name, tensors as TensorSpecs (what text/output functions receive)."""
        named = {self._names[k]: args[k] for k in self._static_pos}
        for k, s in zip(self._tensor_pos, in_specs):
            named[self._names[k]] = s
        return named

    # ------------------------------------------------------------ autograd
    def register_autograd(self, backward, setup_context=None):
        """torch.library.register_autograd for this op (the backward may call other kernels)."""
        torch.library.register_autograd(self.name, backward, setup_context=setup_context, lib=self._lib)
        return self

    # ------------------------------------------------------------ specialisation
    def _output_specs(self, key, args):
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specialize(key, args)
        return spec.outputs

    def _specialize(self, key, args):
        raise NotImplementedError

    def _install(self, key, text, in_specs, declared):
        """Checks module `text` against the inputs and the declared outputs (None: take
        @main's), compiles it alone, renames its functions and registers it."""
        what = f"kernel {self.name}"
        stripped = _strip_locations(text)
        try:
            body, funcs = _parse_module(stripped, what)
        except KernelError as e:
            self._compile_check(stripped, what)  # the plugin's message, when it rejects the text
            raise e from None
        mains = [f for f in funcs if f.name == "main"]
        if not mains:
            raise KernelError(f"{what}: the module has no @main function")
        main = mains[0]
        tnames = [self._names[k] for k in self._tensor_pos]
        if len(main.args) != len(in_specs):
            raise KernelError(f"{what}: @main takes {len(main.args)} arguments, but the op passes "
                              f"{len(in_specs)} tensors ({', '.join(tnames)})")
        for n, got, want in zip(tnames, main.args, in_specs):
            if got != want:
                raise KernelError(f"{what}: @main's argument for {n} is {got}, but {n} is {want}")
        n_mut = len(self._mutated)
        if declared is None:
            if len(main.results) != self.n_outputs + n_mut:
                raise KernelError(f"{what}: @main returns {len(main.results)} values; the op has "
                                  f"{self.n_outputs} outputs and mutates {n_mut} inputs")
            declared = main.results[:self.n_outputs]
        declared = [_spec(d) for d in declared]
        if len(declared) != self.n_outputs:
            raise KernelError(f"{what}: {len(declared)} outputs declared, the schema returns {self.n_outputs}")
        want = declared + [in_specs[i] for i in self._mutated]
        if main.results != want:
            raise KernelError(f"{what}: @main returns ({', '.join(map(str, main.results))}), but the op "
                              f"expects ({', '.join(map(str, want))})"
                              + (" (its outputs, then the new values of the mutated inputs)" if n_mut else ""))
        self._compile_check(stripped, what)
        digest = hashlib.sha256(stripped.encode()).hexdigest()[:16]
        prefix = "k_" + re.sub(r"\W", "_", self.name) + "_" + digest + "_"
        funcs_text = _privatize(body, [f.name for f in funcs], prefix)
        donor = [-1] * self.n_outputs
        for i in self._donate:  # each donated input backs the first free output of its type
            for j, o in enumerate(declared):
                if donor[j] < 0 and o == in_specs[i]:
                    donor[j] = i
                    break
        kid = _C._kernel_register(self.name, prefix + "main", funcs_text,
                                  [(list(s.shape), s.element) for s in in_specs],
                                  [(list(s.shape), s.element) for s in want], self.n_outputs,
                                  self._mutated, donor, self._donate)
        spec = _Spec(kid, declared)
        self._specs[key] = spec
        return spec

    def _compile_check(self, text, what):
        try:
            _C._kernel_compile(text)
        except RuntimeError as e:
            msg = str(e)
            calls = _custom_calls(text)
            hint = ""
            if calls and "custom call" in msg.lower():
                hint = (f"\n(the module calls custom_call targets {', '.join(calls)}; the {_platform()} "
                        "plugin has no implementation for at least one of them)")
            raise KernelError(f"{what}: the StableHLO module does not compile on the {_platform()} plugin: "
                              f"{msg}{hint}") from None


class StableHLOKernel(Kernel):
    def __init__(self, name, module, schema, outputs=None, mutates_args=(), donate=()):
        if not isinstance(module, str) and not callable(module):
            raise TypeError("torch_tpu kernels: module must be StableHLO text or a function returning it")
        if outputs is not None and not callable(outputs) and not isinstance(outputs, (list, tuple)):
            raise TypeError("torch_tpu kernels: outputs must be a list of TensorSpecs or a function returning one")
        self._module = module
        self._outputs = outputs
        super().__init__(name, schema, mutates_args, donate)

    def _declared(self, args, in_specs):
        if self._outputs is None:
            return None
        out = self._outputs(**self._named(args, in_specs)) if callable(self._outputs) else self._outputs
        if isinstance(out, (TensorSpec, torch.Tensor)):
            out = [out]
        return [_spec(o) for o in out]

    def _output_specs(self, key, args):
        spec = self._specs.get(key)
        if spec is not None:
            return spec.outputs
        declared = self._declared(args, self._in_specs(args))
        if declared is not None:  # no text needed to trace
            return declared
        return self._specialize(key, args).outputs

    def _specialize(self, key, args):
        in_specs = self._in_specs(args)
        text = self._module
        if callable(text):
            text = text(**self._named(args, in_specs))
            if not isinstance(text, str):
                raise KernelError(f"kernel {self.name}: the module function returned {type(text).__name__}, not text")
        return self._install(key, text, in_specs, self._declared(args, in_specs))


def stablehlo_op(name, module, *, schema, outputs=None, mutates_args=(), donate=()):
    """Registers `name` ("ns::op") as a PyTorch op whose tpu implementation is a StableHLO module.

    module: the module text (one public `@main`, static shapes; helper functions
        allowed), or a function called with the op's arguments by name -- tensors
        as TensorSpecs (shape, dtype, mlir), the rest as given -- that returns it
        for those shapes. `@main` takes the tensor arguments in schema order and
        returns the outputs, then the new values of `mutates_args`.
    schema: the op's arguments and results, "(Tensor x, Tensor w, float eps) -> Tensor".
        Non-tensor arguments are static: each value is its own specialisation.
    outputs: the outputs' TensorSpecs (or (shape, dtype) pairs), or a function of
        the arguments (as for `module`) returning them; the fake kernel used by
        torch.compile comes from it. None: the types @main returns.
    mutates_args: tensor arguments the kernel writes in place.
    donate: tensor arguments whose memory the kernel may reuse for an output of the
        same shape and dtype; a donated tensor cannot be used after the call
        (using it raises). Ignored under torch.compile, which donates by itself.
    """
    return StableHLOKernel(name, module, schema, outputs, tuple(mutates_args), tuple(donate))


# ---------------------------------------------------------------- JAX
def _classify(ann, what):
    """'tensor', 'int'/'float'/'bool'/'str', or a list of them for a tuple return."""
    if ann is inspect.Parameter.empty:
        raise KernelError(f"{what} needs a type annotation (jax.Array for tensors, int/float/bool/str for "
                          "static arguments)")
    if ann is None or ann is type(None):
        return []
    if isinstance(ann, str):
        s = ann.strip()
        m = re.fullmatch(r"(?:typing\.)?[Tt]uple\[(.*)\]", s)
        if m:
            return [_classify(p, what) for p in _split_top(m.group(1)) if p != "..."]
        if s == "None":
            return []
        if s in ("int", "float", "bool", "str"):
            return s
        if re.search(r"Array|ndarray|Tensor", s):
            return "tensor"
        raise KernelError(f"{what} has annotation {s!r}; use jax.Array, int, float, bool or str")
    if ann in (int, float, bool, str):
        return ann.__name__
    if typing.get_origin(ann) is tuple:
        return [_classify(a, what) for a in typing.get_args(ann) if a is not Ellipsis]
    name = getattr(ann, "__name__", None) or str(ann)
    return _classify(name, what)


def _default_literal(v):
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return None


def _jax_schema(fn, name):
    sig = inspect.signature(fn)
    parts = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise KernelError(f"{name}: *args/**kwargs cannot be kernel arguments; pass schema=")
        kind = _classify(p.annotation, f"{name}: parameter {p.name}")
        if isinstance(kind, list):
            raise KernelError(f"{name}: parameter {p.name} cannot be a tuple")
        item = f"Tensor {p.name}" if kind == "tensor" else f"{kind} {p.name}"
        if kind != "tensor" and p.default is not p.empty:
            lit = _default_literal(p.default)
            if lit is None:
                raise KernelError(f"{name}: the default of {p.name} must be a number, bool or string")
            item += "=" + lit
        parts.append(item)
    ret = _classify(sig.return_annotation, f"{name}: the return value")
    rets = ret if isinstance(ret, list) else [ret]
    if any(r != "tensor" for r in rets):
        raise KernelError(f"{name}: a kernel returns arrays only")
    ret_s = "()" if not rets else "Tensor" if len(rets) == 1 else "(" + ", ".join(["Tensor"] * len(rets)) + ")"
    return "(" + ", ".join(parts) + ") -> " + ret_s, len(rets)


def _fn_identity(fn, extra):
    """What the disk cache keys a JAX function by: its name, source text and
    source file (and those of functions it closes over), plus `extra`."""
    h = hashlib.sha256()
    seen = set()

    def add(f, depth):
        f = inspect.unwrap(f)
        if isinstance(f, functools.partial):
            h.update(repr((f.args, sorted(f.keywords.items()))).encode())
            f = f.func
        if id(f) in seen or depth > 2:
            return
        seen.add(id(f))
        h.update(f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', repr(f))}".encode())
        try:
            h.update(inspect.getsource(f).encode())
            path = inspect.getsourcefile(f)
            if path and os.path.exists(path):
                with open(path, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
        except (OSError, TypeError):
            code = getattr(f, "__code__", None)
            h.update(code.co_code if code is not None else repr(f).encode())
        for cell in getattr(f, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            v = getattr(v, "fn", v)
            if inspect.isfunction(v) or isinstance(v, functools.partial):
                add(v, depth + 1)

    add(fn, 0)
    h.update(str(extra).encode())
    return h.hexdigest()


def _jax_platform():
    p = _platform().lower()
    return {"gpu": "cuda", "cuda": "cuda", "rocm": "rocm", "tpu": "tpu"}.get(p, "cpu")


class JaxKernel(Kernel):
    def __init__(self, name, fn, schema=None, mutates_args=(), donate=(), cache_key=None):
        if not callable(fn):
            raise TypeError("torch_tpu kernels: jax_op needs a function")
        self.fn = fn
        if schema is None:
            schema, _ = _jax_schema(fn, name)
        self._cache_key = cache_key
        self._identity = None
        super().__init__(name, schema, mutates_args, donate)

    def _disk_path(self, key):
        d = _C._get_cache_dir()
        if not d:
            return None
        if self._identity is None:
            self._identity = _fn_identity(self.fn, self._cache_key)
        h = hashlib.sha256(repr((self.name, self._identity, [(tuple(s), str(t)) for s, t in key[0]], key[1],
                                 _platform(), _C.platform_version())).encode()).hexdigest()[:32]
        return os.path.join(d, "kernels", h + ".json")

    def _specialize(self, key, args):
        in_specs = self._in_specs(args)
        path = self._disk_path(key)
        entry = None
        if path and os.path.exists(path):
            try:
                with open(path) as f:
                    entry = json.load(f)
                if entry.get("format") != 1 or entry.get("name") != self.name:
                    entry = None
            except (OSError, ValueError):
                entry = None
        if entry is None:
            entry = self._export(in_specs, args)
            if path:
                try:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    tmp = f"{path}.tmp{os.getpid()}"
                    with open(tmp, "w") as f:
                        json.dump(entry, f)
                    os.replace(tmp, path)
                except OSError:
                    pass  # the cache is an optimisation
        outputs = [TensorSpec(tuple(s), _NP_TO_TORCH[d]) for s, d in entry["outputs"]]
        return self._install(key, entry["text"], in_specs, outputs[:self.n_outputs])

    def _export(self, in_specs, args):
        try:
            import jax
            from jax import export as jax_export
        except ImportError as e:
            raise KernelError(f"kernel {self.name}: JAX is needed to export this kernel for inputs "
                              f"{', '.join(map(str, in_specs))} (not in the kernel cache): {e}. "
                              "Install it with `pip install torch_tpu[jax]`") from None
        statics = {k: args[k] for k in self._static_pos}
        tpos = self._tensor_pos
        n = len(self._names)
        fn = self.fn

        def call(*tensors):
            full = [None] * n
            for k, t in zip(tpos, tensors):
                full[k] = t
            for k, v in statics.items():
                full[k] = v
            return fn(*full)

        for s in in_specs:
            if s.dtype not in _TORCH_TO_NP:
                raise KernelError(f"kernel {self.name}: dtype {s.dtype} cannot be passed to JAX")
        structs = [jax.ShapeDtypeStruct(s.shape, _TORCH_TO_NP[s.dtype]) for s in in_specs]
        wide = any(s.dtype in (torch.int64, torch.float64) for s in in_specs)
        try:
            with jax.enable_x64(True) if wide else _nullcontext():
                exp = jax_export.export(jax.jit(call), platforms=[_jax_platform()])(*structs)
                text = exp.mlir_module()
        except KernelError:
            raise
        except Exception as e:
            raise KernelError(f"kernel {self.name}: jax.export failed for inputs "
                              f"{', '.join(map(str, in_specs))}: {type(e).__name__}: {e}") from e
        if exp.nr_devices != 1:
            raise KernelError(f"kernel {self.name}: the exported function uses {exp.nr_devices} devices; kernels use one")
        if exp.ordered_effects or exp.unordered_effects:
            raise KernelError(f"kernel {self.name}: the function has side effects (callbacks, prints, ...), "
                              "which a kernel cannot have")
        outs = []
        for a in exp.out_avals:
            d = str(a.dtype)
            if d not in _NP_TO_TORCH:
                raise KernelError(f"kernel {self.name}: an output has dtype {d}, which tpu tensors do not have")
            outs.append([list(int(x) for x in a.shape), d])
        kept = list(exp.module_kept_var_idx)
        if kept != list(range(len(in_specs))):  # jax.export drops unused arguments: take them back
            out_specs = [TensorSpec(tuple(sh), _NP_TO_TORCH[d]) for sh, d in outs]
            text = _with_all_arguments(_strip_locations(text), in_specs, kept, out_specs, self.name)
        return {"format": 1, "name": self.name, "text": text, "outputs": outs,
                "jax_version": jax.__version__, "platform": _jax_platform()}


def _with_all_arguments(text, in_specs, kept, out_specs, name):
    """The module with @main renamed @main_kept and a new @main that takes every
    input and passes the kept ones on."""
    body, _ = _parse_module(text, f"kernel {name}")
    main = re.compile(r"@main(?![\w$.-])")
    body = "".join(body[a:b] if is_str else main.sub("@main_kept", body[a:b])
                   for a, b, is_str in _outside_strings(body))
    args = ", ".join(f"%a{i}: {s.mlir}" for i, s in enumerate(in_specs))
    kept_args = ", ".join(f"%a{i}" for i in kept)
    kept_types = ", ".join(in_specs[i].mlir for i in kept)
    res_types = ", ".join(s.mlir for s in out_specs)
    n = len(out_specs)
    lhs = "%r" if n == 1 else f"%r:{n}"
    rets = "%r" if n == 1 else ", ".join(f"%r#{j}" for j in range(n))
    wrapper = (f"  func.func public @main({args}) -> ({res_types}) {{\n"
               f"    {lhs} = func.call @main_kept({kept_args}) : ({kept_types}) -> ({res_types})\n"
               f"    return {rets} : {res_types}\n  }}\n")
    return "module {\n" + wrapper + body + "\n}\n"


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def jax_op(name, fn=None, *, schema=None, mutates_args=(), donate=(), vjp=False, cache_key=None):
    """Registers `name` ("ns::op") as a PyTorch op computed by the JAX function `fn`
    (usable as a decorator: `@jax_op("ns::op")`).

    fn: a function of JAX arrays (Pallas calls included) annotated with jax.Array
        for tensor arguments and int/float/bool/str for static ones; it returns an
        array or a tuple of arrays (the outputs, then the new values of
        `mutates_args`). It is exported with jax.export for the active plugin's
        platform once per (shapes, dtypes, static values), and the StableHLO is
        cached in memory and on disk, so a later process with the same kernel
        and shapes runs it without importing JAX.
    schema: overrides the schema derived from the annotations.
    vjp: also register a backward derived by JAX (jax.vjp of fn, itself a kernel
        named name + "_vjp"); gradients flow to floating-point tensor arguments.
    cache_key: anything that distinguishes functions the source text does not
        (generated code); part of the disk cache key.
    mutates_args, donate: as for stablehlo_op.
    """
    if fn is None:
        return lambda f: jax_op(name, f, schema=schema, mutates_args=mutates_args, donate=donate, vjp=vjp,
                                cache_key=cache_key)
    k = JaxKernel(name, fn, schema, tuple(mutates_args), tuple(donate), cache_key)
    if vjp:
        _register_jax_vjp(k)
    return k


def _register_jax_vjp(k):
    if k._mutated:
        raise KernelError(f"{k.name}: vjp=True needs a functional kernel (no mutates_args)")
    tnames = [k._names[i] for i in k._tensor_pos]
    snames = [k._names[i] for i in k._static_pos]
    n_in, n_out = len(tnames), k.n_outputs
    fwd_args = [k.schema.arguments[i] for i in range(len(k._names))]
    parts = [f"Tensor {n}" for n in tnames] + [f"Tensor grad_{j}" for j in range(n_out)]
    for a in fwd_args:
        if a.name in snames:
            parts.append(f"{a.type} {a.name}")
    schema = "(" + ", ".join(parts) + ") -> (" + ", ".join(["Tensor"] * n_in) + ")"
    fn, tpos, spos, n_all = k.fn, k._tensor_pos, k._static_pos, len(k._names)

    def backward_fn(*a):
        import jax
        import jax.numpy as jnp

        prim, cts, statics = a[:n_in], a[n_in:n_in + n_out], a[n_in + n_out:]
        diff = [i for i, x in enumerate(prim) if jnp.issubdtype(x.dtype, jnp.inexact)]

        def f(*d):
            full = [None] * n_all
            for i, kk in enumerate(tpos):
                full[kk] = prim[i]
            for j, i in enumerate(diff):
                full[tpos[i]] = d[j]
            for kk, v in zip(spos, statics):
                full[kk] = v
            return fn(*full)

        _, pullback = jax.vjp(f, *[prim[i] for i in diff])
        grads = pullback(cts[0] if n_out == 1 else tuple(cts))
        out = [jnp.zeros((0,), jnp.float32)] * n_in  # non-differentiable inputs: an empty placeholder
        for j, i in enumerate(diff):
            out[i] = grads[j]
        return tuple(out)

    bwd = JaxKernel(k.name + "_vjp", backward_fn, schema, cache_key=k._cache_key)  # fn is in its closure
    k.vjp_kernel = bwd

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*[inputs[i] for i in tpos])
        ctx.statics = [inputs[i] for i in spos]

    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        if any(g is None for g in grads):
            grads = [g if g is not None else torch.zeros_like(o) for g, o in zip(grads, _fake_outs(k, saved, ctx))]
        res = bwd(*saved, *grads, *ctx.statics)
        if not isinstance(res, tuple):
            res = (res,)
        out = [None] * n_all
        for i, kk in enumerate(tpos):
            if saved[i].dtype.is_floating_point or saved[i].dtype.is_complex:
                out[kk] = res[i]
        return tuple(out)

    k.register_autograd(backward, setup_context=setup_context)


def _fake_outs(k, saved, ctx):
    """TensorSpecs of k's outputs for the saved inputs (to make zero gradients)."""
    args = [None] * len(k._names)
    for i, kk in enumerate(k._tensor_pos):
        args[kk] = saved[i]
    for kk, v in zip(k._static_pos, ctx.statics):
        args[kk] = v
    return [torch.empty(s.shape, dtype=s.dtype, device=saved[0].device) for s in k._output_specs(k._key(args), args)]
