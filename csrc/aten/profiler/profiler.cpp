// torch.profiler sees tpu work: every activity scope of the runtime and the engine
// (compiles, program runs, host transfers, flushes; runtime/activity.h) becomes a
// RecordFunction, so it appears in key_averages() and in the exported trace beside the
// ATen op that caused it, with its size as a keyword input.
#include <ATen/record_function.h>

#include <memory>
#include <string>
#include <unordered_map>

#include "aten/tpu.h"
#include "runtime/activity.h"

namespace tt::aten {
namespace {

namespace act = rt::activity;

class RecordFunctionObserver : public act::Observer {
 public:
  void* begin(act::Kind k, int64_t amount) override {
    if (!at::hasCallbacks()) return nullptr;  // nothing is profiling: one load
    auto rf = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (!rf->isActive()) return nullptr;
    std::unordered_map<std::string, c10::IValue> kwargs{{act::amount_name(k), c10::IValue(amount)}};
    rf->before(act::name(k), &kwargs);
    return rf.release();
  }
  void end(void* token) override {
    delete static_cast<at::RecordFunction*>(token);  // its destructor ends the event
  }
};

}  // namespace

void install_profiler_observer() {
  static RecordFunctionObserver observer;
  act::set_observer(&observer);
}

}  // namespace tt::aten
