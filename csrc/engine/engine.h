// Engine: storages, the deferred graph, execution modes, flush, compile cache.
//
// A storage's value is a flat 1-D array of its element type. A tensor (view) is
// (storage, offset, sizes, strides); reading it is a load from the storage's
// current value, writing it is a store that produces the storage's next value.
// Every op adds to the current graph; the mode decides when it is flushed
// (Strict/Debug: after every op). Flushing compiles (or finds) one program
// whose outputs are the storages written and still alive, runs it, and binds
// the results.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/lru.h"
#include "hlo/builder.h"
#include "lowering/lowering.h"
#include "runtime/runtime.h"

namespace tt::engine {

using hlo::DType;
using hlo::Shape;
using hlo::Value;

struct Storage {
  Storage(int64_t nbytes, int device) : nbytes(nbytes), device(device) {}
  int64_t nbytes;
  int device;
  DType dtype = DType::U8;
  bool typed = false;
  rt::BufferPtr buffer;  // the materialised value; null = never written (reads as zeros)
  std::atomic<bool> alive{true};
  // Set when the tensor on this storage was donated to a custom kernel: the
  // message any later use raises.
  std::shared_ptr<const std::string> donated;
  int64_t numel() const { return typed ? nbytes / hlo::itemsize(dtype) : 0; }
  // Bounded dynamism (see DESIGN "Shapes"): a dynamic storage's buffer holds
  // `capacity` elements (its numel() first, in PyTorch's layout, then padding),
  // so programs that read it depend on its bucket, not its size; `sizes` lists
  // the sizes that are dynamic in its views, each with its bound.
  int64_t capacity = 0;
  std::vector<std::pair<int64_t, int64_t>> dyn;  // (size, bound)
  // the tensor it was made dynamic for: its sizes, strides and per dim the bound of a
  // dynamic dim (0: static); views of it take the bounds of the dims they walk
  Shape base_sizes, base_strides, base_bound;
  // The buffer's layout. Padded: the base tensor (row-major, the whole storage) at its bounds,
  // so element (i_0, ..., i_k) lies at sum i_j * (row-major strides of full()) and the base
  // tensor is read and written as the buffer itself (a reshape). Otherwise packed: PyTorch's
  // layout of the real elements first, then padding.
  bool padded = false;
  bool pinned_static = false;  // torch_tpu.mark_static: the size policy leaves it alone
  bool dynamic() const { return !dyn.empty(); }
  Shape full() const {  // the base tensor's shape at its bounds
    Shape f = base_sizes;
    for (size_t i = 0; i < f.size() && i < base_bound.size(); ++i)
      if (base_bound[i] > 0) f[i] = base_bound[i];
    return f;
  }
  int64_t elements() const { return dynamic() ? capacity : numel(); }  // the buffer's length
  int64_t bound_of(int64_t size) const {  // 0: not a dynamic size of this storage
    for (const auto& [s, b] : dyn)
      if (s == size) return b;
    return 0;
  }
};
using StoragePtr = std::shared_ptr<Storage>;

struct View {
  StoragePtr st;
  int64_t offset = 0;  // in elements of dtype
  Shape sizes, strides;
  DType dtype = DType::F32;
  // Bounded dynamism. `runtime` views are read and written with their offset,
  // strides and dynamic sizes as program parameters (the program serves every
  // view of that bucket); bound[i] > 0 makes dim i dynamic: its value is built
  // at bound[i] elements of which sizes[i] are real. Set by Engine::dynamic_view.
  bool runtime = false;
  Shape bound;
  Shape value_shape() const;  // the shape of its value: bound where dynamic, else sizes
  bool has_dynamic_dims() const;
};

enum class Mode { Strict = 0, Debug = 1, DeferAndFuse = 2 };

// How a program parameter gets its buffer when the program runs.
struct Binding {
  enum class Kind : uint8_t { Storage, Input, Scalar, Rng };
  Kind kind = Kind::Scalar;
  StoragePtr st;  // Storage: the storage's buffer
  int index = 0;  // Input: the runtime input's number; Rng: 0 = key, 1 = counter of one draw
  double v = 0;   // Scalar: the value, uploaded as a scalar of type t
  bool is_int = false;
  DType t = DType::F32;
  int64_t n = 0;  // Rng: random words drawn from the device generator per run
};

// Where a program result goes: a storage, or the storage of runtime input or
// output `index` (a compiled graph is built once and bound per call).
struct Slot {
  enum class Kind : uint8_t { Storage, Input, Output };
  Kind kind = Kind::Storage;
  StoragePtr st;
  int index = 0;
};

// A compiled program and how it is bound: every flush builds one, and a
// compiled graph keeps one for all its calls. Engine::run executes it.
struct Program {
  int device = 0;
  rt::ExecutablePtr exe;
  std::shared_ptr<const std::string> text;
  std::vector<Binding> params;
  std::vector<int64_t> param_bytes;  // what each parameter's buffer holds
  std::vector<Slot> results;
  std::vector<std::pair<int, int>> donations;  // (param, result)
  // Buffers of Scalar bindings, made on the first run (a compiled graph runs many times).
  mutable std::vector<rt::BufferPtr> scalars;
};

// A rule's view of the engine while it is applied to a graph (see Graph::apply).
struct Op {
  std::string name;          // "aten::add.Tensor" (names the op in errors)
  std::string site;          // the Python line that issued it, or ""
  // Trace key: `key` followed by each of `views` (storage identity, layout,
  // type); keyed = false for an op the trace cache cannot recognise.
  bool keyed = false;
  std::string key;
  std::vector<View> views;
  std::function<double(int)> current;  // the value a read of argument i would see now (-1: precision)
};

// A long run of compiles between two host reads (a first step at new shapes) shows one
// progress line on stderr: updated in place on a terminal, printed once otherwise.
// TORCH_TPU_COMPILE_PROGRESS=<seconds> sets when it appears (default 5; 0: never).
class CompileProgress {
 public:
  void compiled(int64_t ns);
  void end();  // a host read: the run of compiles is over
 private:
  int64_t programs_ = 0, ns_ = 0, shown_at_ns_ = 0;
  double threshold_s_ = -1;
  bool shown_ = false, tty_ = false;
};

struct Metrics {
  std::atomic<int64_t> compiles{0}, cache_hits{0}, cache_misses{0}, executions{0}, ops{0};
  std::atomic<int64_t> h2d_transfers{0}, h2d_bytes{0}, d2h_transfers{0}, d2h_bytes{0};
  std::atomic<int64_t> flushes{0}, compile_ns{0}, flush_ns{0}, program_bytes{0};
  std::atomic<int64_t> disk_hits{0}, disk_misses{0}, disk_writes{0}, disk_errors{0};
  // traces: flushes run from a recorded trace without program text, ops built
  // dry, traces left before their end, and (verify mode) text mismatches
  std::atomic<int64_t> trace_hits{0}, trace_ops{0}, trace_exits{0}, trace_recorded{0}, trace_verify_failures{0};
  // compiled mode: graphs captured into programs, and runs of those programs
  std::atomic<int64_t> captures{0}, compiled_runs{0};
  // op sequences that kept compiling new programs (warned once each)
  std::atomic<int64_t> frequent_compiles{0};
  // times the caches let go of their executables because the process neared vm.max_map_count
  std::atomic<int64_t> map_releases{0};
  // bounded dynamism: ops built at a bucket, ops with dynamic inputs built at their exact
  // sizes (no bucketed rule), storages made dynamic (padded), and compiles of bucketed programs
  std::atomic<int64_t> dynamic_ops{0}, dynamic_exact_ops{0}, dynamic_conversions{0}, dynamic_compiles{0};
};

// A recorded op sequence: the key of each op (everything its program text
// depends on), the text it produced, and the program its flush compiled. A
// later graph whose ops have the same keys produces the same text, so it is
// built dry (no text) and runs the recorded executable.
struct Trace {
  std::vector<std::string> keys;
  std::vector<lower::Reads> reads;
  std::vector<size_t> marks;  // body offset where op i starts; marks[n] = body size
  std::string body;
  std::vector<int> outs;                     // entries returned, in order
  std::vector<std::pair<int, int>> aliases;  // (param, result) donations
  rt::ExecutablePtr exe;
  std::shared_ptr<const std::string> text;
};

// Builds an op's trace key from its views: each names its storage by the graph
// entry it already has, by its position among this op's other new storages,
// or by what a new entry would be made of.
struct KeyBuilder {
  explicit KeyBuilder(std::string& key) : k(key) {}
  std::string& k;
  std::vector<const Storage*> fresh;
  std::vector<int64_t> new_sizes;  // dynamic sizes this op names that the graph has no parameter for yet
  std::vector<int64_t> offsets;    // the distinct offsets of this op's views (equal offsets share a parameter)
  void add(const void* p, size_t n) { k.append(static_cast<const char*>(p), n); }
  void i64(int64_t x) { add(&x, sizeof x); }
};

// One deferred program on one device.
class Graph {
 public:
  explicit Graph(int device) : device(device), owner(std::this_thread::get_id()) {}
  Value load(const View& v);
  void store(const View& v, Value value);
  Value scalar_param(double v, bool is_int, DType t);
  // Two u32 parameters (generator key, counter base) drawn from the device
  // generator each time the program runs (n words per run).
  std::pair<Value, Value> rng_param(int64_t n);
  bool has_stores() const { return stores_ > 0; }
  // the bounds of the dynamic dims its views were read or written at (programs per bucket)
  std::vector<int64_t> buckets;
  // Capture (compiled graphs): storage st stands for the storage of runtime
  // input or output `index` of a program built once and run many times.
  void bind_external(const StoragePtr& st, Slot::Kind kind, int index);
  bool capture = false;  // a capture graph: never flushed, built into a Program
  bool broken = false;   // a capture whose op needed its values (see Engine::capture_broken)
  struct Mark {
    hlo::Builder::Mark b;
    size_t entries = 0, params = 0, ops = 0;
    int stores = 0;
    size_t rng_param = SIZE_MAX;
    Value rng_key, rng_counter;
  };
  Mark mark() const {
    return Mark{b.mark(), entries_.size(), params_.size(), ops.size(), stores_, rng_.param, rng_.key, rng_.counter};
  }
  void rollback(const Mark& m);
  // Records an op of this graph: its name, the Python line that issued it (or
  // ""), and where its text starts (a Builder::mark taken before it was lowered).
  // `key` and `reads`: the op's trace key (see Engine::begin_op) and the numbers its rule read.
  void note_op(const std::string& name, const std::string& site = "", size_t body_start = SIZE_MAX,
               std::string key = "", lower::Reads reads = {}) {
    ops.push_back(name);
    sites.push_back({site, body_start == SIZE_MAX ? b.mark().body : body_start});
    keys.push_back(std::move(key));
    this->reads.push_back(std::move(reads));
  }
  // Appends view v (storage identity, layout, type) to an op's key.
  void key_view(KeyBuilder& kb, const View& v) const;
  // The op whose text holds line `line` of the module text, or -1.
  int op_at_line(int line) const;

