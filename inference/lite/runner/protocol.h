// Wire format shared with inference/lite/client.py (documented there): frame constants, the dtype table,
// and buffered fd I/O. Nothing here knows about Lite models.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "include/api/types.h"

namespace msrl {

constexpr uint32_t kMagic = 0x4D534C52;  // "MSLR" read as a u32; on the wire (little-endian): "RLSM"
constexpr uint32_t kOpInfer = 1, kOpPing = 2, kOpQuit = 3, kOpTap = 4, kOpStats = 5;
constexpr uint32_t kOk = 0, kBadRequest = 1, kInferFailed = 2;
constexpr uint32_t kMaxInputs = 1024, kMaxRank = 32;

struct DtypeInfo {
  mindspore::DataType lite;
  const char *name;
  size_t itemsize;
};
// Index = protocol dtype code.
constexpr DtypeInfo kDtypes[] = {
    {mindspore::DataType::kNumberTypeFloat32, "float32", 4}, {mindspore::DataType::kNumberTypeFloat16, "float16", 2},
    {mindspore::DataType::kNumberTypeInt32, "int32", 4},     {mindspore::DataType::kNumberTypeInt64, "int64", 8},
    {mindspore::DataType::kNumberTypeUInt8, "uint8", 1},     {mindspore::DataType::kNumberTypeBool, "bool", 1},
};
constexpr uint32_t kNumDtypes = sizeof(kDtypes) / sizeof(kDtypes[0]);

// Protocol code of a Lite dtype, or -1 if the protocol cannot carry it.
int DtypeCode(mindspore::DataType t);

bool WriteAll(int fd, const void *data, size_t n);

// Buffered reader: one read() usually fetches a whole request frame, instead of one syscall per field.
class Reader {
 public:
  explicit Reader(int fd) : fd_(fd), buf_(1 << 16) {}
  // Returns false on EOF/error. `at_boundary` tells whether EOF happened before any byte of this read.
  bool Read(void *dst, size_t n, bool *at_boundary = nullptr);
  // Consumes n bytes without keeping them (a refused payload must still leave the stream in sync).
  bool Skip(uint64_t n);
  template <typename T>
  bool Get(T *v) {
    return Read(v, sizeof(T));
  }

 private:
  bool Fill();
  int fd_;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0, end_ = 0;
};

class Writer {
 public:
  void Clear() { buf_.clear(); }
  template <typename T>
  void Put(T v) {
    Bytes(&v, sizeof v);
  }
  void Bytes(const void *p, size_t n) {
    auto *b = static_cast<const uint8_t *>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  void Append(const Writer &other) { buf_.insert(buf_.end(), other.buf_.begin(), other.buf_.end()); }
  bool Flush(int fd) { return WriteAll(fd, buf_.data(), buf_.size()); }
  // Drops a large buffer's capacity after an oversized response, so it is not kept for the process's life.
  void Shrink(size_t keep) {
    if (buf_.capacity() > keep) std::vector<uint8_t>().swap(buf_);
  }

 private:
  std::vector<uint8_t> buf_;
};

}  // namespace msrl
