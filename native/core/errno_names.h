#pragma once

namespace ibv {

// The symbolic name of an errno value ("EIO"), or nullptr if it has none.
const char* ErrnoNameOrNull(int err);

}  // namespace ibv