  hlo::Builder b;
  int device;
  std::thread::id owner;  // the thread that issued its first op
  std::vector<std::string> ops;
  struct Site {
    std::string where;
    size_t body_start;
  };
  std::vector<Site> sites;
  std::vector<std::string> keys;
  std::vector<lower::Reads> reads;
  bool traceable = true;               // every op so far has a key
  std::shared_ptr<const Trace> trace;  // the recorded trace every op so far matched

 private:
  friend class Engine;
  struct Entry {
    StoragePtr st;
    Value cur;
    int param = -1;  // program parameter index of the storage's incoming buffer
    bool written = false;
    // The last store through run-time geometry, while no other store followed it: a later
    // op's load of the same view takes this value (no gather of what the scatter just wrote).
    struct {
      View view;
      Value value;
      size_t op = 0;  // the op that stored it
      bool valid = false;
    } last;
  };
  // Whether a load of runtime view v takes the value an earlier op of this graph stored
  // through the same view (decided by the state at the op's start, so it is part of its key).
  bool forwards(const View& v) const;
  Value flat(const StoragePtr& st, DType as);
  Value offset_param(int64_t offset);  // a view's offset, as an s64 parameter
  // A view's offset inside an op: views of one op at the same offset read one parameter, so
  // that XLA sees a slice loaded and stored back at the same place and updates it in place
  // (which offsets are equal is part of the op's key, see key_view).
  Value view_offset(const View& v);
  struct OpOffset {
    int64_t offset;
    Value v;
  };
  std::vector<OpOffset> op_offsets_;
  bool in_op_ = false;  // between Engine::apply's start and end of an op
  // The s32 parameter of a dynamic size n: one per distinct size in a graph (XLA's dynamic
  // padder then knows dims of equal size as equal, and masks each once). Which sizes are
  // equal is part of each op's key (see key_view).
  Value size_param(int64_t n);
  struct SizeParam {
    int64_t n;
    Value v;
    size_t param;  // its index among the graph's parameters
  };
  std::vector<SizeParam> size_params_;
  Value load_runtime(const View& v);
  void store_runtime(const View& v, Value value);
  Value runtime_positions(const View& v, const Shape& shape);
  char access(const View& v, const Shape& vs) const;
  void finish_store(const View& v, Value value, Value next, bool forward);
  std::vector<Entry> entries_;
  std::unordered_map<Storage*, int> index_;
  std::vector<Binding> params_;  // per program parameter
  std::unordered_map<const Storage*, Slot> external_;
  struct {
    size_t param = SIZE_MAX;  // the key's parameter; the counter's follows it
    Value key, counter;
  } rng_;                     // the program's random draw (see rng_param)
  int stores_ = 0;
};

class Engine {
 public:
  static Engine& get();

