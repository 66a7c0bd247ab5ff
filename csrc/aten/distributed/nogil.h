// Releases the GIL for a scope where it is held: the engine lock is never taken under the GIL
// (a thread holding the lock may wait for the GIL).
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

namespace tt::aten {

struct NoGil {
  std::optional<pybind11::gil_scoped_release> released;
  NoGil() {
    if (Py_IsInitialized() && PyGILState_Check()) released.emplace();
  }
};

}  // namespace tt::aten
