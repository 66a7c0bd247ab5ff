// Activity scopes: the runtime's and the engine's work (compiles, program runs, host
// transfers, fused-graph flushes) as timed scopes that a profiler can record. Torch-free:
// the aten layer installs an Observer that turns each scope into a torch.profiler event.
#pragma once

#include <atomic>
#include <cstdint>

namespace tt::rt::activity {

enum class Kind : int {
  Compile,      // a program compiled (amount: its text in bytes)
  LoadProgram,  // a program loaded from the disk cache (amount: serialized bytes)
  Execute,      // a program run, enqueue to completion while recording (amount: arguments)
  ToDevice,     // host -> device copy (amount: bytes)
  ToHost,       // device -> host copy (amount: bytes)
  Flush,        // a fused graph sent to run (amount: ops in it)
};
const char* name(Kind k);         // "tpu::compile", ...
const char* amount_name(Kind k);  // "bytes", "ops", "arguments"

class Observer {
 public:
  virtual ~Observer() = default;
  // A token for end(), or nullptr when nothing records this scope (then end is not called).
  virtual void* begin(Kind k, int64_t amount) = 0;
  virtual void end(void* token) = 0;
};

void set_observer(Observer* o);  // nullptr: none; the observer lives as long as the process
Observer* observer();

// One scope: begins at construction, ends at destruction.
class Scope {
 public:
  Scope(Kind k, int64_t amount) {
    if (Observer* o = observer()) {
      token_ = o->begin(k, amount);
      if (token_) o_ = o;
    }
  }
  ~Scope() {
    if (o_) o_->end(token_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  bool recording() const { return o_ != nullptr; }

 private:
  Observer* o_ = nullptr;
  void* token_ = nullptr;
};

}  // namespace tt::rt::activity
