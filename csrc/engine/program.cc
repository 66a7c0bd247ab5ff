// Programs: a graph's results and donations, building (single and replicated) and running.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tt::engine {

using hlo::Builder;
using hlo::Type;

rt::BufferPtr Engine::scalar_buffer(double v, bool is_int, DType t, int device) {
  std::string key(reinterpret_cast<const char*>(&v), sizeof v);
  key += static_cast<char>(t);
  key += static_cast<char>(is_int);
  key += std::to_string(device);
  if (auto* hit = scalars_.find(key)) return *hit;
  unsigned char buf[16] = {0};
  auto put = [&](auto x) { std::memcpy(buf, &x, sizeof x); };
  switch (t) {
    case DType::Pred: put(static_cast<uint8_t>(v != 0)); break;
    case DType::S8: put(static_cast<int8_t>(v)); break;
    case DType::U8: put(static_cast<uint8_t>(v)); break;
    case DType::S16: put(static_cast<int16_t>(v)); break;
    case DType::S32: put(static_cast<int32_t>(v)); break;
    case DType::U16: put(static_cast<uint16_t>(static_cast<int64_t>(v))); break;
    case DType::U32: put(static_cast<uint32_t>(static_cast<int64_t>(v))); break;
    case DType::U64: put(v >= 9.2233720368547758e18 ? static_cast<uint64_t>(v) : static_cast<uint64_t>(static_cast<int64_t>(v))); break;
    case DType::S64: put(static_cast<int64_t>(v)); break;
    case DType::F32: put(static_cast<float>(v)); break;
    case DType::F64: put(v); break;
    case DType::F16: case DType::BF16: {
      // convert through a tiny program-free path: use the builder's literal rules
      float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      uint16_t h;
      if (t == DType::BF16) {
        h = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
      } else {
        // via the standard half conversion of the compiler
        _Float16 hf = static_cast<_Float16>(f);
        std::memcpy(&h, &hf, 2);
      }
      put(h);
      break;
    }
    case DType::C64: {
      float c[2] = {static_cast<float>(v), 0.f};
      std::memcpy(buf, c, 8);
      break;
    }
    case DType::C128: {
      double c[2] = {v, 0.0};
      std::memcpy(buf, c, 16);
      break;
    }
  }
  auto buffer = rt::Client::get().from_host(buf, pjrt_type(t), {}, device);
  metrics.h2d_transfers++;
  metrics.h2d_bytes += hlo::itemsize(t);
  scalars_.put(key, buffer);
  return buffer;
}

// The error, the op of the program that caused it (from the "-:LINE:COL" the
// compiler reports) and the Python line that issued that op.
std::string Engine::describe_failure(const Graph& g, const std::string& what) {
  std::string msg = what;
  int op = -1;
  auto p = what.find("-:");
  if (p != std::string::npos) op = g.op_at_line(std::atoi(what.c_str() + p + 2));
  if (op >= 0) {
    msg += "\n(torch_tpu: the failing op is " + g.ops[op];
    if (!g.sites[op].where.empty()) msg += ", issued at " + g.sites[op].where;
    msg += ")";
  } else {
    msg += "\n(torch_tpu: in the program for " + std::to_string(g.ops.size()) + " ops:";
    for (size_t i = g.ops.size() > 5 ? g.ops.size() - 5 : 0; i < g.ops.size(); ++i)
      msg += " " + g.ops[i] + (g.sites[i].where.empty() ? "" : " (" + g.sites[i].where + ")") + ";";
    msg += ")";
  }
  return msg;
}


