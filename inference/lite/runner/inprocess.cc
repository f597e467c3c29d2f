// libmsrl-lite.so: MindSpore Lite in the calling process, behind a minimal C ABI that Python loads with ctypes
// (inference/lite/inprocess.py). The runner process stays for a process that imports MindSpore (the two ship
// clashing libmindspore_core.so) and for untrusted models (its watchdog); a deploy loop calls Lite directly here,
// without the pipe and the two process wake-ups per step. On the CPU the graph runs on the caller's thread
// (inline_run.h: libmsrl-lite-inline.so, which the caller loads RTLD_GLOBAL before this library).
//
// The same context as the runner (threads, CPU or Ascend device; the graph on the calling thread, or else Lite's
// worker pinned to the caller's CPU with one thread), the same load-failure classification (errors.h), the same feed
// validation and float mode, so the two give bitwise the same outputs for the same graph and thread count. Feeds
// are copied into Lite's own input tensors (from the caller's buffers: one per input signature for small feeds);
// outputs once, into buffers the caller owns (no allocation per call at a fixed shape).

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "device_context.h"
#include "errors.h"
#include "json.h"
#include "include/api/context.h"
#include "include/api/model.h"
#include "kept_models.h"
#include "include/api/status.h"
#include "include/api/types.h"
#include "inline_run.h"
#include "lite_log.h"
#include "pinning.h"
#include "predict.h"
#include "protocol.h"

#ifndef MSRL_LITE_VERSION
#define MSRL_LITE_VERSION "unknown"
#endif

namespace {

struct Handle {
  std::unique_ptr<mindspore::Model> model;
  // What builds the model again (see Rebuild): Lite 2.0.0 corrupts its heap resizing some graphs after a Predict.
  std::string path, config;
  mindspore::ModelType type = mindspore::kMindIR_Lite;
  std::shared_ptr<mindspore::Context> context;
  bool predicted = false;    // the model has run a Predict at its current shapes
  bool rebuildable = true;   // false once Lite refused to build it again (an fp16 .ms)
  msrl::KeptModels kept;  // models that ran at other shapes (kept_models.h)
  std::vector<mindspore::MSTensor> inputs, outputs;
  std::vector<std::vector<int64_t>> declared, current;
  msrl::ThreadFollower follower;
  bool follow = false;
  bool inline_actors = false;
  msrl::InlineCount count;  // this model's calls, and how many ran on the calling thread
};

void Put(char *buf, size_t len, const std::string &text) {
  if (buf == nullptr || len == 0) return;
  const size_t n = text.size() < len - 1 ? text.size() : len - 1;
  std::memcpy(buf, text.data(), n);
  buf[n] = '\0';
}

bool EndsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string Version() {
  std::string v = mindspore::Version();
  const size_t sp = v.rfind(' ');
  v = sp == std::string::npos ? v : v.substr(sp + 1);
  return v.empty() ? MSRL_LITE_VERSION : v;
}

bool SameShapes(const Handle *h, int n, const int64_t *dims, const int32_t *ranks) {
  bool same = static_cast<size_t>(n) == h->current.size();
  for (int i = 0, at = 0; same && i < n; at += ranks[i], ++i) {
    same = h->current[i].size() == static_cast<size_t>(ranks[i]) &&
           std::equal(dims + at, dims + at + ranks[i], h->current[i].begin());
  }
  return same;
}

// Makes ``next`` the handle's model (``ran``: it ran at its shapes before), keeping the current one for its shapes.
void Swap(Handle *h, std::unique_ptr<mindspore::Model> next, bool ran) {
  h->inputs.clear();
  h->outputs.clear();
  h->kept.Keep(h->current, std::move(h->model));
  h->model = std::move(next);
  h->inputs = h->model->GetInputs();
  h->outputs = h->model->GetOutputs();
  h->current.clear();
  for (const auto &t : h->inputs) h->current.push_back(t.Shape());
  h->predicted = ran;
}

// The model built again from its file (nullptr: Lite could not, and from then on the model is resized as it is). A
// model resized once before its first Predict runs any batch, while Lite 2.0.0 corrupts its heap resizing some graphs
// after a Predict (a broadcast Sub on [1, batch, n], a one-step GRU's graph: "double free", SIGSEGV at the next
// batch). An fp16 .ms builds once per process ("can not find tensor data in origin tensor data").
std::unique_ptr<mindspore::Model> Rebuild(Handle *h) {
  auto model = std::make_unique<mindspore::Model>();
  if (!h->config.empty() && model->LoadConfig(h->config).IsError()) return nullptr;
  const std::vector<pid_t> threads_before = msrl::ThreadIds();
  mindspore::Status st;
  {
    msrl::LogCapture capture;  // Lite's error lines of a refused build: not the caller's stderr
    msrl::FloatMode lite_mode(msrl::FloatMode::kFlushDenormals);
    st = model->Build(h->path, h->type, h->context);
  }
  if (st.IsError()) {
    h->rebuildable = false;
    return nullptr;
  }
  if (h->follow) h->follower.InitSince(threads_before);  // this build's threads join the followed ones
  return model;
}

// Resizes Lite's inputs when the feed shapes (n feeds, ranks[i] dims each, back to back in dims) differ from the
// last call's: on the model that ran at those shapes before, else on one built again if this one has run (Rebuild);
// "" or the reason it failed. The steady state (same shapes) allocates nothing.
std::string EnsureShapes(Handle *h, int n, const int64_t *dims, const int32_t *ranks) {
  if (SameShapes(h, n, dims, ranks)) return "";
  std::vector<std::vector<int64_t>> shapes(n);
  for (int i = 0, at = 0; i < n; at += ranks[i], ++i) shapes[i].assign(dims + at, dims + at + ranks[i]);
  if (h->predicted && h->rebuildable) {
    if (std::unique_ptr<mindspore::Model> model = h->kept.Take(shapes)) {
      Swap(h, std::move(model), true);
    } else if (std::unique_ptr<mindspore::Model> model = Rebuild(h)) {
      Swap(h, std::move(model), false);
    }
    if (SameShapes(h, n, dims, ranks)) return "";
  }
  mindspore::Status st = h->model->Resize(h->inputs, shapes);
  if (st.IsError()) return "resize failed: " + msrl::OneLine(st.ToString());
  h->inputs = h->model->GetInputs();
  h->outputs = h->model->GetOutputs();
  h->current = shapes;
  return "";
}

}  // namespace