  Graph& graph(int device);
  // Capture: the ops issued for `device` until end_capture go into a graph
  // that is never run; end_capture returns it (Engine::build makes it a
  // Program bound to runtime inputs and outputs). Whatever would flush it (a
  // host read, the CPU fallback) throws CaptureBreak instead and sets
  // capture_broken(), after which the capture should be rolled back to a mark.
  // A capture belongs to the thread that began it: other threads' ops on the
  // same device meanwhile run (or fuse) as usual, outside it.
  void begin_capture(int device);
  std::unique_ptr<Graph> end_capture(int device);
  Graph* capture_graph(int device);
  bool capture_broken();
  void clear_capture_break();
  // Gives a storage that was never written (it reads as zeros) a zero buffer.
  void zero_fill(Storage& st);

  // Called after each op: flushes in Strict and Debug modes (Debug also waits).
  void op_done(int device);
  void flush(int device);
  void flush_all();

  // The op transaction: runs `body` (loads, the rule, stores) as the next op of
  // g. It keys the op for the trace cache, marks the graph, rolls it back if
  // body throws, and records the op with the numbers its rule read (body's
  // result). Every op of every front end goes through here.
  void apply(Graph& g, Op& op, const std::function<lower::Reads()>& body);
  // A standalone graph (not a device's current one) as a program: its results
  // are its written entries; compiled or taken from the cache. Not run.
  Program build(Graph& g);
  // Executes p: parameters from their bindings (`inputs` for Input bindings),
  // each result bound to its slot's storage (`inputs` / `outputs` for theirs).
  void run(const Program& p, const std::vector<StoragePtr>& inputs = {}, const std::vector<StoragePtr>& outputs = {});
  // Replicated programs (in-program collectives across devices): g (a capture)
  // becomes one program for `replicas` replicas on devices 0..replicas-1, compiled
  // with Client::compile_replicated (no donation, not cached; it may write only its
  // runtime inputs and outputs). run_replicated binds replica r's Input / Output
  // slots to inputs[r] / outputs[r] (storages on device r); storages the program
  // reads directly are copied to each replica's device, and a random draw is
  // shared by all replicas.
  Program build_replicated(Graph& g, int replicas);
  void run_replicated(const Program& p, const std::vector<std::vector<StoragePtr>>& inputs,
                      const std::vector<std::vector<StoragePtr>>& outputs);
  // Draws n words from device d's generator: (seed, offset before). Set by the
  // PyTorch layer, which owns the generators.
  using RngSource = std::function<std::pair<uint64_t, uint64_t>(int, uint64_t)>;
  void set_rng_source(RngSource f) { rng_source_ = std::move(f); }
  // ---- bounded dynamism (DESIGN.md, "Shapes")
  // The bound a dynamic size n is built at: the first ladder step >= n (powers of two
  // from 2 to 1024, then steps of 1.25x rounded up to a multiple of 128, by default:
  // a padded dim holds at most twice its elements).
  int64_t bucket(int64_t n) const;
  // Explicit steps (ascending), then `growth` x the last, rounded up to a multiple of `align`.
  void set_buckets(std::vector<int64_t> steps, double growth, int64_t align);
  const std::vector<int64_t>& bucket_steps() const { return steps_; }
  // v read and written through run-time geometry, with its dims of a dynamic size of its
  // storage dynamic; v itself for a storage of fixed size.
  View dynamic_view(const View& v) const;
  // Makes st dynamic: a buffer of `capacity` elements (at least its size) and `sizes`
  // (size, bound) added to its dynamic sizes. A storage that holds values is padded
  // through host memory (a copy, no program to compile).
  void make_dynamic(const StoragePtr& st, int64_t capacity, const std::vector<std::pair<int64_t, int64_t>>& sizes);
  // Makes a dynamic st static again (its buffer cut to numel() through host memory, no program):
  // a compiled program captured with a static input reads it in place.
  void make_static(const StoragePtr& st);
  // The storage's real elements in PyTorch's layout (numel() of them), read from its buffer
  // (which must exist; no flush), and the reverse: a new buffer in the storage's layout.
  std::vector<char> host_packed(const Storage& st);
  void set_packed(Storage& st, const void* packed);
  // make_dynamic for the dense tensor (sizes, strides) at offset 0, with per-dim bounds
  // `bound` (0: static)
  void make_dynamic(const StoragePtr& st, const Shape& sizes, const Shape& strides, const Shape& bound);
  // The policy that makes a size dynamic: `site` names a size of a call (its signature with
  // that size left out). A site turns dynamic when the last epoch in which it was seen had
  // other sizes there and not this one, and stays dynamic; an epoch ends at each host read
  // or synchronize, so sizes that alternate within a step (layers of different widths) never
  // count, and a sequence length that grows step by step, or a batch that differs from the
  // last step's, does from its second value. Off: TORCH_TPU_DYNAMIC=0.
  bool size_changed(const std::string& site, int64_t size);
  // counts the sites that turned dynamic: a decision taken before (a signature whose sizes
  // stayed static) is taken again when it moved
  int64_t site_generation() const { return site_generation_; }
  // st is read or written by a graph not yet run: its device's current graph or a capture
  bool pending(const StoragePtr& st) const {
    auto g = graphs_.find(st->device);
    if (g != graphs_.end() && g->second && g->second->index_.count(st.get())) return true;
    for (const auto& [key, c] : captures_)
      if (c && (c->index_.count(st.get()) || c->external_.count(st.get()))) return true;
    return false;
  }
  void end_epoch() {
    ++epoch_;
    progress_.end();
  }
  bool dynamism() const { return dynamism_; }
  // compiled programs with dynamic dims, by their bounds ("16", "16,64")
  std::map<std::string, int64_t> programs_per_bucket() const { return programs_per_bucket_; }
  void reset_programs_per_bucket() { programs_per_bucket_.clear(); }
  void set_dynamism(bool on) { dynamism_ = on; }