void Engine::collect_results(Graph& g, Program& p, std::vector<int>& entries, std::vector<Value>& values) {
  // The storages written and still alive. An overwritten storage whose buffer
  // nothing else holds donates it to its new value (in-place updates do not
  // double memory).
  p.device = g.device;
  for (size_t i = 0; i < g.entries_.size(); ++i) {
    auto& e = g.entries_[i];
    if (!e.written || !e.st->alive.load()) continue;
    auto ext = g.external_.find(e.st.get());
    // a capture returns what its inputs and outputs stand for, and storages
    // that existed before it; what it created and did not return is internal
    if (g.capture && ext == g.external_.end() && e.param < 0) continue;
    // a capture donates every written input (a run opts out where the buffer is shared)
    bool donor = g.capture ? ext != g.external_.end() && ext->second.kind == Slot::Kind::Input
                           : e.st->buffer && e.st->buffer.use_count() == 1;
    if (e.param >= 0 && donor && e.cur.type == Type{e.st->dtype, {e.st->elements()}})
      p.donations.emplace_back(e.param, static_cast<int>(values.size()));
    p.results.push_back(ext != g.external_.end() ? ext->second : Slot{Slot::Kind::Storage, e.st, 0});
    entries.push_back(static_cast<int>(i));
    values.push_back(e.cur);
  }
  p.params = g.params_;
}

void Engine::finish(Graph& g, Program& p, const std::vector<Value>& values) {
  set_param_bytes(g, p);
  for (auto& [param, result] : p.donations) g.b.alias(param, result);
  p.text = std::make_shared<const std::string>(g.b.module(values));
  metrics.program_bytes += static_cast<int64_t>(p.text->size());
  last_program_ = p.text;
  int64_t before = metrics.compiles.load();
  try {
    p.exe = compile(*p.text);
  } catch (const rt::Error& err) {
    throw rt::Error(describe_failure(g, err.what()), err.code());
  }
  if (metrics.compiles.load() != before) {
    static const bool log = std::getenv("TORCH_TPU_LOG_COMPILES") != nullptr;  // debugging aid
    if (log) {
      std::string ops;
      for (size_t i = 0; i < g.ops.size() && i < 6; ++i) ops += " " + g.ops[i];
      std::string ps;
      for (const auto& t : g.b.param_types()) ps += " " + t.str();
      std::fprintf(stderr, "torch_tpu compile: %zu ops:%s%s (%s)\n", g.ops.size(), ops.c_str(), g.ops.size() > 6 ? " ..." : "", ps.c_str());
    }
    // debugging aid: every compiled program's text, numbered, with the ops it holds
    static const char* dump = std::getenv("TORCH_TPU_DUMP_PROGRAMS");
    if (dump && *dump) {
      std::string path = std::string(dump) + "/program_" + std::to_string(metrics.compiles.load()) + ".mlir";
      if (FILE* f = std::fopen(path.c_str(), "w")) {
        std::string head = "// ops:";
        for (const auto& o : g.ops) head += " " + o;
        std::fprintf(f, "%s\n%s", head.c_str(), p.text->c_str());
        std::fclose(f);
      }
    }
    note_compile(g, values);
    if (!g.buckets.empty()) {
      std::vector<int64_t> bs = g.buckets;
      std::sort(bs.begin(), bs.end());
      std::string k;
      for (int64_t x : bs) k += (k.empty() ? "" : ",") + std::to_string(x);
      programs_per_bucket_[k]++;
      metrics.dynamic_compiles++;
    }
  }
}

// Like PyTorch/XLA's "CompileTime too frequent": the same ops compiling program
// after program means something that varies call to call is in the program text.
void Engine::note_compile(const Graph& g, const std::vector<Value>& results) {
  if (g.ops.empty()) return;
  std::string name = g.ops.size() == 1 ? g.ops[0] : g.ops.front() + " ... " + g.ops.back() + " (" + std::to_string(g.ops.size()) + " ops)";
  // the same ops on the same parameter and result types: new shapes alone do not
  // count (an op that creates its output, such as zero_ of a fresh tensor, has none
  // of its shapes in the parameters)
  std::string key = name;
  for (const auto& t : g.b.param_types()) key += t.str();
  key += "->";
  for (const auto& v : results) key += v.type.str();
  if (++compiles_by_ops_[key] != kFrequentCompiles) return;
  key = name;
  metrics.frequent_compiles++;
  if (warn_)
    warn_("torch_tpu: " + key + " has compiled " + std::to_string(kFrequentCompiles) +
          " different programs for the same input shapes; something that changes from call to call is part of "
          "the program (e.g. a Python number the op reads as a constant). Each new program costs a compile "
          "(torch_tpu.metrics.report()['frequent_compiles'] counts such op sequences).");
}

