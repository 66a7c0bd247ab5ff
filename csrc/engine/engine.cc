// The engine: per-device graphs, captures, modes, flush, host transfers and the op transaction.
#include "engine/engine.h"
#include "engine/layout.h"
#include "runtime/activity.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace tt::engine {

using hlo::Builder;
using hlo::Type;

std::recursive_mutex& engine_mutex() {
  static std::recursive_mutex m;
  return m;
}

PJRT_Buffer_Type pjrt_type(DType t) {
  switch (t) {
    case DType::Pred: return PJRT_T_PRED;
    case DType::S8: return PJRT_T_S8;
    case DType::S16: return PJRT_T_S16;
    case DType::S32: return PJRT_T_S32;
    case DType::S64: return PJRT_T_S64;
    case DType::U8: return PJRT_T_U8;
    case DType::U16: return PJRT_T_U16;
    case DType::U32: return PJRT_T_U32;
    case DType::U64: return PJRT_T_U64;
    case DType::F16: return PJRT_T_F16;
    case DType::BF16: return PJRT_T_BF16;
    case DType::F32: return PJRT_T_F32;
    case DType::F64: return PJRT_T_F64;
    case DType::C64: return PJRT_T_C64;
    case DType::C128: return PJRT_T_C128;
  }
  return PJRT_T_INVALID;
}

// ---------------------------------------------------------------- Engine
Engine& Engine::get() {
  static Engine* e = new Engine();  // never destroyed: PJRT objects outlive static teardown
  return *e;
}

Graph& Engine::graph(int device) {
  if (Graph* c = capture_graph(device)) return *c;
  auto it = graphs_.find(device);
  // DeferAndFuse: ops from another thread (autograd's device thread running the
  // backward, then the optimizer back on the main thread) start a new graph; the
  // finished part runs while the next one is being recorded.
  if (mode_ == Mode::DeferAndFuse && split_threads_ && it != graphs_.end() && it->second &&
      !it->second->ops.empty() && it->second->owner != std::this_thread::get_id())
    flush(device);
  auto& g = graphs_[device];
  if (!g) g = std::make_unique<Graph>(device);
  return *g;
}

void Engine::begin_capture(int device) {
  auto key = std::make_pair(std::this_thread::get_id(), device);
  if (captures_.count(key)) throw rt::Error("torch_tpu: a capture is already in progress on this thread for tpu:" +
                                            std::to_string(device));
  flush(device);
  auto g = std::make_unique<Graph>(device);
  g->capture = true;
  g->traceable = false;
  captures_[key] = std::move(g);
}

std::unique_ptr<Graph> Engine::end_capture(int device) {
  auto it = captures_.find(std::make_pair(std::this_thread::get_id(), device));
  if (it == captures_.end()) return nullptr;
  std::unique_ptr<Graph> g = std::move(it->second);
  captures_.erase(it);
  g->broken = false;
  return g;
}

Graph* Engine::capture_graph(int device) {
  if (captures_.empty()) return nullptr;
  auto it = captures_.find(std::make_pair(std::this_thread::get_id(), device));
  return it != captures_.end() ? it->second.get() : nullptr;
}

bool Engine::capture_broken() {
  for (auto& [key, g] : captures_)
    if (key.first == std::this_thread::get_id() && g->broken) return true;
  return false;
}

void Engine::clear_capture_break() {
  for (auto& [key, g] : captures_)
    if (key.first == std::this_thread::get_id()) g->broken = false;
}

void Engine::zero_fill(Storage& st) {
  if (st.buffer) return;
  if (!st.typed) {
    st.dtype = DType::U8;
    st.typed = true;
  }
  int64_t nbytes = st.elements() * hlo::itemsize(st.dtype);
  std::vector<char> zeros(static_cast<size_t>(nbytes), 0);
  st.buffer = rt::Client::get().from_host(zeros.data(), pjrt_type(st.dtype), {st.elements()}, st.device);
  metrics.h2d_transfers++;
  metrics.h2d_bytes += nbytes;
}

void Engine::set_mode(Mode m) {
  if (m != mode_) flush_all();
  mode_ = m;
}

void Engine::op_done(int device) {
  metrics.ops++;
  if (capture_graph(device)) return;
  if (mode_ == Mode::DeferAndFuse) {
    auto it = graphs_.find(device);
    if (it != graphs_.end() && it->second && it->second->ops.size() >= fuse_limit_) flush(device);
    return;
  }
  flush(device);
  if (mode_ == Mode::Debug) {
    rt::Client::get().wait_all();
    raise_device_errors(device);
  }
}

void Engine::flush_all() {
  std::vector<int> devs;
  for (auto& kv : graphs_) devs.push_back(kv.first);
  for (auto& kv : captures_)  // this thread's capture breaks, as a flush of it would
    if (kv.first.first == std::this_thread::get_id()) devs.push_back(kv.first.second);
  for (int d : devs) flush(d);
}

void Engine::synchronize() {
  end_epoch();
  flush_all();
  rt::Client::get().wait_all();
  for (auto& [device, dirty] : check_dirty_)
    if (dirty) raise_device_errors(device);
}


