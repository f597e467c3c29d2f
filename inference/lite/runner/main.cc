// msrl-lite-runner: a long-lived MindSpore Lite inference server speaking a small binary protocol on
// stdin/stdout, so a NumPy-only Python client can step an environment without importing any framework.
//
// Why a separate process: Lite 2.0.0 and MindSpore 2.10 both ship libmindspore_core.so and clash when
// loaded into one process, and a Lite graph can hang inside Predict; a child process can be timed out and
// killed. Protocol (little-endian) and handshake are documented in inference/lite/client.py.
//
// Files by job: protocol.* (framing, dtypes), json.* (handshake JSON), lite_log.* (Lite log scraping),
// errors.* (handshake failure kinds), mindir_probe.* (which MindIR versions this Lite reads), pinning.*
// (CPU pinning), server.* (request loop), fork_server.* (--fork-server: runners forked from one that loaded Lite),
// request_hook_*.cc (none in the shipped binary; faults in the test one).

#include <unistd.h>

#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "device_context.h"
#include "errors.h"
#include "fork_server.h"
#include "include/api/context.h"
#include "include/api/model.h"
#include "include/api/status.h"
#include "include/api/types.h"
#include "inline_run.h"
#include "json.h"
#include "lite_log.h"
#include "mindir_probe.h"
#include "protocol.h"
#include "request_hook.h"
#include "server.h"

#ifndef MSRL_LITE_VERSION
#define MSRL_LITE_VERSION "unknown"  // build_lite.sh passes the version it read from the SDK
#endif

namespace {

using msrl::FailHandshake;
using msrl::JsonStr;

constexpr uint64_t kDefaultMaxRows = 65536;

// The SDK's version: what the library reports if it reports anything (the PyPI 2.0.0 wheel's runtime returns
// an empty string), else what build_lite.sh read from the SDK's files.
std::string LiteVersion(std::string *source) {
  std::string v = mindspore::Version();  // e.g. "MindSpore Lite 2.3.1"; keep the number
  const size_t sp = v.rfind(' ');
  v = sp == std::string::npos ? v : v.substr(sp + 1);
  *source = v.empty() ? "build" : "library";
  return v.empty() ? MSRL_LITE_VERSION : v;
}

struct Args {
  std::string model;
  std::string device = "cpu";
  uint32_t device_id = 0;
  int threads = 1;
  uint64_t max_rows = kDefaultMaxRows;
  std::string precision_mode;  // the bundle's Lite precision mode (device_context.h)
  std::string config;          // Lite's runtime configuration (Model::LoadConfig), e.g. a mixed-precision plan
  bool info = false;
  bool cpu_fp16 = false;  // Lite's CPU float16 kernels (CPUDeviceInfo::SetEnableFP16), where the CPU has them
  bool describe = false;  // --describe-device: the device context as Lite holds it, then exit (no model)
};

Args ParseArgs(int argc, char **argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--info" || k == "--describe-device") {
      (k == "--info" ? a.info : a.describe) = true;
      continue;
    }
    if (k == "--cpu-fp16") {
      a.cpu_fp16 = true;
      continue;
    }
    if (i + 1 >= argc) FailHandshake(msrl::kExitArgs, "args", "missing value for '" + k + "'");
    std::string v = argv[++i];
    char *end = nullptr;
    if (k == "--model") {
      a.model = v;
    } else if (k == "--device") {
      if (v != "cpu" && v != "ascend") FailHandshake(msrl::kExitArgs, "args", "--device must be cpu or ascend");
      a.device = v;
    } else if (k == "--precision-mode") {
      a.precision_mode = v;
    } else if (k == "--config") {
      a.config = v;
    } else if (k == "--device-id") {
      a.device_id = static_cast<uint32_t>(std::strtoul(v.c_str(), &end, 10));
      if (v.empty() || *end) FailHandshake(msrl::kExitArgs, "args", "--device-id must be an integer");
    } else if (k == "--threads") {
      a.threads = static_cast<int>(std::strtol(v.c_str(), &end, 10));
      if (v.empty() || *end || a.threads < 1) {
        FailHandshake(msrl::kExitArgs, "args", "--threads must be a positive integer");
      }
    } else if (k == "--max-rows") {
      const long long rows = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end || rows < 1) FailHandshake(msrl::kExitArgs, "args", "--max-rows must be a positive integer");
      a.max_rows = static_cast<uint64_t>(rows);
    } else {
      FailHandshake(msrl::kExitArgs, "args", "unknown argument '" + k + "'");
    }
  }
  if (a.model.empty() && !a.info && !a.describe) {
    FailHandshake(msrl::kExitArgs, "args",
                  "usage: msrl-lite-runner --model PATH [--device cpu|ascend] [--device-id N] [--precision-mode MODE] "
                  "[--config FILE] [--threads N] [--max-rows N] [--cpu-fp16] | --info | --describe-device");
  }
  return a;
}

