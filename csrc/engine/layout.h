// Layout helpers shared by the engine's files (not part of the engine's interface).
#pragma once

#include "engine/engine.h"

namespace tt::engine {

// PyTorch's contiguous strides for sizes, and whether strides are those (size-1 dims ignored).
Shape row_major_strides(const Shape& sizes);
bool row_major(const Shape& sizes, const Shape& strides);

}  // namespace tt::engine
