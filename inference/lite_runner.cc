// msrl-lite-runner: a long-lived MindSpore Lite inference server speaking a small binary protocol on
// stdin/stdout, so a NumPy-only Python client can step an environment without importing any framework.
//
// Why a separate process: Lite 2.0.0 and MindSpore 2.10 both ship libmindspore_core.so and clash when
// loaded into one process, and a Lite graph can hang inside Predict; a child process can be timed out and
// killed. Protocol (little-endian) and handshake are documented in inference/lite_client.py.

#include <dirent.h>
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "include/api/context.h"
#include "include/api/model.h"
#include "include/api/status.h"
#include "include/api/types.h"

#ifndef MSRL_LITE_WHEEL_VERSION
#define MSRL_LITE_WHEEL_VERSION "unknown"
#endif

namespace {

using mindspore::DataType;

constexpr uint32_t kMagic = 0x4D534C52;  // "MSLR" read as a u32; on the wire (little-endian): "RLSM"
constexpr uint32_t kOpInfer = 1, kOpPing = 2, kOpQuit = 3;
constexpr uint32_t kOk = 0, kBadRequest = 1, kInferFailed = 2;
constexpr uint32_t kMaxInputs = 1024, kMaxRank = 32;

// Exit codes of the handshake failure kinds (also sent as "kind" in the JSON line).
enum Exit : int {
  kExitArgs = 2,
  kExitMissing = 3,
  kExitLoad = 4,
  kExitMindIR = 5,
  kExitDevice = 6,
  kExitProtocol = 7,  // the request stream became unreadable; exits after one error frame
};

struct DtypeInfo {
  DataType lite;
  const char *name;
  size_t itemsize;
};
// Index = protocol dtype code.
constexpr DtypeInfo kDtypes[] = {
    {DataType::kNumberTypeFloat32, "float32", 4}, {DataType::kNumberTypeFloat16, "float16", 2},
    {DataType::kNumberTypeInt32, "int32", 4},     {DataType::kNumberTypeInt64, "int64", 8},
    {DataType::kNumberTypeUInt8, "uint8", 1},     {DataType::kNumberTypeBool, "bool", 1},
};
constexpr uint32_t kNumDtypes = sizeof(kDtypes) / sizeof(kDtypes[0]);

int DtypeCode(DataType t) {
  for (uint32_t i = 0; i < kNumDtypes; ++i) {
    if (kDtypes[i].lite == t) return static_cast<int>(i);
  }
  return -1;
}

std::string JsonStr(const std::string &s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string OneLine(std::string s) {
  for (char &c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// ---- raw fd I/O ---------------------------------------------------------------------------------------

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

// Buffered reader: one read() usually fetches a whole request frame, instead of one syscall per field.
class Reader {
 public:
  explicit Reader(int fd) : fd_(fd), buf_(1 << 16) {}
  // Returns false on EOF/error. `at_boundary` tells whether EOF happened before any byte of this read.
  bool Read(void *dst, size_t n, bool *at_boundary = nullptr) {
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
  template <typename T>
  bool Get(T *v) {
    return Read(v, sizeof(T));
  }

 private:
  bool Fill() {
    for (;;) {
      ssize_t r = read(fd_, buf_.data(), buf_.size());
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      pos_ = 0;
      end_ = static_cast<size_t>(r);
      return true;
    }
  }
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
  bool Flush(int fd) { return WriteAll(fd, buf_.data(), buf_.size()); }

 private:
  std::vector<uint8_t> buf_;
};

// ---- stderr capture (Lite reports load failures through its log, not the Status) -----------------------

class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    char tmpl[] = "/tmp/msrl-lite-runner-XXXXXX";
    fd_ = mkstemp(tmpl);
    if (fd_ < 0) return;
    unlink(tmpl);
    saved_ = dup(STDERR_FILENO);
    dup2(fd_, STDERR_FILENO);
  }
  // Restores stderr, replays the captured text to it (it stays the diagnostics channel) and returns it.
  std::string Release() {
    if (fd_ < 0) return "";
    std::fflush(stderr);
    dup2(saved_, STDERR_FILENO);
    close(saved_);
    std::string text;
    char buf[65536];
    lseek(fd_, 0, SEEK_SET);
    for (ssize_t n; (n = read(fd_, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
    close(fd_);
    fd_ = -1;
    WriteAll(STDERR_FILENO, text.data(), text.size());
    return text;
  }

 private:
  int fd_ = -1;
  int saved_ = -1;
};

// glog line: "[ERROR] ME(pid,...):date [file:line] func] message" -> "message".
std::string LogMessage(const std::string &line) {
  const size_t file_end = line.find("] ", line.find(" ["));
  const size_t func_end = file_end == std::string::npos ? file_end : line.find("] ", file_end + 2);
  return func_end == std::string::npos ? line : line.substr(func_end + 2);
}

// The first [ERROR] names the root cause; later ones only unwind the call chain. MindSpore's generic
// "null exception handler" line precedes the real exception text, so it is skipped.
std::string FirstErrorLine(const std::string &log) {
  size_t start = 0;
  while (start < log.size()) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    const std::string line = log.substr(start, end - start);
    if (line.rfind("[ERROR]", 0) == 0 && line.find("null exception handler") == std::string::npos) {
      return LogMessage(line);
    }
    start = end + 1;
  }
  return "";
}

// ---- MindIR header sniffing --------------------------------------------------------------------------

struct MindIRHeader {
  int64_t mind_ir_version = -1;  // ModelProto field 13
  std::string producer;          // MindSpore's version: producer_version (3) or, as 2.x writes it, model_version (5)
};

bool ReadVarint(std::istream &in, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    int c = in.get();
    if (c == EOF) return false;
    *v |= static_cast<uint64_t>(c & 0x7f) << shift;
    if (!(c & 0x80)) return true;
  }
  return false;
}

// Walks the top-level fields of mind_ir.proto's ModelProto, seeking over the (large) graph payloads.
MindIRHeader SniffMindIR(const std::string &path) {
  MindIRHeader h;
  std::ifstream in(path, std::ios::binary);
  uint64_t key, v;
  while (in && ReadVarint(in, &key)) {
    const uint64_t field = key >> 3, wire = key & 7;
    if (wire == 0) {
      if (!ReadVarint(in, &v)) break;
      if (field == 13) h.mind_ir_version = static_cast<int64_t>(v);
    } else if (wire == 2) {
      if (!ReadVarint(in, &v)) break;
      if ((field == 3 || (field == 5 && h.producer.empty())) && v < 64) {
        h.producer.resize(v);
        in.read(h.producer.data(), static_cast<std::streamsize>(v));
      } else {
        in.seekg(static_cast<std::streamoff>(v), std::ios::cur);
      }
    } else if (wire == 1 || wire == 5) {
      in.seekg(wire == 1 ? 8 : 4, std::ios::cur);
    } else {
      break;
    }
  }
  return h;
}

// ---- handshake --------------------------------------------------------------------------------------

int g_proto_out = STDOUT_FILENO;

[[noreturn]] void FailHandshake(Exit code, const char *kind, const std::string &msg) {
  std::string line = "{\"ok\": false, \"kind\": \"" + std::string(kind) + "\", \"error\": " + JsonStr(OneLine(msg)) +
                     "}\n";
  WriteAll(g_proto_out, line.data(), line.size());
  std::fprintf(stderr, "msrl-lite-runner: %s error: %s\n", kind, OneLine(msg).c_str());
  std::fflush(stderr);
  _exit(code);  // skip the Lite libraries' static teardown after a half-built model
}

std::string LiteVersion() {
  // mindspore::Version() returns e.g. "MindSpore Lite 2.0.0"; keep the number.
  std::string v = mindspore::Version();
  size_t sp = v.rfind(' ');
  v = sp == std::string::npos ? v : v.substr(sp + 1);
  return v.empty() ? MSRL_LITE_WHEEL_VERSION : v;
}

std::string TensorsJson(const std::vector<mindspore::MSTensor> &ts) {
  std::string s = "[";
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i) s += ", ";
    s += "{\"name\": " + JsonStr(ts[i].Name()) + ", \"dtype\": \"" + kDtypes[DtypeCode(ts[i].DataType())].name +
         "\", \"shape\": [";
    const auto &shape = ts[i].Shape();
    for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
    s += "]}";
  }
  return s + "]";
}

struct Args {
  std::string model;
  std::string device = "cpu";
  uint32_t device_id = 0;
  int threads = 1;
};

Args ParseArgs(int argc, char **argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) FailHandshake(kExitArgs, "args", "missing value for '" + k + "'");
    std::string v = argv[++i];
    char *end = nullptr;
    if (k == "--model") {
      a.model = v;
    } else if (k == "--device") {
      if (v != "cpu" && v != "ascend") FailHandshake(kExitArgs, "args", "--device must be cpu or ascend");
      a.device = v;
    } else if (k == "--device-id") {
      a.device_id = static_cast<uint32_t>(std::strtoul(v.c_str(), &end, 10));
      if (*end) FailHandshake(kExitArgs, "args", "--device-id must be an integer");
    } else if (k == "--threads") {
      a.threads = static_cast<int>(std::strtol(v.c_str(), &end, 10));
      if (*end || a.threads < 1) FailHandshake(kExitArgs, "args", "--threads must be a positive integer");
    } else {
      FailHandshake(kExitArgs, "args", "unknown argument '" + k + "'");
    }
  }
  if (a.model.empty()) {
    FailHandshake(kExitArgs, "args",
                  "usage: msrl-lite-runner --model PATH [--device cpu|ascend] [--device-id N] [--threads N]");
  }
  return a;
}

