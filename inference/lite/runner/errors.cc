#include "errors.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>

#include "json.h"
#include "lite_log.h"
#include "protocol.h"

namespace msrl {

namespace {
int g_proto_out = STDOUT_FILENO;
}  // namespace

void SetProtocolFd(int fd) { g_proto_out = fd; }
int ProtocolFd() { return g_proto_out; }

void FailHandshake(const LoadFailure &f) {
  const std::string msg = OneLine(f.message);
  std::string line = "{\"ok\": false, \"kind\": \"" + std::string(f.kind) + "\", \"error\": " + JsonStr(msg);
  if (f.mind_ir_version >= 0) line += ", \"mind_ir_version\": " + std::to_string(f.mind_ir_version);
  if (f.max_mind_ir_version >= 0) line += ", \"max_mind_ir_version\": " + std::to_string(f.max_mind_ir_version);
  line += "}\n";
  WriteAll(g_proto_out, line.data(), line.size());
  std::fprintf(stderr, "msrl-lite-runner: %s error: %s\n", f.kind, msg.c_str());
  std::fflush(stderr);
  _exit(f.code);  // skip the Lite libraries' static teardown after a half-built model
}

void FailHandshake(Exit code, const char *kind, const std::string &msg) {
  LoadFailure f;
  f.code = code;
  f.kind = kind;
  f.message = msg;
  FailHandshake(f);
}

namespace {
// Digits after optional whitespace from `at` (a regex's \s*(\d+)), at most 18 so std::stoll cannot overflow: the
// position after them, npos without digits.
size_t ReadNumber(const std::string &s, size_t at, int64_t *value) {
  while (at < s.size() && std::isspace(static_cast<unsigned char>(s[at]))) ++at;
  size_t end = at;
  while (end < s.size() && end - at < 18 && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
  if (end == at) return std::string::npos;
  *value = std::stoll(s.substr(at, end - at));
  return end;
}
}  // namespace

// What /maximum mind ir version:\s*(\d+).*mind ir version:\s*(\d+)/i finds, without <regex> (3 s of g++ for this
// file alone): the first "maximum ..." with a number, then the last "mind ir version:" with a number later on that
// line.
bool ParseMindIRRefusal(const std::string &log, int64_t *max_version, int64_t *file_version) {
  static const std::string kMax = "maximum mind ir version:", kFile = "mind ir version:";
  std::string low(log);
  for (char &c : low) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (size_t at = low.find(kMax); at != std::string::npos; at = low.find(kMax, at + 1)) {
    int64_t max = 0, file = 0;
    const size_t rest = ReadNumber(low, at + kMax.size(), &max);
    if (rest == std::string::npos) continue;
    const size_t eol = low.find_first_of("\r\n", rest);
    const size_t line_end = eol == std::string::npos ? low.size() : eol;
    if (line_end < rest + kFile.size()) continue;
    for (size_t f = low.rfind(kFile, line_end - kFile.size()); f != std::string::npos && f >= rest;
         f = f == 0 ? std::string::npos : low.rfind(kFile, f - 1)) {
      if (ReadNumber(low, f + kFile.size(), &file) != std::string::npos) {
        *max_version = max;
        *file_version = file;
        return true;
      }
    }
  }
  return false;
}

LoadFailure ClassifyLoadFailure(const std::string &log, const mindspore::Status &status, const std::string &model,
                                const std::string &device, uint32_t device_id, const std::string &lite_version) {
  LoadFailure f;
  std::string why = FirstErrorLine(log);
  if (why.empty()) why = OneLine(status.ToString());

  if (ParseMindIRRefusal(log, &f.max_mind_ir_version, &f.mind_ir_version)) {
    f.code = kExitMindIR;
    f.kind = "mindir_version";
    f.message = "MindIR v" + std::to_string(f.mind_ir_version) + "; this Lite (" + lite_version + ") reads <= v" +
                std::to_string(f.max_mind_ir_version) + "; use the .ms from the bundle";
    return f;
  }
  if (device != "cpu") {
    // The usual cause is a backend plugin whose dependencies (the CANN runtime) are missing. Lite logs that
    // only as a warning, which GLOG_v=3 hides, so ask the dynamic loader directly.
    // The plugin is named *_python.so in the PyPI wheel and without the suffix in the official tarballs.
    std::string detail;
    for (const char *plugin : {"libascend_kernel_plugin_python.so", "libascend_kernel_plugin.so"}) {
      if (void *h = dlopen(plugin, RTLD_NOW | RTLD_LOCAL)) {
        dlclose(h);
        detail.clear();
        break;
      }
      if (const char *e = dlerror(); e != nullptr && detail.empty()) {
        detail = std::string(" (") + e + "; is the Ascend CANN runtime installed?)";
      }
    }
    f.code = kExitDevice;
    f.kind = "device";
    f.message = "device " + device + ":" + std::to_string(device_id) + " unavailable: " + why + detail;
    return f;
  }
  f.message = "cannot load '" + model + "': " + why;
  return f;
}

}  // namespace msrl