extern "C" {

// The SDK's version (what the library reports, else what build_lite.sh read from the SDK).
const char *msrl_lite_version() {
  static const std::string v = Version();
  return v.c_str();
}

// The device context msrl_lite_open would build, as Lite's objects hold it (device_context.h: DescribeDevice), into
// out; returns 0, or -1 with the refusal in out. Needs no device: the argument path, checkable anywhere.
int msrl_lite_describe_device(const char *device, uint32_t device_id, const char *precision_mode, char *out,
                              size_t out_len) {
  mindspore::Context ctx;
  const std::string problem = msrl::ConfigureDevice(&ctx, device, device_id, precision_mode);
  Put(out, out_len, problem.empty() ? "{" + msrl::DescribeDevice(ctx) + "}" : problem);
  return problem.empty() ? 0 : -1;
}

// Whether this build runs graphs on the calling thread by default (inline_run.h: the Lite builds it was tested on).
int msrl_lite_inline_default() { return msrl::InlineDefault() ? 1 : 0; }

// Loads a .ms or .mindir. inline_mode: 1 run the graph on the calling thread, 0 on Lite's actor thread, -1 as
// MSRL_LITE_INLINE and this build's default say (inline_run.h). On failure returns null, with the failure's kind
// ("load", "missing", "args", "mindir_version", "device"), message and, for a MindIR too new for this Lite, the
// file's and the maximum version in versions[0..1].
// precision_mode: the bundle's Lite precision mode ("" for none; required on Ascend, device_context.h); config: Lite's
// runtime configuration file ("" for none), e.g. a mixed-precision execution plan.
void *msrl_lite_open(const char *path, const char *device, uint32_t device_id, int threads, int inline_mode,
                     const char *precision_mode, const char *config, char *kind, size_t kind_len, char *error,
                     size_t error_len, int64_t *versions) {
  const std::string model_path = path, dev = device, mode = precision_mode, config_path = config;
  const auto fail = [&](const msrl::LoadFailure &f) -> void * {
    Put(kind, kind_len, f.kind);
    Put(error, error_len, f.message);
    versions[0] = f.mind_ir_version;
    versions[1] = f.max_mind_ir_version;
    return nullptr;
  };
  mindspore::ModelType type;
  if (EndsWith(model_path, ".ms")) {
    type = mindspore::kMindIR_Lite;
  } else if (EndsWith(model_path, ".mindir")) {
    type = mindspore::kMindIR;
  } else {
    return fail({msrl::kExitArgs, "args", "model must end in .ms (MindSpore Lite) or .mindir: '" + model_path + "'"});
  }
  if (dev != "cpu" && dev != "ascend") return fail({msrl::kExitArgs, "args", "device must be cpu or ascend"});
  if (threads < 1) return fail({msrl::kExitArgs, "args", "threads must be a positive integer"});
  if (!std::ifstream(model_path, std::ios::binary).good()) {
    return fail({msrl::kExitMissing, "missing", "model file not found or unreadable: '" + model_path + "'"});
  }
  auto ctx = std::make_shared<mindspore::Context>();
  ctx->SetThreadNum(threads);
  const std::string problem = msrl::ConfigureDevice(ctx.get(), dev, device_id, mode);
  if (!problem.empty()) return fail({msrl::kExitArgs, "args", problem});
  auto h = std::make_unique<Handle>();
  h->model = std::make_unique<mindspore::Model>();
  if (!config_path.empty() && h->model->LoadConfig(config_path).IsError()) {
    return fail({msrl::kExitArgs, "args", "Lite refused the runtime configuration '" + config_path + "'"});
  }
  const std::vector<pid_t> threads_before = msrl::ThreadIds();
  msrl::LogCapture capture;
  mindspore::Status st;
  {
    // Built in the float mode the runner builds in (the one loading Lite left its thread in): Lite's worker threads,
    // started here, compute in it (on aarch64 they inherit it; x86 workers set it themselves). The caller's own
    // arithmetic gets its mode back after.
    msrl::FloatMode lite_mode(msrl::FloatMode::kFlushDenormals);
    st = h->model->Build(model_path, type, ctx);
  }
  const std::string log = capture.Release();
  if (st.IsError()) {
    msrl::LoadFailure failure = msrl::ClassifyLoadFailure(log, st, model_path, dev, device_id, Version());
    if (!mode.empty()) failure.message += " (precision mode " + mode + ")";
    return fail(failure);
  }
  h->path = model_path;
  h->config = config_path;
  h->type = type;
  h->context = ctx;
  h->inputs = h->model->GetInputs();
  h->outputs = h->model->GetOutputs();
  for (const auto *group : {&h->inputs, &h->outputs}) {
    for (const auto &t : *group) {
      if (msrl::DtypeCode(t.DataType()) < 0) {
        return fail({msrl::kExitLoad, "load", "tensor '" + t.Name() + "' has Lite dtype " +
                                                  std::to_string(static_cast<int>(t.DataType())) +
                                                  ", which msrl-consistency does not carry"});
      }
    }
  }
  for (const auto &t : h->inputs) {
    h->declared.push_back(t.Shape());
    h->current.push_back(t.Shape());
  }
  // Lite's worker thread follows the caller's CPU with one thread (pinning.h). In-process, "every other thread
  // of the process belongs to Lite" does not hold, so only the threads Build started are followed.
  h->follow = dev == "cpu" && threads == 1;
  if (h->follow) h->follower.InitSince(threads_before);
  h->inline_actors = dev == "cpu" && (inline_mode < 0 ? msrl::InlineWanted() : inline_mode != 0);
  return h.release();
}

// This model's Predict calls so far, how many ran on the calling thread, and whether it was opened to run inline:
// out[0..2].
void msrl_lite_inline_calls(void *handle, uint64_t *out) {
  const auto *h = static_cast<const Handle *>(handle);
  out[0] = h->count.calls;
  out[1] = h->count.inline_calls;
  out[2] = h->inline_actors ? 1 : 0;
}

// Number of inputs (output = 0) or outputs (output = 1).
int msrl_lite_count(void *handle, int output) {
  auto *h = static_cast<Handle *>(handle);
  return static_cast<int>(output ? h->outputs.size() : h->inputs.size());
}

// One tensor's name, dtype code (protocol.h) and shape as the model currently declares it (after the last
// resize); returns its rank, or -1 for a bad index. dims must hold 8 entries.
int msrl_lite_describe(void *handle, int output, int index, char *name, size_t name_len, int *dtype, int64_t *dims) {
  auto *h = static_cast<Handle *>(handle);
  const auto &group = output ? h->outputs : h->inputs;
  if (index < 0 || static_cast<size_t>(index) >= group.size()) return -1;
  const auto &t = group[index];
  Put(name, name_len, t.Name());
  *dtype = msrl::DtypeCode(t.DataType());
  const auto shape = t.Shape();
  const size_t rank = shape.size() < 8 ? shape.size() : 8;
  for (size_t d = 0; d < rank; ++d) dims[d] = shape[d];
  return static_cast<int>(rank);
}

// Copies the last call's outputs into the caller's buffers out[i] of out_bytes[i] bytes; 0 ok, 1 a buffer does not
// fit (error says which).
int msrl_lite_fetch(void *handle, int n_out, void *const *out, const uint64_t *out_bytes, char *error,
                    size_t error_len) {
  auto *h = static_cast<Handle *>(handle);
  if (static_cast<size_t>(n_out) != h->outputs.size()) {
    Put(error, error_len, "expected " + std::to_string(h->outputs.size()) + " output buffers");
    return 1;
  }
  for (int i = 0; i < n_out; ++i) {
    auto &t = h->outputs[i];
    const uint64_t size = t.DataSize();
    if (out == nullptr || size != out_bytes[i]) {
      Put(error, error_len, "output '" + t.Name() + "' has " + std::to_string(size) + " bytes, its buffer " +
                                std::to_string(out == nullptr ? 0 : out_bytes[i]));
      return 1;
    }
    if (size) std::memcpy(out[i], t.MutableData(), size);
  }
  return 0;
}

// One call's arguments, prepared once per input signature by the caller (inprocess.py's _Call mirrors it):
// a control loop passes one pointer per step, and only the contents of its buffers change.
struct msrl_lite_call {
  void *handle;
  int32_t n;                 // feeds
  int32_t n_out;             // output buffers; 0 on the first call at these shapes (see msrl_lite_predict)
  void *const *data;         // n feed buffers
  const uint64_t *nbytes;    // their sizes
  const int64_t *dims;       // the feeds' shapes, back to back
  const int32_t *ranks;      // n ranks
  void *const *out;          // n_out output buffers
  const uint64_t *out_bytes; // their sizes
  char *error;               // the failure's text
  uint64_t error_len;
};

// Runs the model on call's feeds (validated by the caller against the model's declaration: dtype, rank, fixed
// dimensions, row cap). Outputs: copied into the caller's buffers (as msrl_lite_fetch); without buffers (n_out = 0:
// the first call at these shapes, whose output shapes Lite only knows after running) they stay in Lite's tensors
// for msrl_lite_describe and msrl_lite_fetch. 0 ok; 1 a feed or buffer does not fit; 2 Lite failed.
int msrl_lite_predict(const msrl_lite_call *call) {
  auto *h = static_cast<Handle *>(call->handle);
  const int n = call->n;
  if (static_cast<size_t>(n) != h->inputs.size()) {
    Put(call->error, call->error_len,
        "expected " + std::to_string(h->inputs.size()) + " inputs, got " + std::to_string(n));
    return 1;
  }
  std::string err = EnsureShapes(h, n, call->dims, call->ranks);
  if (!err.empty()) {
    Put(call->error, call->error_len, err);
    return 2;
  }
  for (int i = 0; i < n; ++i) {
    if (call->nbytes[i] == 0) continue;
    void *dst = h->inputs[i].MutableData();
    if (dst == nullptr || h->inputs[i].DataSize() != call->nbytes[i]) {
      Put(call->error, call->error_len,
          "input '" + h->inputs[i].Name() + "': " + std::to_string(call->nbytes[i]) +
              " bytes do not fill the model's input of " + std::to_string(h->inputs[i].DataSize()) + " bytes");
      return 1;
    }
    std::memcpy(dst, call->data[i], call->nbytes[i]);
  }
  if (h->follow && h->count.HandsOff(h->inline_actors)) h->follower.Follow();  // Lite's thread works: keep it close
  h->predicted = true;
  const mindspore::Status st = msrl::PredictHere(h->model.get(), h->inputs, &h->outputs, h->inline_actors, &h->count);
  if (st.IsError()) {
    Put(call->error, call->error_len, "predict failed: " + msrl::OneLine(st.ToString()));
    return 2;
  }
  if (call->n_out == 0) return 0;
  return msrl_lite_fetch(h, call->n_out, call->out, call->out_bytes, call->error, call->error_len);
}

void msrl_lite_close(void *handle) { delete static_cast<Handle *>(handle); }

}  // extern "C"