bool EndsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::unique_ptr<mindspore::Model> Load(const Args &a) {
  mindspore::ModelType type;
  if (EndsWith(a.model, ".ms")) {
    type = mindspore::kMindIR_Lite;
  } else if (EndsWith(a.model, ".mindir")) {
    type = mindspore::kMindIR;
  } else {
    FailHandshake(kExitArgs, "args", "model must end in .ms (MindSpore Lite) or .mindir: '" + a.model + "'");
  }
  if (!std::ifstream(a.model, std::ios::binary).good()) {
    FailHandshake(kExitMissing, "missing", "model file not found or unreadable: '" + a.model + "'");
  }

  auto ctx = std::make_shared<mindspore::Context>();
  ctx->SetThreadNum(a.threads);
  if (a.device == "ascend") {
    auto info = std::make_shared<mindspore::AscendDeviceInfo>();
    info->SetDeviceID(a.device_id);
    ctx->MutableDeviceInfo().push_back(info);
  } else {
    auto info = std::make_shared<mindspore::CPUDeviceInfo>();
    info->SetEnableFP16(false);
    ctx->MutableDeviceInfo().push_back(info);
  }

  auto model = std::make_unique<mindspore::Model>();
  StderrCapture capture;
  mindspore::Status st = model->Build(a.model, type, ctx);
  const std::string log = capture.Release();
  if (st.IsOk()) return model;

  std::string why = FirstErrorLine(log);
  if (why.empty()) why = OneLine(st.ToString());

  static const std::regex kRefusal(R"(maximum mind ir version:\s*(\d+).*mind ir version:\s*(\d+))", std::regex::icase);
  std::smatch m;
  if (std::regex_search(log, m, kRefusal)) {
    const MindIRHeader h = SniffMindIR(a.model);
    const std::string file_v = h.mind_ir_version >= 0 ? std::to_string(h.mind_ir_version) : m[2].str();
    const std::string producer = h.producer.empty() ? "" : " written by MindSpore " + h.producer;
    FailHandshake(kExitMindIR, "mindir_version",
                  "MindIR v" + file_v + producer + "; this Lite (" + LiteVersion() + ") reads <= v" + m[1].str() +
                      "; use the .ms from the bundle");
  }
  if (a.device != "cpu") {
    // The usual cause is a backend plugin whose dependencies (the CANN runtime) are missing. Lite logs that
    // only as a warning, which GLOG_v=3 hides, so ask the dynamic loader directly.
    std::string detail;
    if (void *h = dlopen("libascend_kernel_plugin_python.so", RTLD_NOW | RTLD_LOCAL)) {
      dlclose(h);
    } else if (const char *e = dlerror()) {
      detail = std::string(" (") + e + "; is the Ascend CANN runtime installed?)";
    }
    FailHandshake(kExitDevice, "device",
                  "device " + a.device + ":" + std::to_string(a.device_id) + " unavailable: " + why + detail);
  }
  FailHandshake(kExitLoad, "load", "cannot load '" + a.model + "': " + why);
}

