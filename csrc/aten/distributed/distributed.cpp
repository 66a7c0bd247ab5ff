// The c10d backend for tpu tensors ("tpu_dist", also "tpu"), v1: host staging.
//
// A collective call on this backend:
//  1. the ranks agree on the call: each contributes a fixed-size fingerprint
//     (op, dtype, element counts, root, reduce op, call number) to one small
//     all-gather, so ranks that disagree all raise a clear error instead of
//     aborting inside gloo (it terminates the process on a size mismatch) or
//     hanging; a rank that never arrives makes the others fail at the timeout;
//  2. the inputs are read into host tensors (the fused graph is flushed first);
//  3. a ProcessGroupGloo this backend owns runs the collective on them;
//  4. a completion thread waits for gloo, writes the results back into the tpu
//     tensors in place, then completes the Work and its future. Collectives
//     complete in the order they were issued; a call whose tensors an earlier,
//     unfinished call writes waits for it first (one in-order queue, as a
//     NCCL communicator's stream).
// Point-to-point messages carry a small header (dtype, element count) sent ahead
// of the data, so a receiver whose tensor does not match raises instead of
// letting gloo abort.
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "aten/distributed/nogil.h"
#include "aten/tpu.h"

namespace py = pybind11;

namespace tt::aten {
namespace {

using c10d::OpType;
using c10d::ReduceOp;
using engine::Engine;
using GlooWork = c10::intrusive_ptr<c10d::Work>;

constexpr const char* kName = "tpu_dist";


// Where every collective starts: the GIL released while it waits (before the lock, so a thread
// holding the lock can take the GIL), then one call at a time through agreement and issue (the
// same order on every rank's side of gloo).
struct Issuing {
  NoGil nogil;
  std::lock_guard<std::mutex> lock;
  explicit Issuing(std::mutex& m) : lock(m) {}
};

const char* reduce_name(ReduceOp::RedOpType op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
    case ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

// ---------------------------------------------------------------- Work
class TpuWork final : public c10d::Work {
 public:
  TpuWork(int rank, OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())) {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  int sourceRank() const override {
    TORCH_CHECK(source_ >= 0, kName, ": sourceRank() is only known for a completed recv from any source");
    return source_;
  }
  // Completes the work's future (error or not), then the work.
  // The future goes first, as ProcessGroupGloo's works do: whoever wait() wakes
  // may read getFuture()->value() at once.
  void done(std::exception_ptr err) {
    if (err)
      future_->setError(err);
    else
      future_->markCompleted(c10::IValue(outputs_));
    finish(err);
  }
  std::atomic<int> source_{-1};

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};
using WorkPtr = c10::intrusive_ptr<TpuWork>;

// ---------------------------------------------------------------- completion thread
// Runs jobs one after another on its own thread.
class Lane {
 public:
  Lane() : thread_([this] { loop(); }) {}
  ~Lane() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void push(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> l(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, queue drained
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

// ---------------------------------------------------------------- host staging
void check_tensor(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), kName, ": ", op, " got an undefined tensor");
  TORCH_CHECK(t.device().type() == kTpu, kName, ": ", op, " got a tensor on ", t.device(),
              "; this backend takes tpu tensors (for CPU tensors use a gloo group, e.g. "
              "init_process_group(\"cpu:gloo,tpu:tpu_dist\"))");
  TORCH_CHECK(t.layout() == at::kStrided, kName, ": ", op, " supports dense tensors only, got layout ", t.layout());
}

void check_all(const char* op, const std::vector<at::Tensor>& ts) {
  for (auto& t : ts) check_tensor(op, t);
}

at::Tensor host_like(const at::Tensor& t) { return at::empty(t.sizes(), t.options().device(at::kCPU)); }

// Host copies of tpu tensors' values (the fused graph flushed first).
std::vector<at::Tensor> read_to_host(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> resolved;
  for (auto& t : ts) resolved.push_back(t.is_conj() || t.is_neg() ? t.resolve_conj().resolve_neg() : t);
  std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
  auto& eng = Engine::get();
  eng.flush_all();
  std::vector<at::Tensor> out;
  for (auto& t : resolved) {
    at::Tensor h = host_like(t);
    if (t.numel() > 0) eng.read(view_of(t), h.data_ptr());
    out.push_back(h);
  }
  return out;
}

std::vector<at::Tensor> hosts_like(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (auto& t : ts) out.push_back(host_like(t));
  return out;
}

int64_t total_numel(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (auto& t : ts) n += t.numel();
  return n;
}

c10::ScalarType common_dtype(const char* op, const std::vector<at::Tensor>& ts) {
  TORCH_CHECK(!ts.empty(), kName, ": ", op, " got no tensors");
  for (auto& t : ts)
    TORCH_CHECK(t.scalar_type() == ts[0].scalar_type(), kName, ": ", op, " needs tensors of one dtype, got ",
                ts[0].scalar_type(), " and ", t.scalar_type());
  return ts[0].scalar_type();
}

// How a reduce op runs on gloo: gloo has no AVG or PREMUL_SUM, so AVG is SUM
// followed by a division by the group size and PREMUL_SUM scales the inputs first.
struct Reduction {
  ReduceOp gloo_op{ReduceOp::SUM};
  bool average = false;
  std::optional<double> premul;
};

Reduction reduction(const char* op, const ReduceOp& r, c10::ScalarType t) {
  bool floating = at::isFloatingType(t) || at::isComplexType(t);
  Reduction out;
  switch (r.op_) {
    case ReduceOp::SUM:
    case ReduceOp::PRODUCT:
    case ReduceOp::MIN:
    case ReduceOp::MAX:
      out.gloo_op = ReduceOp(r.op_);
      return out;
    case ReduceOp::AVG:
      TORCH_CHECK(floating, kName, ": ", op, " with ReduceOp.AVG needs a floating-point tensor, got ", t);
      out.average = true;
      return out;
    case ReduceOp::PREMUL_SUM: {
      TORCH_CHECK(floating, kName, ": ", op, " with ReduceOp.PREMUL_SUM needs a floating-point tensor, got ", t);
      TORCH_CHECK(r.supplement_, kName, ": ", op, ": PREMUL_SUM without its factor");
      auto* s = static_cast<c10d::PreMulSumSupplement*>(r.supplement_.get());
      out.premul = s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
      return out;
    }
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      TORCH_CHECK(at::isIntegralType(t, /*includeBool=*/true), kName, ": ", op, " with ReduceOp.", reduce_name(r.op_),
                  " needs an integer or bool tensor, got ", t);
      out.gloo_op = ReduceOp(r.op_);
      return out;
    default:
      TORCH_CHECK(false, kName, ": ", op, " does not support reduce op ", reduce_name(r.op_), " (",
                  static_cast<int>(r.op_), ")");
  }
}

// ---------------------------------------------------------------- fingerprints
// What every rank must agree on before a collective moves data. Fixed length per
// group (kHead + 2 * size), so the exchange itself can never mismatch.
enum Field { kMagic, kOp, kDtype, kCount, kTensors, kRoot, kReduce, kCall, kHead };
constexpr int64_t kMagicValue = 0x7470755f64697374;  // "tpu_dist"

std::string describe_row(const int64_t* f, const char* name) {
  std::ostringstream s;
  s << name << "(dtype " << c10::toString(static_cast<c10::ScalarType>(f[kDtype])) << ", " << f[kCount]
    << " elements";
  if (f[kTensors] != 1) s << " in " << f[kTensors] << " tensors";
  if (f[kRoot] >= 0) s << ", root " << f[kRoot];
  if (f[kReduce] >= 0) s << ", " << reduce_name(static_cast<ReduceOp::RedOpType>(f[kReduce]));
  s << ", call #" << f[kCall] << ")";
  return s.str();
}

// A collective cannot be part of a torch.compile capture (it moves data between
// processes): on a capturing device this ends the capture with a capture break,
// so the node runs between programs, before any rank has communicated.
void not_in_capture(int device) {
  std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
  auto& eng = Engine::get();
  if (!eng.capture_graph(device) || spmd_capture_device() == device) return;
  try {
    eng.flush(device);  // throws CaptureBreak and marks the capture broken
  } catch (const rt::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// ---------------------------------------------------------------- the backend
class TpuBackend final : public c10d::Backend {
 public:
  TpuBackend(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size, bool checks,
             std::chrono::milliseconds timeout)
      : c10d::Backend(rank, size), gloo_(std::move(gloo)), checks_(checks), timeout_(timeout) {
    TORCH_CHECK(gloo_, kName, ": needs a gloo backend");
    TORCH_CHECK(gloo_->getRank() == rank && gloo_->getSize() == size, kName, ": the gloo backend's rank/size (",
                gloo_->getRank(), "/", gloo_->getSize(), ") differ from ", rank, "/", size);
    init();
  }
  ~TpuBackend() override = default;  // the lanes drain their queues and join

  const std::string getBackendName() const override { return kName; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return c10::make_intrusive<Options>(kName, timeout_); }
  void setTimeout(std::chrono::milliseconds timeout) override {
    timeout_ = timeout;
    gloo_->setTimeout(timeout);
  }
  void setSequenceNumberForGroup() override { gloo_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return gloo_->getSequenceNumberForGroup(); }
  // Coalescing (NCCL style): the calls between start and end run as they come;
  // endCoalescing's Work completes when all of them have.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override {
    std::lock_guard<std::mutex> l(inflight_mu_);
    coalescing_ = true;
    coalesced_.clear();
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    std::vector<WorkPtr> works;
    {
      std::lock_guard<std::mutex> l(inflight_mu_);
      coalescing_ = false;
      works.swap(coalesced_);
    }
    std::vector<at::Tensor> outputs;
    c10::List<c10::intrusive_ptr<c10::ivalue::Future>> futures(c10::FutureType::create(c10::ListType::ofTensors()));
    for (auto& w : works) {
      for (auto& t : w->result()) outputs.push_back(t);
      futures.push_back(w->getFuture());
    }
    auto all = c10::make_intrusive<TpuWork>(rank_, OpType::COALESCED, outputs);
    if (works.empty()) {
      all->done(nullptr);
      return all;
    }
    c10::collectAll(futures)->addCallback([all, works](c10::ivalue::Future&) {
      std::exception_ptr err;
      for (auto& w : works)
        if (!err && w->exception()) err = w->exception();
      all->done(err);
    });
    return all;
  }

  void shutdown() override {
    closed_ = true;
    gloo_->shutdown();
  }
  void abort() override {
    closed_ = true;
    gloo_->abort();
  }

  // ------------------------------------------------------------ collectives
  // gather's outputs / scatter's inputs: one list of size_ tensors on the root, none elsewhere.
  std::vector<at::Tensor> root_list(const char* op, std::vector<std::vector<at::Tensor>>& lists, bool is_root,
                                    const char* what) {
    if (is_root) {
      TORCH_CHECK(lists.size() == 1 && static_cast<int>(lists[0].size()) == size_, kName, ": ", op,
                  ": the root needs one ", what, " list of ", size_, " tensors");
      return lists[0];
    }
    TORCH_CHECK(lists.empty() || (lists.size() == 1 && lists[0].empty()), kName, ": ", op, ": only the root passes ",
                what, " tensors");
    return {};
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    const char* op = "broadcast";
    Issuing issuing(issue_mu_);
    begin(op, tensors);
    auto dtype = common_dtype(op, tensors);
    int64_t root = opts.rootRank * static_cast<int64_t>(tensors.size()) + opts.rootTensor;
    agree(op, OpType::BROADCAST, dtype, total_numel(tensors), tensors.size(), root, -1);
    bool is_root = opts.rootRank == rank_;
    auto host = is_root ? read_to_host(tensors) : hosts_like(tensors);
    Job job;
    job.gloo.push_back(gloo_->broadcast(host, opts));
    if (!is_root) job.write(tensors, host);
    return submit(OpType::BROADCAST, tensors, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    const char* op = "allreduce";
    Issuing issuing(issue_mu_);
    begin(op, tensors);
    auto dtype = common_dtype(op, tensors);
    auto red = reduction(op, opts.reduceOp, dtype);
    agree(op, OpType::ALLREDUCE, dtype, total_numel(tensors), tensors.size(), -1, opts.reduceOp.op_);
    auto host = read_to_host(tensors);
    premultiply(host, red);
    c10d::AllreduceOptions o = opts;
    o.reduceOp = red.gloo_op;
    Job job;
    job.gloo.push_back(gloo_->allreduce(host, o));
    job.write(tensors, host);
    average_after(job, host, red);
    return submit(OpType::ALLREDUCE, tensors, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    const char* op = "allreduce_coalesced";
    Issuing issuing(issue_mu_);
    begin(op, tensors);
    auto dtype = common_dtype(op, tensors);
    auto red = reduction(op, opts.reduceOp, dtype);
    agree(op, OpType::ALLREDUCE_COALESCED, dtype, total_numel(tensors), tensors.size(), -1, opts.reduceOp.op_);
    // one flat host buffer: one gloo allreduce for all the tensors
    auto host = read_to_host(tensors);
    std::vector<at::Tensor> flat_parts;
    for (auto& h : host) flat_parts.push_back(h.reshape({-1}));
    std::vector<at::Tensor> flat{at::cat(flat_parts)};
    premultiply(flat, red);
    c10d::AllreduceOptions o;
    o.reduceOp = red.gloo_op;
    o.timeout = opts.timeout;
    Job job;
    job.gloo.push_back(gloo_->allreduce(flat, o));
    average_after(job, flat, red);
    int64_t off = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      int64_t n = tensors[i].numel();
      job.writes.emplace_back(tensors[i], flat[0].narrow(0, off, n).view(tensors[i].sizes()));
      off += n;
    }
    return submit(OpType::ALLREDUCE_COALESCED, tensors, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    const char* op = "reduce";
    Issuing issuing(issue_mu_);
    begin(op, tensors);
    auto dtype = common_dtype(op, tensors);
    auto red = reduction(op, opts.reduceOp, dtype);
    int64_t root = opts.rootRank * static_cast<int64_t>(tensors.size()) + opts.rootTensor;
    agree(op, OpType::REDUCE, dtype, total_numel(tensors), tensors.size(), root, opts.reduceOp.op_);
    auto host = read_to_host(tensors);
    premultiply(host, red);
    c10d::ReduceOptions o = opts;
    o.reduceOp = red.gloo_op;
    Job job;
    job.gloo.push_back(gloo_->reduce(host, o));
    if (opts.rootRank == rank_) {
      job.write(tensors, host);
      average_after(job, host, red);
    }
    return submit(OpType::REDUCE, tensors, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override {
    const char* op = "allgather";
    Issuing issuing(issue_mu_);
    TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, kName, ": ", op,
                " takes one input tensor and one output list per process");
    auto outs = outputs[0];
    begin(op, inputs, outs);
    TORCH_CHECK(static_cast<int>(outs.size()) == size_, kName, ": ", op, ": the output list has ", outs.size(),
                " tensors for a group of ", size_);
    auto dtype = common_dtype(op, inputs);
    for (auto& o : outs)
      TORCH_CHECK(o.numel() == inputs[0].numel() && o.scalar_type() == dtype, kName, ": ", op,
                  ": each output must have the input's dtype and number of elements (", dtype, ", ",
                  inputs[0].numel(), "), got ", o.scalar_type(), ", ", o.numel());
    agree(op, OpType::ALLGATHER, dtype, inputs[0].numel(), 1, -1, -1);
    auto host_in = read_to_host(inputs);
    std::vector<std::vector<at::Tensor>> host_out{hosts_like(outs)};
    Job job;
    job.gloo.push_back(gloo_->allgather(host_out, host_in, opts));
    job.write(outs, host_out[0]);
    return submit(OpType::ALLGATHER, outs, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    const char* op = "all_gather_into_tensor";
    Issuing issuing(issue_mu_);
    std::vector<at::Tensor> ins{input}, outs{output};
    begin(op, ins, outs);
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), kName, ": ", op, ": output dtype ",
                output.scalar_type(), " differs from input dtype ", input.scalar_type());
    TORCH_CHECK(output.numel() == input.numel() * size_, kName, ": ", op, ": the output has ", output.numel(),
                " elements, expected ", size_, " x ", input.numel());
    agree(op, OpType::_ALLGATHER_BASE, input.scalar_type(), input.numel(), 1, -1, -1);
    auto host_in = read_to_host(ins);
    auto host_out = host_like(output);
    Job job;
    job.gloo.push_back(gloo_->_allgather_base(host_out, host_in[0], opts));
    job.writes.emplace_back(output, host_out);
    return submit(OpType::_ALLGATHER_BASE, outs, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    const char* op = "allgather_coalesced";
    Issuing issuing(issue_mu_);
    std::vector<at::Tensor> all_out;
    for (auto& l : output_lists) all_out.insert(all_out.end(), l.begin(), l.end());
    begin(op, inputs, all_out);
    TORCH_CHECK(static_cast<int>(output_lists.size()) == size_, kName, ": ", op, ": expected ", size_,
                " output lists, got ", output_lists.size());
    for (auto& l : output_lists) {
      TORCH_CHECK(l.size() == inputs.size(), kName, ": ", op, ": each output list must hold one tensor per input");
      for (size_t i = 0; i < l.size(); ++i)
        TORCH_CHECK(l[i].numel() == inputs[i].numel() && l[i].scalar_type() == inputs[i].scalar_type(), kName, ": ",
                    op, ": output ", i, " does not match input ", i, " in dtype or number of elements");
    }
    auto dtype = common_dtype(op, inputs);
    agree(op, OpType::ALLGATHER_COALESCED, dtype, total_numel(inputs), inputs.size(), -1, -1);
    auto host_in = read_to_host(inputs);
    std::vector<std::vector<at::Tensor>> host_out;
    for (auto& l : output_lists) host_out.push_back(hosts_like(l));
    Job job;
    job.gloo.push_back(gloo_->allgather_coalesced(host_out, host_in, opts));
    for (size_t r = 0; r < output_lists.size(); ++r) job.write(output_lists[r], host_out[r]);
    return submit(OpType::ALLGATHER_COALESCED, all_out, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    const char* op = "allgather_into_tensor_coalesced";
    Issuing issuing(issue_mu_);
    begin(op, inputs, outputs);
    TORCH_CHECK(outputs.size() == inputs.size(), kName, ": ", op, ": ", outputs.size(), " outputs for ",
                inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); ++i)
      TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * size_ && outputs[i].scalar_type() == inputs[i].scalar_type(),
                  kName, ": ", op, ": output ", i, " must have ", size_, " x ", inputs[i].numel(),
                  " elements of the input's dtype");
    auto dtype = common_dtype(op, inputs);
    agree(op, OpType::ALLGATHER_COALESCED, dtype, total_numel(inputs), inputs.size(), -1, -1);
    auto host_in = read_to_host(inputs);
    auto host_out = hosts_like(outputs);
    Job job;
    job.gloo.push_back(gloo_->allgather_into_tensor_coalesced(host_out, host_in, opts));
    job.write(outputs, host_out);
    return submit(OpType::ALLGATHER_COALESCED, outputs, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const char* op = "gather";
    Issuing issuing(issue_mu_);
    TORCH_CHECK(inputs.size() == 1, kName, ": ", op, " takes one input tensor per process");
    bool is_root = opts.rootRank == rank_;
    std::vector<at::Tensor> outs = root_list(op, outputs, is_root, "output");
    begin(op, inputs, outs);
    auto dtype = common_dtype(op, inputs);
    for (auto& o : outs)
      TORCH_CHECK(o.numel() == inputs[0].numel() && o.scalar_type() == dtype, kName, ": ", op,
                  ": each output must have the input's dtype and number of elements");
    agree(op, OpType::GATHER, dtype, inputs[0].numel(), 1, opts.rootRank, -1);
    auto host_in = read_to_host(inputs);
    std::vector<std::vector<at::Tensor>> host_out;
    if (is_root) host_out.push_back(hosts_like(outs));
    Job job;
    job.gloo.push_back(gloo_->gather(host_out, host_in, opts));
    if (is_root) job.write(outs, host_out[0]);
    return submit(OpType::GATHER, outs, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const char* op = "scatter";
    Issuing issuing(issue_mu_);
    TORCH_CHECK(outputs.size() == 1, kName, ": ", op, " takes one output tensor per process");
    bool is_root = opts.rootRank == rank_;
    std::vector<at::Tensor> ins = root_list(op, inputs, is_root, "input");
    begin(op, ins, outputs);
    auto dtype = common_dtype(op, outputs);
    for (auto& i : ins)
      TORCH_CHECK(i.numel() == outputs[0].numel() && i.scalar_type() == dtype, kName, ": ", op,
                  ": each input must have the output's dtype and number of elements");
    agree(op, OpType::SCATTER, dtype, outputs[0].numel(), 1, opts.rootRank, -1);
    std::vector<std::vector<at::Tensor>> host_in;
    if (is_root) host_in.push_back(read_to_host(ins));
    auto host_out = hosts_like(outputs);
    Job job;
    job.gloo.push_back(gloo_->scatter(host_out, host_in, opts));
    job.write(outputs, host_out);
    return submit(OpType::SCATTER, outputs, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const char* op = "reduce_scatter";
    Issuing issuing(issue_mu_);
    TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, kName, ": ", op,
                " takes one output tensor and one input list per process");
    auto ins = inputs[0];
    begin(op, ins, outputs);
    TORCH_CHECK(static_cast<int>(ins.size()) == size_, kName, ": ", op, ": the input list has ", ins.size(),
                " tensors for a group of ", size_);
    auto dtype = common_dtype(op, outputs);
    for (auto& i : ins)
      TORCH_CHECK(i.numel() == outputs[0].numel() && i.scalar_type() == dtype, kName, ": ", op,
                  ": each input must have the output's dtype and number of elements");
    auto red = reduction(op, opts.reduceOp, dtype);
    agree(op, OpType::REDUCE_SCATTER, dtype, outputs[0].numel(), 1, -1, opts.reduceOp.op_);
    // gloo's list form: one flat input, reduce-scattered in equal parts
    auto host_list = read_to_host(ins);
    std::vector<at::Tensor> parts;
    for (auto& h : host_list) parts.push_back(h.reshape({-1}));
    auto flat_in = at::cat(parts);
    std::vector<at::Tensor> flat{flat_in};
    premultiply(flat, red);
    auto host_out = host_like(outputs[0]);
    c10d::ReduceScatterOptions o = opts;
    o.reduceOp = red.gloo_op;
    Job job;
    job.gloo.push_back(gloo_->_reduce_scatter_base(host_out, flat[0], o));
    std::vector<at::Tensor> hv{host_out};
    average_after(job, hv, red);
    job.writes.emplace_back(outputs[0], host_out);
    return submit(OpType::REDUCE_SCATTER, outputs, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    const char* op = "reduce_scatter_tensor";
    Issuing issuing(issue_mu_);
    std::vector<at::Tensor> ins{input}, outs{output};
    begin(op, ins, outs);
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), kName, ": ", op, ": output dtype ",
                output.scalar_type(), " differs from input dtype ", input.scalar_type());
    TORCH_CHECK(input.numel() == output.numel() * size_, kName, ": ", op, ": the input has ", input.numel(),
                " elements, expected ", size_, " x ", output.numel());
    auto red = reduction(op, opts.reduceOp, input.scalar_type());
    agree(op, OpType::_REDUCE_SCATTER_BASE, input.scalar_type(), output.numel(), 1, -1, opts.reduceOp.op_);
    auto host_in = read_to_host(ins);
    premultiply(host_in, red);
    auto host_out = host_like(output);
    c10d::ReduceScatterOptions o = opts;
    o.reduceOp = red.gloo_op;
    Job job;
    job.gloo.push_back(gloo_->_reduce_scatter_base(host_out, host_in[0], o));
    std::vector<at::Tensor> hv{host_out};
    average_after(job, hv, red);
    job.writes.emplace_back(output, host_out);
    return submit(OpType::_REDUCE_SCATTER_BASE, outs, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    const char* op = "reduce_scatter_tensor_coalesced";
    Issuing issuing(issue_mu_);
    begin(op, inputs, outputs);
    TORCH_CHECK(outputs.size() == inputs.size(), kName, ": ", op, ": ", outputs.size(), " outputs for ",
                inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); ++i)
      TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * size_ && outputs[i].scalar_type() == inputs[i].scalar_type(),
                  kName, ": ", op, ": input ", i, " must have ", size_, " x ", outputs[i].numel(),
                  " elements of the output's dtype");
    auto dtype = common_dtype(op, inputs);
    auto red = reduction(op, opts.reduceOp, dtype);
    agree(op, OpType::REDUCE_SCATTER_TENSOR_COALESCED, dtype, total_numel(outputs), outputs.size(), -1,
          opts.reduceOp.op_);
    auto host_in = read_to_host(inputs);
    premultiply(host_in, red);
    auto host_out = hosts_like(outputs);
    c10d::ReduceScatterOptions o = opts;
    o.reduceOp = red.gloo_op;
    Job job;
    for (size_t i = 0; i < inputs.size(); ++i) job.gloo.push_back(gloo_->_reduce_scatter_base(host_out[i], host_in[i], o));
    average_after(job, host_out, red);
    job.write(outputs, host_out);
    return submit(OpType::REDUCE_SCATTER_TENSOR_COALESCED, outputs, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    const char* op = "all_to_all_single";
    Issuing issuing(issue_mu_);
    std::vector<at::Tensor> ins{input}, outs{output};
    begin(op, ins, outs);
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), kName, ": ", op, ": output dtype ",
                output.scalar_type(), " differs from input dtype ", input.scalar_type());
    // elements sent to / received from each peer
    auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
      std::vector<int64_t> c(size_);
      int64_t rows = t.dim() > 0 ? t.size(0) : 1;
      int64_t row = rows > 0 ? t.numel() / rows : 0;
      if (splits.empty()) {
        TORCH_CHECK(rows % size_ == 0, kName, ": ", op, ": the ", which, "'s first dimension (", rows,
                    ") is not divisible by the group size ", size_, " and no split sizes were given");
        for (auto& x : c) x = rows / size_ * row;
      } else {
        TORCH_CHECK(static_cast<int>(splits.size()) == size_, kName, ": ", op, ": ", which, " split sizes have ",
                    splits.size(), " entries for a group of ", size_);
        int64_t sum = 0;
        for (int i = 0; i < size_; ++i) {
          TORCH_CHECK(splits[i] >= 0, kName, ": ", op, ": negative ", which, " split size");
          c[i] = splits[i] * row;
          sum += splits[i];
        }
        TORCH_CHECK(sum == rows, kName, ": ", op, ": the ", which, " split sizes add up to ", sum, ", but its first "
                    "dimension is ", rows);
      }
      return c;
    };
    auto send = counts(input, input_splits, "input");
    auto recv = counts(output, output_splits, "output");
    agree(op, OpType::ALLTOALL_BASE, input.scalar_type(), 0, 1, -1, -1, &send, &recv);
    auto host_in = read_to_host(ins);
    auto host_out = host_like(output);
    Job job;
    job.gloo.push_back(gloo_->alltoall_base(host_out, host_in[0], output_splits, input_splits, opts));
    job.writes.emplace_back(output, host_out);
    return submit(OpType::ALLTOALL_BASE, outs, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    const char* op = "all_to_all";
    Issuing issuing(issue_mu_);
    begin(op, inputs, outputs);
    TORCH_CHECK(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_, kName, ": ",
                op, " needs ", size_, " input and output tensors");
    auto dtype = common_dtype(op, inputs);
    common_dtype(op, outputs);
    TORCH_CHECK(outputs[0].scalar_type() == dtype, kName, ": ", op, ": outputs and inputs differ in dtype");
    std::vector<int64_t> send(size_), recv(size_);
    for (int i = 0; i < size_; ++i) {
      send[i] = inputs[i].numel();
      recv[i] = outputs[i].numel();
    }
    agree(op, OpType::ALLTOALL, dtype, 0, size_, -1, -1, &send, &recv);
    // one flat exchange with per-peer sizes (gloo's list form needs equal sizes; NCCL's does not)
    auto host_in = read_to_host(inputs);
    std::vector<at::Tensor> parts;
    for (auto& h : host_in) parts.push_back(h.reshape({-1}));
    at::Tensor flat_in = at::cat(parts);
    at::Tensor flat_out = at::empty({total_numel(outputs)}, flat_in.options());
    Job job;
    job.gloo.push_back(gloo_->alltoall_base(flat_out, flat_in, recv, send, opts));
    int64_t off = 0;
    for (auto& o : outputs) {
      job.writes.emplace_back(o, flat_out.narrow(0, off, o.numel()).view(o.sizes()));
      off += o.numel();
    }
    return submit(OpType::ALLTOALL, outputs, std::move(job));
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    const char* op = "barrier";
    Issuing issuing(issue_mu_);
    check_open(op);
    {  // the device's queued work is part of what the barrier waits for
      std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
      if (rt::Client::initialized()) Engine::get().synchronize();
    }
    agree(op, OpType::BARRIER, c10::kByte, 0, 0, -1, -1);
    c10d::BarrierOptions o = opts;
    o.device = std::nullopt;
    o.device_ids.clear();
    Job job;
    job.gloo.push_back(gloo_->barrier(o));
    return submit(OpType::BARRIER, {}, std::move(job));
  }

  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    Issuing issuing(issue_mu_);
    check_open("monitored_barrier");
    gloo_->monitoredBarrier(opts, wait_all_ranks);
  }

  // ------------------------------------------------------------ point to point
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    const char* op = "send";
    Issuing issuing(issue_mu_);
    TORCH_CHECK(tensors.size() == 1, kName, ": ", op, " takes one tensor");
    begin(op, tensors);
    check_peer(op, dst);
    auto host = read_to_host(tensors);
    std::vector<at::Tensor> header{at::tensor(std::vector<int64_t>{kMagicValue, static_cast<int64_t>(
                                                                                 tensors[0].scalar_type()),
                                                                   tensors[0].numel()},
                                              at::kLong)};
    Job job;
    job.gloo.push_back(gloo_->send(header, dst, header_tag(tag)));
    job.gloo.push_back(gloo_->send(host, dst, tag));
    job.keep = {header[0], host[0]};
    return submit(OpType::SEND, tensors, std::move(job), /*p2p=*/true);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    Issuing issuing(issue_mu_);
    TORCH_CHECK(tensors.size() == 1, kName, ": recv takes one tensor");
    begin("recv", tensors);
    check_peer("recv", src);
    return receive(tensors, src, tag, OpType::RECV);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    Issuing issuing(issue_mu_);
    TORCH_CHECK(tensors.size() == 1, kName, ": recv takes one tensor");
    begin("recv", tensors);
    return receive(tensors, -1, tag, OpType::RECVANYSOURCE);
  }

 private:
  // What the completion thread does for a call: wait for the gloo works, run
  // `post` on the host results, write them into the tpu tensors, then `extra`.
  struct Job {
    std::vector<GlooWork> gloo;
    std::vector<std::pair<at::Tensor, at::Tensor>> writes;  // (tpu destination, host value)
    std::vector<std::function<void()>> post;
    std::function<void()> extra;  // runs instead of the above (receive)
    std::vector<at::Tensor> keep;  // host buffers gloo uses until it is done
    void write(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src) {
      for (size_t i = 0; i < dst.size(); ++i) writes.emplace_back(dst[i], src[i]);
    }
  };

  struct Inflight {
    WorkPtr work;
    std::vector<engine::StoragePtr> writes;
  };

  void check_open(const char* op) const {
    TORCH_CHECK(!closed_, kName, ": ", op, " on a process group that was destroyed (destroy_process_group) or aborted");
  }

  void check_peer(const char* op, int peer) const {
    TORCH_CHECK(peer >= 0 && peer < size_, kName, ": ", op, ": peer rank ", peer, " is outside the group (size ",
                size_, ")");
  }

  static int header_tag(int tag) { return tag ^ (1 << 30); }

  // Checks the tensors and waits for unfinished earlier calls that write them.
  void begin(const char* op, const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b = {}) {
    check_open(op);
    check_all(op, a);
    check_all(op, b);
    for (auto* v : {&a, &b})
      for (auto& t : *v) not_in_capture(t.device().index());
    std::set<const engine::Storage*> mine;
    for (auto* v : {&a, &b})
      for (auto& t : *v) mine.insert(storage_of(t).get());
    std::vector<WorkPtr> waits;
    {
      std::lock_guard<std::mutex> l(inflight_mu_);
      std::vector<Inflight> keep;
      for (auto& f : inflight_) {
        if (f.work->isCompleted()) continue;
        bool hit = false;
        for (auto& s : f.writes) hit = hit || mine.count(s.get());
        if (hit) waits.push_back(f.work);
        keep.push_back(std::move(f));
      }
      inflight_.swap(keep);
    }
    for (auto& w : waits) {
      try {
        w->wait();
      } catch (const std::exception&) {  // that call's error is raised by its own wait()
      }
    }
  }

  // Every rank contributes its fingerprint of this call; all rows must agree.
  void agree(const char* op, OpType type, c10::ScalarType dtype, int64_t count, size_t tensors, int64_t root,
             int reduce, const std::vector<int64_t>* send = nullptr, const std::vector<int64_t>* recv = nullptr) {
    int64_t call = calls_++;
    if (!checks_) return;
    const int64_t width = kHead + 2 * static_cast<int64_t>(size_);
    std::vector<int64_t> fp(width, 0);
    fp[kMagic] = kMagicValue;
    fp[kOp] = static_cast<int64_t>(type);
    fp[kDtype] = static_cast<int64_t>(dtype);
    fp[kCount] = count;
    fp[kTensors] = static_cast<int64_t>(tensors);
    fp[kRoot] = root;
    fp[kReduce] = reduce;
    fp[kCall] = call;
    for (int i = 0; send && i < size_; ++i) {
      fp[kHead + i] = (*send)[i];
      fp[kHead + size_ + i] = (*recv)[i];
    }
    at::Tensor mine = at::tensor(fp, at::kLong);
    at::Tensor all = at::empty({width * size_}, at::kLong);
    try {
      gloo_->_allgather_base(all, mine, c10d::AllgatherOptions())->wait();
    } catch (const std::exception& e) {
      TORCH_CHECK(false, kName, ": ", op, ": the ranks could not agree on this call (a rank did not reach it "
                  "within the timeout, or failed): ", e.what());
    }
    const int64_t* rows = all.data_ptr<int64_t>();
    bool same = true;
    for (int r = 0; r < size_; ++r) {
      const int64_t* f = rows + r * width;
      for (int k = 0; k < kHead; ++k) same = same && f[k] == rows[k];
      for (int j = 0; send && j < size_; ++j)  // what r sends to j is what j receives from r
        same = same && f[kHead + j] == rows[j * width + kHead + size_ + r];
    }
    if (same) return;
    std::ostringstream s;
    s << kName << ": " << op << ": the ranks of this group made different calls (collective, dtype or sizes differ):";
    for (int r = 0; r < size_ && r < 16; ++r) {
      const int64_t* f = rows + r * width;
      s << "\n  rank " << r << ": ";
      if (f[kMagic] != kMagicValue) {
        s << "(not a tpu_dist call)";
        continue;
      }
      s << describe_row(f, c10d::opTypeToString(static_cast<OpType>(f[kOp])).c_str());
      if (send) {
        s << " sends [";
        for (int j = 0; j < size_; ++j) s << (j ? ", " : "") << f[kHead + j];
        s << "] receives [";
        for (int j = 0; j < size_; ++j) s << (j ? ", " : "") << f[kHead + size_ + j];
        s << "] elements";
      }
    }
    TORCH_CHECK(false, s.str());
  }

  static void premultiply(std::vector<at::Tensor>& host, const Reduction& red) {
    if (red.premul)
      for (auto& h : host) h.mul_(*red.premul);
  }

  void average_after(Job& job, std::vector<at::Tensor> host, const Reduction& red) const {
    if (!red.average) return;
    int n = size_;
    job.post.push_back([host, n] {
      for (auto h : host) h.div_(n);
    });
  }

  // Records an issued call: the storages it will write, and the coalesced group it belongs to.
  void track(const WorkPtr& work, const std::vector<std::pair<at::Tensor, at::Tensor>>& writes) {
    std::lock_guard<std::mutex> l(inflight_mu_);
    if (coalescing_) coalesced_.push_back(work);
    if (writes.empty()) return;
    Inflight f{work, {}};
    for (auto& w : writes) f.writes.push_back(storage_of(w.first));
    inflight_.push_back(std::move(f));
  }

  // Hands the call to a completion thread; returns its Work.
  c10::intrusive_ptr<c10d::Work> submit(OpType type, std::vector<at::Tensor> outputs, Job job, bool p2p = false) {
    auto work = c10::make_intrusive<TpuWork>(rank_, type, outputs);
    track(work, job.writes);
    (p2p ? p2p_lane_ : lane_).push([work, job = std::move(job)]() mutable { complete(*work, job); });
    return work;
  }

  static void complete(TpuWork& work, Job& job) {
    std::exception_ptr err;
    try {
      if (job.extra) {
        job.extra();
      } else {
        for (auto& g : job.gloo) g->wait();
        for (auto& p : job.post) p();
        write_back(job.writes);
      }
    } catch (...) {
      err = std::current_exception();
    }
    job = Job{};  // host buffers freed before anyone is woken
    work.done(err);
  }

  static void write_back(const std::vector<std::pair<at::Tensor, at::Tensor>>& writes) {
    if (writes.empty()) return;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    auto& eng = Engine::get();
    std::set<int> devices;
    for (auto& [dst, src] : writes) {
      if (dst.numel() == 0) continue;
      at::Tensor s = src.contiguous();
      eng.write(view_of(dst), s.data_ptr());
      devices.insert(dst.device().index());
    }
    for (int d : devices) eng.flush(d);  // nothing of this thread's stays pending
  }

  // recv / recvAnysource: the header first (dtype, element count), then the data
  // from the rank that sent the header.
  c10::intrusive_ptr<c10d::Work> receive(std::vector<at::Tensor>& tensors, int src, int tag, OpType type) {
    at::Tensor t = tensors[0];
    at::Tensor header = at::empty({3}, at::kLong);
    std::vector<at::Tensor> hv{header};
    GlooWork hw = src >= 0 ? gloo_->recv(hv, src, header_tag(tag)) : gloo_->recvAnysource(hv, header_tag(tag));
    auto work = c10::make_intrusive<TpuWork>(rank_, type, tensors);
    track(work, {{t, at::Tensor()}});
    auto gloo = gloo_;
    TpuWork* w = work.get();
    Job job;
    job.extra = [gloo, hw, header, t, src, tag, w]() {
      hw->wait();
      int from = src >= 0 ? src : hw->sourceRank();
      const int64_t* h = header.data_ptr<int64_t>();
      TORCH_CHECK(h[0] == kMagicValue, kName, ": recv: rank ", from, " sent a message that is not a tpu_dist send");
      auto sent_type = static_cast<c10::ScalarType>(h[1]);
      int64_t sent = h[2];
      bool match = sent_type == t.scalar_type() && sent == t.numel();
      // on a mismatch the message is still received (into a scratch buffer), so the sender completes
      at::Tensor host = match ? host_like(t) : at::empty({sent}, at::TensorOptions().dtype(sent_type));
      std::vector<at::Tensor> dv{host};
      gloo->recv(dv, from, tag)->wait();
      TORCH_CHECK(match, kName, ": recv: rank ", from, " sent ", sent, " elements of ", sent_type,
                  ", but the receiving tensor has ", t.numel(), " elements of ", t.scalar_type());
      write_back({{t, host}});
      w->source_ = from;
    };
    p2p_lane_.push([work, job = std::move(job)]() mutable { complete(*work, job); });
    return work;
  }

  c10::intrusive_ptr<c10d::Backend> gloo_;
  bool checks_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> closed_{false};
  std::atomic<int64_t> calls_{0};
  std::mutex issue_mu_;  // calls from several threads are issued one at a time (same order on both sides of gloo)
  std::mutex inflight_mu_;
  std::vector<Inflight> inflight_;
  bool coalescing_ = false;
  std::vector<WorkPtr> coalesced_;
  // last: destroyed first, so the threads finish before the members they use go
  Lane p2p_lane_;
  Lane lane_;
};

// _c10d_functional::wait_tensor on tpu: waits for the collective that writes the
// tensor (c10d's work registry). In a torch.compile capture it is a capture break,
// so the wait runs between the programs before the ones that read the result.
at::Tensor tpu_wait_tensor(const at::Tensor& t) {
  NoGil nogil;
  if (t.device().type() == kTpu) not_in_capture(t.device().index());
  return c10d::wait_tensor(t);
}

// DDP's per-iteration times (forward, backward compute, backward communication: the
// avg_*_time fields of DDP's logging data) for a module on tpu, read from the host
// clock as c10d's CPU timer reads them. A tpu op returns when it is enqueued, so
// compute times are the host's issue times; a collective waits for its inputs, so the
// communication time includes the device work before it. Without a timer DDP warns on
// every rank that it collects times for CPU and CUDA only.
class TpuReducerTimer : public c10d::Timer {
 public:
  explicit TpuReducerTimer(c10::Device /*device*/) {}
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const int64_t s = getTimeRef(start), e = getTimeRef(end);
    if (s == c10d::kUnsetTime || e == c10d::kUnsetTime || e < s) return std::nullopt;
    return e - s;
  }
};

}  // namespace
}  // namespace tt::aten

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, tt::aten::TpuReducerTimer);
}  // namespace c10d

namespace tt::aten {

TORCH_LIBRARY_IMPL(_c10d_functional, PrivateUse1, m) { m.impl("wait_tensor", TORCH_FN(tpu_wait_tensor)); }

void bind_distributed(py::module& m) {
  // ---- the c10d backend
  try {
    py::module::import("torch._C._distributed_c10d");  // registers c10d::Backend with pybind
    py::class_<TpuBackend, c10d::Backend, c10::intrusive_ptr<TpuBackend>>(m, "TpuDistBackend",
                                                                           "The c10d backend of tpu tensors (tpu_dist)");
    m.def(
        "_tpu_dist_backend",
        [](const c10::intrusive_ptr<c10d::Backend>& gloo, int rank, int size, bool checks, double timeout_s) {
          return c10::make_intrusive<TpuBackend>(gloo, rank, size, checks,
                                                 std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
        },
        py::arg("gloo"), py::arg("rank"), py::arg("size"), py::arg("checks") = true, py::arg("timeout_s") = 1800.0);
    m.attr("_tpu_dist_error") = py::none();
  } catch (const std::exception& e) {  // torch without distributed support: tpu works, tpu_dist does not
    m.attr("_tpu_dist_error") = std::string(e.what());
  }
}

}  // namespace tt::aten
