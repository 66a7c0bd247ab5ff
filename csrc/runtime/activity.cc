#include "runtime/activity.h"

namespace tt::rt::activity {

namespace {
std::atomic<Observer*> g_observer{nullptr};
}

const char* name(Kind k) {
  switch (k) {
    case Kind::Compile: return "tpu::compile";
    case Kind::LoadProgram: return "tpu::load_program";
    case Kind::Execute: return "tpu::execute";
    case Kind::ToDevice: return "tpu::copy_to_device";
    case Kind::ToHost: return "tpu::copy_to_host";
    case Kind::Flush: return "tpu::flush";
  }
  return "tpu::unknown";
}

const char* amount_name(Kind k) {
  switch (k) {
    case Kind::Flush: return "ops";
    case Kind::Execute: return "arguments";
    default: return "bytes";
  }
}

void set_observer(Observer* o) { g_observer.store(o, std::memory_order_release); }
Observer* observer() { return g_observer.load(std::memory_order_acquire); }

}  // namespace tt::rt::activity