// ---- serving ----------------------------------------------------------------------------------------

// Lite 2.0 hands every Predict to its actor thread ("ActorThread_0"), which sleeps again right after the run,
// so one step costs two cross-thread wake-ups (caller -> actor -> caller). Left to the scheduler, the actor
// thread is sometimes woken on the other CPU while a busy process holds it, and the step then waits for that
// CPU: on the 2-core dev box with a competing job, p99 of a single-step round trip was 0.6-1.7 ms without this
// and 0.2-0.6 ms with it (p50 unchanged). Pinning Lite's thread to the CPU the serving thread is running on
// keeps the hand-offs on one CPU (the serving thread is blocked in Predict meanwhile); the pin follows the
// serving thread when the scheduler moves it. Affinity only changes where threads run, never what they
// compute. Used with one Lite thread only: more threads are meant to run in parallel.
class ThreadFollower {
 public:
  // Call after Model::Build, from the serving thread: every other thread of the process then belongs to Lite.
  void Init() {
    const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
    DIR *dir = opendir("/proc/self/task");
    if (dir == nullptr) return;
    while (const dirent *e = readdir(dir)) {
      const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
      if (tid > 0 && tid != self) tids_.push_back(tid);
    }
    closedir(dir);
  }
  // Before each Predict: one sched_getcpu() (vDSO, no syscall); re-pins only when the serving thread moved.
  void Follow() {
    if (tids_.empty()) return;
    const int cpu = sched_getcpu();
    if (cpu < 0 || cpu == cpu_) return;
    cpu_set_t mask;
    CPU_ZERO(&mask);
    CPU_SET(cpu, &mask);
    const pid_t pid = getpid();
    for (pid_t tid : tids_) {
      // tgkill with signal 0 only checks that tid is still a thread of this process (never another's thread).
      if (syscall(SYS_tgkill, pid, tid, 0) != 0 || sched_setaffinity(tid, sizeof mask, &mask) != 0) {
        tids_.clear();  // e.g. a cpuset forbids it: stop trying
        return;
      }
    }
    cpu_ = cpu;
  }