void Engine::set_param_bytes(const Graph& g, Program& p) {
  p.param_bytes.clear();
  for (const auto& t : g.b.param_types()) p.param_bytes.push_back(hlo::numel(t.shape) * hlo::itemsize(t.dtype));
}

Program Engine::build(Graph& g) {
  Program p;
  std::vector<int> entries;
  std::vector<Value> values;
  collect_results(g, p, entries, values);
  finish(g, p, values);
  return p;
}

Program Engine::build_replicated(Graph& g, int replicas) {
  Program p;
  std::vector<int> entries;
  std::vector<Value> values;
  collect_results(g, p, entries, values);
  p.donations.clear();
  for (const auto& r : p.results)
    if (r.kind == Slot::Kind::Storage)
      throw rt::Error("torch_tpu: a replicated program may write only its inputs and outputs (it wrote a tensor "
                      "that existed before the capture)");
  p.text = std::make_shared<const std::string>(g.b.module(values, replicas));
  metrics.program_bytes += static_cast<int64_t>(p.text->size());
  last_program_ = p.text;
  auto t0 = std::chrono::steady_clock::now();
  try {
    p.exe = rt::Client::get().compile_replicated(*p.text, replicas);
  } catch (const rt::Error& err) {
    throw rt::Error(describe_failure(g, err.what()), err.code());
  }
  note_compile(t0);
  return p;
}

// The binder of single and replicated runs: replica r reads its Input bindings from inputs[r]
// and writes its Input / Output slots to inputs[r] / outputs[r]; a single run is replica 0 on
// p.device, a replicated one runs replica r on device r.
std::vector<std::vector<rt::BufferPtr>> Engine::bind(const Program& p, const std::vector<std::vector<StoragePtr>>& inputs,
                                                     bool replicated) {
  size_t n = inputs.size();
  auto& client = rt::Client::get();
  std::vector<std::vector<rt::BufferPtr>> bufs(n);
  for (auto& b : bufs) b.reserve(p.params.size());
  std::pair<uint32_t, uint32_t> draw{0, 0};
  if (!replicated && p.scalars.size() != p.params.size()) p.scalars.assign(p.params.size(), nullptr);
  for (size_t i = 0; i < p.params.size(); ++i) {
    const Binding& b = p.params[i];
    if (b.kind == Binding::Kind::Rng && b.index == 0) {  // one draw, shared by all replicas
      if (!rng_source_) throw rt::Error("torch_tpu: no device generator");
      auto [seed, offset] = rng_source_(p.device, static_cast<uint64_t>(b.n));
      draw = rng_words(seed, offset);
    }
    for (size_t r = 0; r < n; ++r) {
      int dev = replicated ? static_cast<int>(r) : p.device;
      rt::BufferPtr buf;
      switch (b.kind) {
        case Binding::Kind::Storage:
        case Binding::Kind::Input: {
          bool input = b.kind == Binding::Kind::Input;
          if (input && (b.index < 0 || static_cast<size_t>(b.index) >= inputs[r].size()))
            throw rt::Error("torch_tpu: a program ran with too few tensors");
          Storage& st = input ? *inputs[r][b.index] : *b.st;
          if (replicated && !st.buffer) zero_fill(st);
          buf = st.buffer;
          if (!buf) throw rt::Error("torch_tpu: a program input has no device buffer");
          if (st.device != dev) {  // a replica reads another device's storage: a copy on its own
            std::vector<char> host(static_cast<size_t>(st.elements() * hlo::itemsize(st.dtype)));
            st.buffer->to_host(host.data(), host.size());
            buf = client.from_host(host.data(), pjrt_type(st.dtype), {st.elements()}, dev);
          }
          if (replicated || i >= p.param_bytes.size()) break;
          if (st.elements() * hlo::itemsize(st.dtype) != p.param_bytes[i])
            throw rt::Error("torch_tpu: a tensor the program reads (" +
                            std::string(input ? "input " + std::to_string(b.index) : "a storage") +
                            ") changed its storage size since the program was built (" + std::to_string(p.param_bytes[i]) +
                            " bytes expected, " + std::to_string(st.elements() * hlo::itemsize(st.dtype)) +
                            (st.dynamic() ? ", made dynamic" : "") + ")");
          if (buf->bytes() != p.param_bytes[i])
            throw rt::Error("torch_tpu: internal error: parameter " + std::to_string(i) + " of a program expects " +
                            std::to_string(p.param_bytes[i]) + " bytes, its buffer holds " +
                            std::to_string(buf->bytes()) + " (storage " + std::to_string(st.nbytes) + " bytes" +
                            (st.dynamic() ? ", dynamic, capacity " + std::to_string(st.capacity) : "") + ")");
          break;
        }
        case Binding::Kind::Scalar:
          if (replicated) {
            buf = scalar_buffer(b.v, b.is_int, b.t, dev);
          } else {
            if (!p.scalars[i]) p.scalars[i] = scalar_buffer(b.v, b.is_int, b.t, dev);
            buf = p.scalars[i];
          }
          break;
        case Binding::Kind::Rng:
          buf = scalar_buffer(b.index == 0 ? draw.first : draw.second, true, DType::U32, dev);
          break;
      }
      bufs[r].push_back(std::move(buf));
    }
  }
  return bufs;
}