std::shared_ptr<mindspore::Context> MakeContext(const Args &a) {
  auto ctx = std::make_shared<mindspore::Context>();
  ctx->SetThreadNum(a.threads);
  // --cpu-fp16 is the CPU's enforce_fp16 (Lite's float16 kernels, where the CPU has them)
  const std::string mode =
      a.cpu_fp16 && a.device == "cpu" && a.precision_mode.empty() ? "enforce_fp16" : a.precision_mode;
  const std::string problem = msrl::ConfigureDevice(ctx.get(), a.device, a.device_id, mode);
  if (!problem.empty()) FailHandshake(msrl::kExitArgs, "args", problem);
  return ctx;
}

bool EndsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What became of --cpu-fp16: "off" (not asked), "on", or "ignored: " and the line in which Lite said it does not
// compute in float16 (a Lite built without MSLITE_ENABLE_FP16, or a CPU without float16 arithmetic). Lite says so as
// a warning: the client runs the runner with warnings logged when it asks.
std::string Fp16Outcome(bool asked, const std::string &log) {
  if (!asked) return "off";
  size_t start = 0;
  while (start < log.size()) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    std::string line = log.substr(start, end - start);
    std::string lower = line;
    for (char &c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower.find("not support fp16") != std::string::npos) return "ignored: " + msrl::LogMessage(line);
    start = end + 1;
  }
  return "on";
}

std::unique_ptr<mindspore::Model> Load(const Args &a, const std::string &lite_version, std::string *fp16) {
  mindspore::ModelType type;
  if (EndsWith(a.model, ".ms")) {
    type = mindspore::kMindIR_Lite;
  } else if (EndsWith(a.model, ".mindir")) {
    type = mindspore::kMindIR;
  } else {
    FailHandshake(msrl::kExitArgs, "args", "model must end in .ms (MindSpore Lite) or .mindir: '" + a.model + "'");
  }
  if (!std::ifstream(a.model, std::ios::binary).good()) {
    FailHandshake(msrl::kExitMissing, "missing", "model file not found or unreadable: '" + a.model + "'");
  }

  auto ctx = MakeContext(a);
  auto model = std::make_unique<mindspore::Model>();
  if (!a.config.empty() && model->LoadConfig(a.config).IsError()) {
    FailHandshake(msrl::kExitArgs, "args", "Lite refused the runtime configuration '" + a.config + "'");
  }
  msrl::LogCapture capture;
  mindspore::Status st = model->Build(a.model, type, ctx);
  const std::string log = capture.Release();
  if (st.IsOk()) {
    *fp16 = Fp16Outcome(a.cpu_fp16 || (a.device == "cpu" && a.precision_mode == "enforce_fp16"), log);
    return model;
  }
  msrl::LoadFailure failure = msrl::ClassifyLoadFailure(log, st, a.model, a.device, a.device_id, lite_version);
  if (!a.precision_mode.empty()) failure.message += " (precision mode " + a.precision_mode + ")";
  FailHandshake(failure);
}

// --info: one JSON line about this build (the Lite version and the MindIR versions it reads), then exit 0.
int Info(const std::string &lite_version, const std::string &source) {
  std::string detail;
  const int64_t max_v = msrl::ProbeMaxMindIRVersion(&detail);
  const std::string line = "{\"lite_version\": " + JsonStr(lite_version) + ", \"lite_version_source\": " +
                           JsonStr(source) + ", \"max_mind_ir_version\": " +
                           (max_v >= 0 ? std::to_string(max_v) : "null") + ", \"mind_ir_probe\": " + JsonStr(detail) +
                           ", \"max_rows_default\": " + std::to_string(kDefaultMaxRows) +
                           ", \"inline_default\": " + (msrl::InlineDefault() ? "true" : "false") + "}\n";
  return msrl::WriteAll(msrl::ProtocolFd(), line.data(), line.size()) ? 0 : 1;
}