 private:
  std::vector<pid_t> tids_;
  int cpu_ = -1;
};

struct Feed {
  uint32_t dtype = 0;
  std::vector<int64_t> dims;
  uint64_t nbytes = 0;
  std::vector<uint8_t> data;
};

class Server {
 public:
  Server(mindspore::Model *model, int in_fd, int out_fd, bool follow)
      : model_(model), in_(in_fd), out_fd_(out_fd), inputs_(model->GetInputs()) {
    if (follow) follower_.Init();
    for (const auto &t : inputs_) {
      declared_.push_back(t.Shape());
      current_.push_back(t.Shape());
    }
    feeds_.resize(inputs_.size());
    const char *fault = std::getenv("MSRL_LITE_RUNNER_FAULT");
    fault_ = fault ? fault : "";
  }

  int Run() {
    for (;;) {
      uint32_t hdr[2];
      bool at_boundary = false;
      if (!in_.Read(hdr, sizeof hdr, &at_boundary)) return at_boundary ? 0 : Desync("truncated request header");
      if (hdr[0] != kMagic) return Desync("bad magic");
      if (hdr[1] == kOpQuit) return 0;
      if (hdr[1] == kOpPing) {
        out_.Clear();
        out_.Put(kMagic);
        out_.Put(kOk);
        out_.Put<uint32_t>(0);
      } else if (hdr[1] == kOpInfer) {
        if (!Infer()) return Desync("truncated or malformed infer request");
      } else {
        return Desync("unknown op " + std::to_string(hdr[1]));
      }
      if (!out_.Flush(out_fd_)) return 0;  // client went away
    }
  }