  // Where the engine's warnings go (the PyTorch layer makes them Python warnings).
  void set_warn(std::function<void(const std::string&)> f) { warn_ = std::move(f); }
  // One op sequence compiling this many different programs gets a warning.
  static constexpr int kFrequentCompiles = 10;
  void reset_compile_counts() { compiles_by_ops_.clear(); }
  // (key, counter) parameter values for a draw of (seed, offset).
  static std::pair<uint32_t, uint32_t> rng_words(uint64_t seed, uint64_t offset) {
    return {static_cast<uint32_t>(seed ^ (seed >> 32) ^ 0x5bd1e995u), static_cast<uint32_t>(offset)};
  }

  // Called before op number g.ops.size() touches g. `key` names everything the
  // op's text depends on apart from the numbers its rule reads, which
  // `current(arg)` supplies (arg -1: the precision mode); nullptr = an op
  // without a key (the graph is then not recorded). The graph follows a
  // recorded trace while its ops match one (built dry), and gets the trace's
  // text when it stops matching.
  using CurrentFn = std::function<double(int)>;
  void begin_op(Graph& g, const std::string* key, const CurrentFn& current = {});
  bool tracing() const { return trace_on_; }
  void set_tracing(bool on) { trace_on_ = on; }
  // Verify mode: graphs matching a trace are built with text anyway, and the
  // text is compared with the trace's at the flush (trace_verify_failures).
  void set_trace_verify(bool on) { trace_verify_ = on; }
  bool trace_verify() const { return trace_verify_; }
  size_t trace_count() const {
    size_t n = 0;
    traces_.for_each([&](const std::string&, const auto& bucket) { n += bucket.size(); });
    return n;
  }
  void clear_traces() { traces_.clear(); }
  void synchronize();  // flush everything and wait for all runs, then raise device check errors