// Result i of replica r into its slot's storage.
void Engine::bind_results(const Program& p, const std::vector<std::vector<StoragePtr>>& inputs,
                          const std::vector<std::vector<StoragePtr>>& outputs, std::vector<std::vector<rt::BufferPtr>>& outs) {
  auto cw = check_words_.find(p.device);
  for (size_t r = 0; r < outs.size(); ++r)
    for (size_t i = 0; i < p.results.size(); ++i) {
      const Slot& s = p.results[i];
      const StoragePtr* st = &s.st;
      if (s.kind != Slot::Kind::Storage) {
        const auto& v = s.kind == Slot::Kind::Input ? inputs[r] : outputs[r];
        if (s.index < 0 || static_cast<size_t>(s.index) >= v.size())
          throw rt::Error("torch_tpu: a program ran with too few tensors");
        st = &v[s.index];
      }
      (*st)->buffer = std::move(outs[r][i]);
      if (cw != check_words_.end() && *st == cw->second) check_dirty_[p.device] = true;
    }
}

namespace {
std::vector<PJRT_Buffer*> raw(const std::vector<rt::BufferPtr>& bufs) {
  std::vector<PJRT_Buffer*> out;
  out.reserve(bufs.size());
  for (const auto& b : bufs) out.push_back(b->get());
  return out;
}
}  // namespace

void Engine::run_replicated(const Program& p, const std::vector<std::vector<StoragePtr>>& inputs,
                            const std::vector<std::vector<StoragePtr>>& outputs) {
  size_t n = inputs.size();
  if (n == 0 || outputs.size() != n) throw rt::Error("torch_tpu: a replicated program needs inputs and outputs per replica");
  auto keep = bind(p, inputs, true);
  std::vector<std::vector<PJRT_Buffer*>> args;
  for (const auto& k : keep) args.push_back(raw(k));
  auto outs = p.exe->execute_replicated(args);
  metrics.executions++;
  bind_results(p, inputs, outputs, outs);
}

void Engine::run(const Program& p, const std::vector<StoragePtr>& inputs, const std::vector<StoragePtr>& outputs) {
  std::vector<std::vector<StoragePtr>> in{inputs}, out{outputs};
  auto keep = bind(p, in, false);
  // a donated buffer that something else still holds (beyond its storage and `keep`) is kept
  std::vector<int64_t> no_donate;
  for (const auto& [param, result] : p.donations)
    if (keep[0][param].use_count() > 2) no_donate.push_back(param);
  std::vector<std::vector<rt::BufferPtr>> outs{p.exe->execute(p.device, raw(keep[0]), no_donate)};
  metrics.executions++;
  bind_results(p, in, out, outs);
}

}  // namespace tt::engine