 private:
  // The byte stream can no longer be trusted: answer once, then exit.
  int Desync(const std::string &msg) {
    Error(kBadRequest, "protocol error: " + msg);
    out_.Flush(out_fd_);
    std::fprintf(stderr, "msrl-lite-runner: protocol error: %s\n", msg.c_str());
    return kExitProtocol;
  }

  void Error(uint32_t status, const std::string &msg) {
    out_.Clear();
    out_.Put(kMagic);
    out_.Put(status);
    out_.Put(static_cast<uint32_t>(msg.size()));
    out_.Bytes(msg.data(), msg.size());
  }

  void InjectFault() {
    if (fault_ == "hang") {
      for (;;) pause();
    }
    if (fault_ == "crash") std::abort();
  }

  // Reads the whole frame first (keeping the stream in sync), then validates; returns false only when the
  // frame itself is unreadable.
  bool Infer() {
    InjectFault();
    uint32_t n = 0;
    if (!in_.Get(&n) || n > kMaxInputs) return false;
    if (n > feeds_.size()) feeds_.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      Feed &f = feeds_[i];
      uint32_t ndim = 0;
      if (!in_.Get(&f.dtype) || !in_.Get(&ndim) || ndim > kMaxRank) return false;
      f.dims.resize(ndim);
      if (!in_.Read(f.dims.data(), ndim * sizeof(int64_t)) || !in_.Get(&f.nbytes)) return false;
      if (f.nbytes > (uint64_t{1} << 32)) return false;
      f.data.resize(f.nbytes);
      if (!in_.Read(f.data.data(), f.nbytes)) return false;
    }
    std::string err = Validate(n);
    if (!err.empty()) {
      Error(kBadRequest, err);
      return true;
    }
    err = Predict(n);
    if (!err.empty()) Error(kInferFailed, err);
    return true;
  }

  std::string Validate(uint32_t n) const {
    if (n != inputs_.size()) {
      return "expected " + std::to_string(inputs_.size()) + " inputs, got " + std::to_string(n);
    }
    for (uint32_t i = 0; i < n; ++i) {
      const Feed &f = feeds_[i];
      const auto who = [&] { return "input " + std::to_string(i) + " '" + inputs_[i].Name() + "': "; };
      const int want = DtypeCode(inputs_[i].DataType());
      if (f.dtype != static_cast<uint32_t>(want)) {
        return who() + "dtype code " + std::to_string(f.dtype) + " != expected " + kDtypes[want].name;
      }
      const auto &decl = declared_[i];
      if (!decl.empty() && f.dims.size() != decl.size()) {
        return who() + "rank " + std::to_string(f.dims.size()) + " != expected " + std::to_string(decl.size());
      }
      uint64_t elems = 1;
      for (size_t d = 0; d < f.dims.size(); ++d) {
        if (f.dims[d] < 0) return who() + "negative dimension";
        if (!decl.empty() && decl[d] >= 0 && decl[d] != f.dims[d]) {
          return who() + "dim " + std::to_string(d) + " is " + std::to_string(f.dims[d]) + ", model needs " +
                 std::to_string(decl[d]);
        }
        elems *= static_cast<uint64_t>(f.dims[d]);
      }
      if (f.nbytes != elems * kDtypes[want].itemsize) {
        return who() + "nbytes " + std::to_string(f.nbytes) + " != " +
               std::to_string(elems * kDtypes[want].itemsize);
      }
    }
    return "";
  }

  std::string Predict(uint32_t n) {
    bool resize = false;
    for (uint32_t i = 0; i < n; ++i) resize |= feeds_[i].dims != current_[i];
    if (resize) {
      std::vector<std::vector<int64_t>> dims(n);
      for (uint32_t i = 0; i < n; ++i) dims[i] = feeds_[i].dims;
      mindspore::Status st = model_->Resize(inputs_, dims);
      if (st.IsError()) return "resize failed: " + OneLine(st.ToString());
      inputs_ = model_->GetInputs();
      for (uint32_t i = 0; i < n; ++i) current_[i] = feeds_[i].dims;
    }
    for (uint32_t i = 0; i < n; ++i) {
      if (feeds_[i].nbytes == 0) continue;
      void *dst = inputs_[i].MutableData();
      if (dst == nullptr || inputs_[i].DataSize() != feeds_[i].nbytes) return "cannot allocate input buffer";
      std::memcpy(dst, feeds_[i].data.data(), feeds_[i].nbytes);
    }
    follower_.Follow();
    mindspore::Status st = model_->Predict(inputs_, &outputs_);
    if (st.IsError()) return "predict failed: " + OneLine(st.ToString());

    out_.Clear();
    out_.Put(kMagic);
    out_.Put(kOk);
    out_.Put(static_cast<uint32_t>(outputs_.size()));
    for (auto &t : outputs_) {
      const int code = DtypeCode(t.DataType());
      if (code < 0) return "output '" + t.Name() + "' has a dtype the protocol cannot carry";
      const std::string name = t.Name();
      out_.Put(static_cast<uint32_t>(name.size()));
      out_.Bytes(name.data(), name.size());
      out_.Put(static_cast<uint32_t>(code));
      const auto &shape = t.Shape();
      out_.Put(static_cast<uint32_t>(shape.size()));
      out_.Bytes(shape.data(), shape.size() * sizeof(int64_t));
      const uint64_t nbytes = t.DataSize();
      out_.Put(nbytes);
      if (nbytes) out_.Bytes(t.MutableData(), nbytes);
    }
    return "";
  }

  mindspore::Model *model_;
  Reader in_;
  int out_fd_;
  Writer out_;
  std::vector<mindspore::MSTensor> inputs_, outputs_;
  std::vector<std::vector<int64_t>> declared_, current_;
  std::vector<Feed> feeds_;
  std::string fault_;
  ThreadFollower follower_;
};

}  // namespace