void Engine::flush(int device) {
  if (Graph* c = capture_graph(device)) {
    c->broken = true;
    throw CaptureBreak("torch_tpu: this op needs the values of a graph being captured for torch.compile");
  }
  auto it = graphs_.find(device);
  if (it == graphs_.end() || !it->second) return;
  std::unique_ptr<Graph> g = std::move(it->second);
  graphs_.erase(it);
  if (!g->has_stores()) return;
  Program p;
  std::vector<int> out_entries;
  std::vector<Value> values;
  collect_results(*g, p, out_entries, values);
  if (values.empty()) {
    if (g->trace) metrics.trace_exits++;
    return;
  }
  metrics.flushes++;
  rt::activity::Scope scope(rt::activity::Kind::Flush, static_cast<int64_t>(g->ops.size()));
  auto t_start = std::chrono::steady_clock::now();
  struct Timer {
    std::chrono::steady_clock::time_point t0;
    std::atomic<int64_t>& acc;
    ~Timer() {
      acc += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    }
  } timer{t_start, metrics.flush_ns};
  const Trace* t = g->trace.get();
  std::string mismatch;
  if (t && g->ops.size() == t->keys.size() && out_entries == t->outs && p.donations == t->aliases) {
    metrics.trace_hits++;
    metrics.trace_ops += static_cast<int64_t>(g->ops.size());
    if (g->b.dry()) {  // the recorded program, without text
      last_program_ = t->text;
      p.exe = t->exe;
      p.text = t->text;
      set_param_bytes(*g, p);
      run(p);
      return;
    }
    if (g->b.body_text() != t->body) {
      metrics.trace_verify_failures++;
      size_t k = 0;
      while (k + 1 < g->ops.size() && g->sites[k + 1].body_start == t->marks[k + 1] &&
             g->b.body_text().compare(0, t->marks[k + 1], t->body, 0, t->marks[k + 1]) == 0)
        ++k;
      if (std::getenv("TORCH_TPU_VERIFY_DUMP")) {  // debugging aid: both texts
        std::ofstream("/tmp/tt_verify_recorded.txt") << t->body;
        std::ofstream("/tmp/tt_verify_built.txt") << g->b.body_text();
      }
      mismatch = "torch_tpu: trace verify: the program text differs from the recorded trace at op " +
                 std::to_string(k) + " (" + g->ops[k] + "): a rule's text depends on something its trace key misses";
    }
  }
  leave_trace(*g);
  finish(*g, p, values);
  run(p);  // the program built from text: results are right either way
  record_trace(*g, out_entries, p);
  if (!mismatch.empty()) throw rt::Error(mismatch);  // verify mode: a key bug fails loudly
}