// One runner: parse the arguments, load the model, say hello, serve until quit or EOF. A plain start and a
// fork server's child (fork_server.h) both end here.
int Serve(int argc, char **argv) {
  // stdout is the protocol channel: keep a private handle to it and point fd 1 at stderr, so any printf or
  // log line from the libraries lands in the diagnostics stream instead of corrupting frames.
  std::fflush(stdout);
  msrl::SetProtocolFd(dup(STDOUT_FILENO));
  dup2(STDERR_FILENO, STDOUT_FILENO);
  std::signal(SIGPIPE, SIG_IGN);

  const Args args = ParseArgs(argc, argv);
  std::string version_source;
  const std::string lite_version = LiteVersion(&version_source);
  if (args.info) _exit(Info(lite_version, version_source));
  if (args.describe) {  // the argument path to Lite's device objects, checkable without the device
    const std::string line = "{" + msrl::DescribeDevice(*MakeContext(args)) + "}\n";
    _exit(msrl::WriteAll(msrl::ProtocolFd(), line.data(), line.size()) ? 0 : 1);
  }
  std::string fp16;
  std::unique_ptr<mindspore::Model> model = Load(args, lite_version, &fp16);

  const auto inputs = model->GetInputs();
  const auto outputs = model->GetOutputs();
  for (const auto *group : {&inputs, &outputs}) {
    for (const auto &t : *group) {
      if (msrl::DtypeCode(t.DataType()) < 0) {
        FailHandshake(msrl::kExitLoad, "load",
                      "tensor '" + t.Name() + "' has Lite dtype " + std::to_string(static_cast<int>(t.DataType())) +
                          ", which the runner protocol does not carry");
      }
    }
  }
  const bool inline_actors = args.device == "cpu" && msrl::InlineWanted();  // see inline_run.h
  const std::string hello = "{\"ok\": true, \"lite_version\": " + JsonStr(lite_version) +
                            ", \"model\": " + JsonStr(args.model) + ", \"device\": " + JsonStr(args.device) +
                            ", \"precision_mode\": " + (args.precision_mode.empty() ? "null" : JsonStr(args.precision_mode)) +
                            ", \"max_rows\": " + std::to_string(args.max_rows) +
                            ", \"inline\": " + (inline_actors ? "true" : "false") +
                            ", \"cpu_fp16\": " + JsonStr(fp16) +
                            ", \"inputs\": " + msrl::TensorsJson(inputs) +
                            ", \"outputs\": " + msrl::TensorsJson(outputs) + "}\n";
  if (!msrl::WriteAll(msrl::ProtocolFd(), hello.data(), hello.size())) return 0;

  // MSRL_LITE_RUNNER_FOLLOW=0 leaves Lite's thread wherever the scheduler puts it (see pinning.h).
  const char *follow_env = std::getenv("MSRL_LITE_RUNNER_FOLLOW");
  msrl::ServerOptions options;
  options.follow = args.device == "cpu" && args.threads == 1 && !(follow_env && std::atoi(follow_env) == 0);
  options.inline_actors = inline_actors;
  options.max_rows = args.max_rows;
  options.rebuild = [&args]() -> std::unique_ptr<mindspore::Model> {  // loaded once already: no handshake
    auto again = std::make_unique<mindspore::Model>();
    if (!args.config.empty() && again->LoadConfig(args.config).IsError()) return nullptr;
    msrl::LogCapture capture;
    const mindspore::ModelType type = EndsWith(args.model, ".ms") ? mindspore::kMindIR_Lite : mindspore::kMindIR;
    if (again->Build(args.model, type, MakeContext(args)).IsError()) return nullptr;
    return again;
  };
  options.hook = msrl::MakeRequestHook();
  msrl::Server server(std::move(model), STDIN_FILENO, msrl::ProtocolFd(), options);
  const int rc = server.Run();
  // Skip static destructors of the Lite libraries: nothing to flush and their teardown is not needed.
  std::fflush(stderr);
  _exit(rc);
}

}  // namespace

int main(int argc, char **argv) {
  // Load failures are classified from Lite's ERROR log lines, so GLOG_v must not silence them. Lite reads
  // GLOG_v during static initialisation, hence the re-exec instead of a plain setenv.
  if (const char *v = std::getenv("GLOG_v"); v != nullptr && std::atoi(v) > 3) {
    setenv("GLOG_v", "3", 1);
    execv("/proc/self/exe", argv);
    // Only returns where this binary cannot exec itself (under qemu-user without binfmt_misc): say so, then go on.
    std::fprintf(stderr, "msrl-lite-runner: GLOG_v > 3 hides the errors that classify a load failure; run with "
                         "GLOG_v <= 3\n");
  }
  if (argc == 2 && std::string(argv[1]) == "--fork-server") _exit(msrl::RunForkServer(STDIN_FILENO, Serve));
  return Serve(argc, argv);
}