  // Device-side checks (see lower::Env::check): each device has an error word
  // (s64[2]: check id, offending value) that programs with checks read and
  // update; host synchronisations (read, synchronize, Debug mode after each op)
  // look at it when a program has written it since, reset it and throw
  // DeviceCheckError for the first failed check.
  void add_check(Graph& g, Value bad, Value value, bool index_error, const std::string& message);
  void raise_device_errors(int device);
  void set_device_checks(bool on) { checks_on_ = on; }
  bool device_checks() const { return checks_on_; }
  // Names the Python line of an op that adds a check (set by the PyTorch layer).
  void set_site_source(std::function<std::string()> f) { site_source_ = std::move(f); }

  // Adds "to = from" (converted to to's type, reshaped or broadcast) to g as op `name`.
  // promote: a whole fresh `to` (clone, contiguous) of a view with dynamic dims becomes dynamic too.
  void copy_view(Graph& g, const View& from, const View& to, const std::string& name, const std::string& site = "",
                 bool promote = false);
  // Host transfers of a view's elements, as a dense row-major block.
  void read(const View& v, void* dst);
  void write(const View& v, const void* src);

  Mode mode() const { return mode_; }
  void set_mode(Mode m);
  lower::Precision precision() const { return precision_; }
  void set_precision(lower::Precision p) { precision_ = p; }