namespace {
// Copies the view (sizes, strides, offset in elements of `item` bytes) of `base` into
// `dst` in row-major order: a memcpy per run of contiguous innermost elements.
void copy_strided(void* dst, const char* base, int64_t item, const Shape& sizes, const Shape& strides,
                  int64_t offset) {
  char* out = static_cast<char*>(dst);
  size_t k = sizes.size();
  if (k == 0) {
    std::memcpy(out, base + offset * item, static_cast<size_t>(item));
    return;
  }
  // the innermost dims that are contiguous in memory form one run
  size_t inner = k;
  int64_t run = 1;
  while (inner > 0 && (sizes[inner - 1] == 1 || strides[inner - 1] == run)) {
    run *= sizes[inner - 1];
    --inner;
  }
  size_t run_bytes = static_cast<size_t>(run * item);
  std::vector<int64_t> idx(inner, 0);
  while (true) {
    int64_t at = offset;
    for (size_t d = 0; d < inner; ++d) at += idx[d] * strides[d];
    std::memcpy(out, base + at * item, run_bytes);
    out += run_bytes;
    size_t d = inner;
    while (d > 0) {
      if (++idx[d - 1] < sizes[d - 1]) break;
      idx[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}
}  // namespace

void Engine::read(const View& v, void* dst) {
  int64_t n = hlo::numel(v.sizes);
  if (n == 0) return;
  flush(v.st->device);
  raise_device_errors(v.st->device);  // a failed check comes before the data it may have spoiled
  end_epoch();
  size_t nbytes = static_cast<size_t>(n * hlo::itemsize(v.dtype));
  bool whole = v.st->typed && v.st->dtype == v.dtype && v.offset == 0 && n == v.st->numel() &&
               row_major(v.sizes, v.strides);
  if (!v.st->buffer && whole) {
    std::memset(dst, 0, nbytes);
    return;
  }
  StoragePtr src = v.st;
  if (!whole && v.st->buffer && !v.st->dynamic() && v.st->typed && v.st->dtype == v.dtype &&
      v.st->buffer->bytes() == v.st->nbytes) {
    // a view of a buffer that lies in host memory (the CPU plugin): copy its elements
    if (const void* base = v.st->buffer->host_data()) {
      rt::activity::Scope scope(rt::activity::Kind::ToHost, static_cast<int64_t>(nbytes));
      copy_strided(dst, static_cast<const char*>(base), hlo::itemsize(v.dtype), v.sizes, v.strides, v.offset);
      metrics.d2h_transfers++;
      metrics.d2h_bytes += static_cast<int64_t>(nbytes);
      return;
    }
  }
  if (!whole) {
    // materialise the view into a fresh dense storage first (a dynamic one for a view
    // with dynamic dims, so the copy serves its bucket)
    auto tmp = std::make_shared<Storage>(n * hlo::itemsize(v.dtype), v.st->device);
    tmp->dtype = v.dtype;
    tmp->typed = true;
    View from = dynamic_view(v);
    if (from.has_dynamic_dims()) make_dynamic(tmp, v.sizes, row_major_strides(v.sizes), from.bound);
    Graph& g = graph(v.st->device);
    copy_view(g, v, View{tmp, 0, v.sizes, row_major_strides(v.sizes), v.dtype}, "read (tpu to host)");
    flush(v.st->device);
    src = tmp;
  }
  if (src->dynamic()) {  // its real elements in PyTorch's layout
    std::vector<char> all = host_packed(*src);
    std::memcpy(dst, all.data(), nbytes);
  } else {
    src->buffer->to_host(dst, nbytes);
  }
  metrics.d2h_transfers++;
  metrics.d2h_bytes += static_cast<int64_t>(nbytes);
}

void Engine::copy_view(Graph& g, const View& from_view, const View& to_view, const std::string& name,
                       const std::string& site, bool promote) {
  View from = dynamic_view(from_view), to = dynamic_view(to_view);
  // a copy of a view with dynamic dims into a whole fresh storage (clone, contiguous):
  // the copy is dynamic too
  if (promote && from.has_dynamic_dims() && !to.st->dynamic() && !to.st->buffer && !g.index_.count(to.st.get()) &&
      to.offset == 0 && to.sizes == from.sizes && row_major(to.sizes, to.strides) &&
      hlo::numel(to.sizes) * hlo::itemsize(to.dtype) == to.st->nbytes) {
    if (!to.st->typed) {
      to.st->dtype = to.dtype;
      to.st->typed = true;
    }
    make_dynamic(to.st, to.sizes, to.strides, from.bound);
    to = dynamic_view(to_view);
  }
  Op op{name, site, true, "copy", {from, to}, {}};
  apply(g, op, [&] {
    g.store(to, g.load(from));  // store converts the type and reshapes / broadcasts
    return lower::Reads{};
  });
}

void Engine::apply(Graph& g, Op& op, const std::function<lower::Reads()>& body) {
  struct Current {  // the op whose rule is running (named by the checks it adds)
    const Op*& slot;
    const Op* prev;
    ~Current() { slot = prev; }
  } current{current_op_, current_op_};
  current_op_ = &op;
  struct InOp {  // the op's views share offset parameters (Graph::view_offset) until it ends
    Graph& g;
    bool was;
    std::vector<Graph::OpOffset> outer;
    explicit InOp(Graph& g) : g(g), was(g.in_op_), outer(std::move(g.op_offsets_)) {
      g.in_op_ = true;
      g.op_offsets_.clear();
    }
    ~InOp() {
      g.in_op_ = was;
      g.op_offsets_ = std::move(outer);
    }
  } in_op{g};
  if (op.keyed && trace_on_) {
    KeyBuilder kb{op.key};
    for (const auto& v : op.views) g.key_view(kb, v);
    begin_op(g, &op.key, op.current);
  } else {
    op.key.clear();
    begin_op(g, nullptr);
  }
  auto mark = g.mark();
  lower::Reads reads;
  try {
    reads = body();
  } catch (...) {
    g.rollback(mark);
    throw;
  }
  g.note_op(op.name, op.site, mark.b.body, std::move(op.key), std::move(reads));
}

void Engine::write(const View& v, const void* src) {
  int64_t n = hlo::numel(v.sizes);
  if (n == 0) return;
  auto& client = rt::Client::get();
  int64_t nbytes = n * hlo::itemsize(v.dtype);
  metrics.h2d_transfers++;
  metrics.h2d_bytes += nbytes;
  bool whole = (!v.st->typed || v.st->dtype == v.dtype) && v.offset == 0 &&
               n * hlo::itemsize(v.dtype) == v.st->nbytes && row_major(v.sizes, v.strides);
  if (whole && !capture_graph(v.st->device)) {
    flush(v.st->device);  // pending writes to this storage happen before the upload
    v.st->dtype = v.dtype;
    v.st->typed = true;
    if (v.st->dynamic()) {  // in the storage's layout, at its capacity
      set_packed(*v.st, src);
    } else {
      v.st->buffer = client.from_host(src, pjrt_type(v.dtype), {n}, v.st->device);
    }
    return;
  }
  auto tmp = std::make_shared<Storage>(nbytes, v.st->device);
  tmp->dtype = v.dtype;
  tmp->typed = true;
  tmp->buffer = client.from_host(src, pjrt_type(v.dtype), {n}, v.st->device);
  Graph& g = graph(v.st->device);
  copy_view(g, View{tmp, 0, v.sizes, row_major_strides(v.sizes), v.dtype}, v, "copy_ (host to tpu)");
  op_done(v.st->device);
}

}  // namespace tt::engine