int main(int argc, char **argv) {
  // Load failures are classified from Lite's ERROR log lines, so GLOG_v must not silence them. Lite reads
  // GLOG_v during static initialisation, hence the re-exec instead of a plain setenv.
  if (const char *v = std::getenv("GLOG_v"); v != nullptr && std::atoi(v) > 3) {
    setenv("GLOG_v", "3", 1);
    execv("/proc/self/exe", argv);
  }

  // stdout is the protocol channel: keep a private handle to it and point fd 1 at stderr, so any printf or
  // log line from the libraries lands in the diagnostics stream instead of corrupting frames.
  std::fflush(stdout);
  g_proto_out = dup(STDOUT_FILENO);
  dup2(STDERR_FILENO, STDOUT_FILENO);
  signal(SIGPIPE, SIG_IGN);

  const Args args = ParseArgs(argc, argv);
  std::unique_ptr<mindspore::Model> model = Load(args);

  const auto inputs = model->GetInputs();
  const auto outputs = model->GetOutputs();
  for (const auto *group : {&inputs, &outputs}) {
    for (const auto &t : *group) {
      if (DtypeCode(t.DataType()) < 0) {
        FailHandshake(kExitLoad, "load",
                      "tensor '" + t.Name() + "' has Lite dtype " + std::to_string(static_cast<int>(t.DataType())) +
                          ", which the runner protocol does not carry");
      }
    }
  }
  const std::string hello = "{\"ok\": true, \"lite_version\": " + JsonStr(LiteVersion()) +
                            ", \"model\": " + JsonStr(args.model) + ", \"device\": " + JsonStr(args.device) +
                            ", \"inputs\": " + TensorsJson(inputs) + ", \"outputs\": " + TensorsJson(outputs) + "}\n";
  if (!WriteAll(g_proto_out, hello.data(), hello.size())) return 0;

  // MSRL_LITE_RUNNER_FOLLOW=0 leaves Lite's thread wherever the scheduler puts it (see ThreadFollower).
  const char *follow_env = std::getenv("MSRL_LITE_RUNNER_FOLLOW");
  const bool follow = args.device == "cpu" && args.threads == 1 && !(follow_env && std::atoi(follow_env) == 0);
  Server server(model.get(), STDIN_FILENO, g_proto_out, follow);
  const int rc = server.Run();
  // Skip static destructors of the Lite libraries: nothing to flush and their teardown is not needed.
  std::fflush(stderr);
  _exit(rc);
}