  // DeferAndFuse starts a new graph when ops come from another thread (default on:
  // a training step's forward runs while autograd records the backward); off
  // keeps one graph across threads (fewer buffers: saved activations never materialize).
  void set_split_on_thread_switch(bool on) { split_threads_ = on; }
  bool split_on_thread_switch() const { return split_threads_; }
  // DeferAndFuse flushes a graph once it holds this many ops.
  void set_fuse_limit(size_t n) { fuse_limit_ = n ? n : 1; }
  size_t fuse_limit() const { return fuse_limit_; }

  Metrics metrics;
  size_t cache_size() const { return cache_.size(); }
  void clear_cache() { cache_.clear(); }
  // Persistent compile cache: serialized executables under `dir` ("" = off),
  // keyed by program text, compile options, plugin platform and version.
  void set_cache_dir(const std::string& dir) { cache_dir_ = dir; }
  const std::string& cache_dir() const { return cache_dir_; }
  // Program text -> executable through the memory and disk caches (throws rt::Error).
  rt::ExecutablePtr compile(const std::string& text);
  // The StableHLO text of the last flushed program (debugging aid).
  const std::string& last_program() const { return *last_program_; }

 private:
  Engine() = default;
  static std::string describe_failure(const Graph& g, const std::string& what);
  // Program parameters and results for run / run_replicated (see Engine::bind in program.cc).
  std::vector<std::vector<rt::BufferPtr>> bind(const Program& p, const std::vector<std::vector<StoragePtr>>& inputs,
                                               bool replicated);
  void bind_results(const Program& p, const std::vector<std::vector<StoragePtr>>& inputs,
                    const std::vector<std::vector<StoragePtr>>& outputs, std::vector<std::vector<rt::BufferPtr>>& outs);
  rt::BufferPtr scalar_buffer(double v, bool is_int, DType t, int device);
  std::map<int, std::unique_ptr<Graph>> graphs_;
  std::map<std::pair<std::thread::id, int>, std::unique_ptr<Graph>> captures_;  // (thread, device)
  Lru<std::string, rt::ExecutablePtr> cache_{8192};  // program text -> executable
  Lru<std::string, rt::BufferPtr> scalars_{4096};    // scalar parameter buffers by value, type, device
  Mode mode_ = Mode::Strict;
  size_t fuse_limit_ = 4096;
  bool split_threads_ = true;
  lower::Precision precision_ = lower::Precision::DEFAULT;
  std::shared_ptr<const std::string> last_program_ = std::make_shared<const std::string>();
  std::string cache_dir_;
  RngSource rng_source_;
  struct CheckSite {
    std::string op, site, message;
    bool index_error = false;
  };
  bool checks_on_ = true;
  std::vector<CheckSite> check_sites_;          // check id - 1 -> where and what
  std::map<std::string, int64_t> check_ids_;    // op + site + message -> id
  std::map<int, StoragePtr> check_words_;       // per device
  std::map<int, bool> check_dirty_;             // a program wrote the word since it was read
  const Op* current_op_ = nullptr;              // the op Engine::apply is running
  std::function<std::string()> site_source_;
  StoragePtr check_word(int device);
  std::function<void(const std::string&)> warn_;
  Lru<std::string, int> compiles_by_ops_{4096};  // programs compiled per op sequence
  void note_compile(const Graph& g, const std::vector<Value>& results);
  // The results of g (written, live entries) and their donations into p; the
  // entries they come from into `entries` and their values into `values`.
  void collect_results(Graph& g, Program& p, std::vector<int>& entries, std::vector<Value>& values);
  // Program text of g returning `values`, compiled (or from the caches) into p.
  void finish(Graph& g, Program& p, const std::vector<Value>& values);
  void leave_trace(Graph& g);
  static void set_param_bytes(const Graph& g, Program& p);
  void record_trace(Graph& g, const std::vector<int>& outs, const Program& p);
  // by first key, at most 8 per key (most recent first): at most 4096 traces
  Lru<std::string, std::vector<std::shared_ptr<const Trace>>> traces_{512};
  bool trace_on_ = true, trace_verify_ = false;
  std::vector<int64_t> steps_ = {2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  double growth_ = 1.25;
  int64_t align_ = 128;
  bool dynamism_ = true;
  int64_t epoch_ = 0;
  CompileProgress progress_;
  void note_compile(std::chrono::steady_clock::time_point t0);  // metrics and progress
  int64_t site_generation_ = 0;
  struct SiteSizes {
    int64_t epoch = -1;
    std::vector<int64_t> cur, prev;
    bool dynamic = false;  // it changed once: dynamic from then on (as Dynamo's automatic dynamic)
  };
  Lru<std::string, SiteSizes> sites_{65536};
  std::map<std::string, int64_t> programs_per_bucket_;
  // sizes made dynamic lately (-> bound, epoch): a split of a dynamic dim ([L*B] viewed as
  // [L, B]) is dynamic in the factor that is one of them
  Lru<int64_t, std::pair<int64_t, int64_t>> live_{4096};
  int64_t live_bound(int64_t size) const;
  void record_sizes(Storage& st, const std::vector<std::pair<int64_t, int64_t>>& sizes);
  rt::ExecutablePtr disk_load(const std::string& text);
  void relieve_map_pressure();
  int loads_since_map_check_ = 0;
  void disk_store(const std::string& text, const rt::Executable& exe);
};

// A device-side check failed (an index out of range, ...): the exception the
// user sees is an IndexError (index_error) or a RuntimeError.
class DeviceCheckError : public rt::Error {
 public:
  DeviceCheckError(const std::string& msg, bool index_error) : rt::Error(msg), index_error(index_error) {}
  bool index_error;
};

// Thrown where a capture graph would have to run (see Engine::begin_capture).
class CaptureBreak : public rt::Error {
 public:
  using rt::Error::Error;
};

PJRT_Buffer_Type pjrt_type(DType t);

// The engine's lock: every op, transfer and flush holds it (autograd runs
// backward ops on its own thread).
std::recursive_mutex& engine_mutex();

}  // namespace tt::engine
