#include "runtime/errno_text.h"

#include <cstring>

namespace zero {

std::string ErrnoText(int err) {
  char buf[256];
  return std::string(strerror_r(err, buf, sizeof(buf)));
}

std::string ErrnoTextAndNumber(int err) { return ErrnoText(err) + " (errno " + std::to_string(err) + ")"; }

}  // namespace zero
