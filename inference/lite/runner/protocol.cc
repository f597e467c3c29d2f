#include "protocol.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace msrl {

int DtypeCode(mindspore::DataType t) {
  for (uint32_t i = 0; i < kNumDtypes; ++i) {
    if (kDtypes[i].lite == t) return static_cast<int>(i);
  }
  return -1;
}

bool WriteAll(int fd, const void *data, size_t n) {
  auto *p = static_cast<const uint8_t *>(data);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool Reader::Read(void *dst, size_t n, bool *at_boundary) {
  auto *out = static_cast<uint8_t *>(dst);
  const size_t total = n;
  while (n > 0) {
    if (pos_ == end_ && !Fill()) {
      if (at_boundary) *at_boundary = (n == total);
      return false;
    }
    size_t k = std::min(n, end_ - pos_);
    std::memcpy(out, buf_.data() + pos_, k);
    out += k;
    pos_ += k;
    n -= k;
  }
  return true;
}

bool Reader::Skip(uint64_t n) {
  while (n > 0) {
    if (pos_ == end_ && !Fill()) return false;
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, end_ - pos_));
    pos_ += k;
    n -= k;
  }
  return true;
}

bool Reader::Fill() {
  for (;;) {
    ssize_t r = read(fd_, buf_.data(), buf_.size());
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    pos_ = 0;
    end_ = static_cast<size_t>(r);
    return true;
  }
}

}  // namespace msrl
