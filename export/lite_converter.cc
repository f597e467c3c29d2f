// msrl-lite-convert: ONNX -> MindSpore Lite flatbuffer (.ms) with the converter library of the
// mindspore-lite 2.0.0 wheel.
//
// Why ONNX and not MindIR: MindSpore 2.10 writes MindIR v3, which Lite 2.0.0 refuses (it reads <= v1), and
// the op signatures changed too. ONNX -> .ms through this converter needs no graph rewriting.
//
// --fp16 maps to the converter's SetWeightFp16: float32 weights are stored as float16 in the .ms (about
// half the size); graph inputs/outputs stay float32. Computing in fp16 would be a runtime choice
// (CPUDeviceInfo::SetEnableFP16), which the runner leaves off, so results are float32 math on fp16 weights.
//
// The wheel ships no converter.h, so the few members we use are declared by hand below. The library's
// object layout is unknown to us, hence the constructor runs in generously over-allocated storage and the
// object is never destroyed (the process exits right after the conversion).

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "include/api/status.h"
#include "include/api/types.h"
#include "include/registry/converter_context.h"
#include "lite_log.h"  // inference/lite/runner: the output capture the runner uses too

namespace mindspore {
class Converter {
 public:
  Converter(converter::FmkType fmk_type, const std::vector<char> &model_file, const std::vector<char> &output_file,
            const std::vector<char> &weight_file);
  void SetSaveType(ModelType save_type);
  void SetWeightFp16(bool weight_fp16);
  void SetConfigFile(const std::vector<char> &config_file);
  Status Convert();
};
}  // namespace mindspore

// One core, as far as Lite can tell. Full-quant calibration runs Lite sessions on a fixed 4 threads capped at
// std::thread::hardware_concurrency() (no converter option sets it), and Lite's kernel workers wait by spinning on
// sched_yield: with another process busy on the machine, a conversion spends most of its time yielding (numbers:
// bench/results/convert_contention.md). Answering 1 (the executable's definition is the one Lite's libraries bind
// to: build_lite.sh exports it) runs calibration on the calling thread, and the .ms is byte-identical
// (tests/test_lite_runner.py). MSRL_LITE_CONVERT_CORES=N answers N instead (bench/convert_contention.py).
unsigned int std::thread::hardware_concurrency() noexcept {
  const char *cores = std::getenv("MSRL_LITE_CONVERT_CORES");
  const long n = cores ? std::strtol(cores, nullptr, 10) : 1;
  return n >= 1 && n <= 1024 ? static_cast<unsigned int>(n) : 1;
}

namespace {

constexpr const char *kProg = "msrl-lite-convert";

[[noreturn]] void Fail(int code, const std::string &msg) {
  std::fprintf(stderr, "%s: error: %s\n", kProg, msg.c_str());
  std::exit(code);
}

std::vector<char> Chars(const std::string &s) { return std::vector<char>(s.begin(), s.end()); }

bool IsFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return f.good();
}

void Usage() {
  std::fprintf(stderr,
               "usage: %s --onnx IN.onnx --out OUT.ms [--fp16] [--config FILE] [--verbose]\n"
               "  --fp16     store float32 weights as float16 in the .ms (inputs/outputs stay float32)\n"
               "  --config   Lite's converter configuration file (precision mode, quantization)\n"
               "  --verbose  pass the converter's own log through to stderr\n"
               "environment: MSRL_LITE_CONVERT_CORES=N, the cores Lite is told of (default 1)\n",
               kProg);
}

}  // namespace

int main(int argc, char **argv) {
  std::string onnx_path, out_path, config_path;
  bool fp16 = false, verbose = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--onnx" || a == "--out") && i + 1 < argc) {
      (a == "--onnx" ? onnx_path : out_path) = argv[++i];
    } else if (a == "--config" && i + 1 < argc) {
      config_path = argv[++i];
    } else if (a == "--fp16") {
      fp16 = true;
    } else if (a == "--verbose") {
      verbose = true;
    } else if (a == "-h" || a == "--help") {
      Usage();
      return 0;
    } else {
      Usage();
      Fail(2, "unknown or incomplete argument '" + a + "'");
    }
  }
  if (onnx_path.empty() || out_path.empty()) {
    Usage();
    Fail(2, "--onnx and --out are required");
  }
  if (!IsFile(onnx_path)) Fail(3, "cannot read ONNX model '" + onnx_path + "'");
  if (!config_path.empty() && !IsFile(config_path)) Fail(3, "cannot read converter configuration '" + config_path + "'");
  const size_t slash = out_path.rfind('/');
  const std::string out_dir = slash == std::string::npos ? "." : out_path.substr(0, std::max<size_t>(slash, 1));
  if (access(out_dir.c_str(), W_OK) != 0) Fail(4, "output directory '" + out_dir + "' is missing or not writable");

  // The converter appends ".ms" to names that lack it, so we convert to a private base name next to the
  // target, then rename whatever it produced onto the exact --out path (atomic on the same filesystem).
  const std::string tmp_base = out_path + ".tmp" + std::to_string(getpid());
  alignas(64) static unsigned char storage[4096];
  auto *conv = new (storage) mindspore::Converter(mindspore::converter::kFmkTypeOnnx, Chars(onnx_path),
                                                  Chars(tmp_base), Chars(""));
  conv->SetSaveType(mindspore::kMindIR_Lite);
  conv->SetWeightFp16(fp16);
  if (!config_path.empty()) conv->SetConfigFile(Chars(config_path));

  // Convert() returns only a status code (and prints a banner on stdout); the reason is in Lite's log.
  msrl::LogCapture capture(/*with_stdout=*/true);
  mindspore::Status status = conv->Convert();
  const std::string log = capture.Release(/*replay=*/verbose);

  std::string produced;
  for (const std::string &cand : {tmp_base + ".ms", tmp_base}) {
    if (IsFile(cand)) {
      produced = cand;
      break;
    }
  }
  if (status.IsError() || produced.empty()) {
    if (!produced.empty()) unlink(produced.c_str());
    std::string why = msrl::FirstErrorLine(log);
    if (why.empty()) why = "status " + std::to_string(static_cast<int>(status.StatusCode()));
    Fail(1, "converting '" + onnx_path + "' failed: " + why);
  }
  if (std::rename(produced.c_str(), out_path.c_str()) != 0) {
    unlink(produced.c_str());
    Fail(4, "cannot write '" + out_path + "': " + std::strerror(errno));
  }
  // The converter leaves its output read-only (0400); give it ordinary permissions so reruns and copies work.
  const mode_t mask = umask(0);
  umask(mask);
  chmod(out_path.c_str(), 0644 & ~mask);
  return 0;
}
