// The request loop: reads infer/tap/ping/stats/quit frames, validates feeds against the model's inputs, runs Predict
// and writes the response frame. A tap request runs the same Predict with a callback after every kernel and
// answers with each kernel's name, type and outputs (layer localisation).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "include/api/model.h"
#include "kept_models.h"
#include "pinning.h"
#include "predict.h"
#include "protocol.h"
#include "request_hook.h"

namespace msrl {

struct ServerOptions {
  bool follow = false;          // pin Lite's worker thread to the serving thread's CPU (pinning.h)
  bool inline_actors = false;   // run Lite's graph on the serving thread (inline_run.h)
  uint64_t max_rows = 0;        // largest batch (first dimension) a request may carry; refused beyond it
  RequestHook hook = nullptr;
  // Builds the model afresh (nullptr: it could not). Lite 2.0.0 corrupts its heap resizing some graphs after a
  // Predict (a broadcast Sub on [1, batch, n], a one-step GRU's graph: "double free", SIGSEGV at the next batch),
  // while a model built and resized once before its first Predict runs any batch; so a new batch after a Predict
  // runs on a model built again (or on the one that ran at that batch before, kept). Lite builds an fp16 .ms once
  // per process ("can not find tensor data in origin tensor data"): such a model is resized as it is.
  std::function<std::unique_ptr<mindspore::Model>()> rebuild;
};

class Server {
 public:
  Server(std::unique_ptr<mindspore::Model> model, int in_fd, int out_fd, const ServerOptions &options);
  // Serves until quit/EOF (returns 0) or until the stream cannot be trusted (returns kExitProtocol).
  int Run();

 private:
  struct Feed {
    uint32_t dtype = 0;
    std::vector<int64_t> dims;
    uint64_t nbytes = 0;
    std::vector<uint8_t> data;
  };

  int Desync(const std::string &msg);
  void Error(uint32_t status, const std::string &msg);
  bool Infer(bool tap);
  void Stats();
  std::string Validate(uint32_t n) const;
  std::string Predict(uint32_t n, bool tap);
  static void PutTensor(Writer *w, mindspore::MSTensor *t);
  void ReleaseLargeBuffers(uint32_t n);

  std::unique_ptr<mindspore::Model> model_;
  KeptModels kept_;  // models that ran at other shapes (kept_models.h)
  bool predicted_ = false;    // model_ has run a Predict at its current shapes
  bool rebuildable_ = true;   // false once Lite refused to build it again (an fp16 .ms)
  Reader in_;
  int out_fd_;
  Writer out_;
  ServerOptions options_;
  std::vector<mindspore::MSTensor> inputs_, outputs_;
  std::vector<std::vector<int64_t>> declared_, current_;
  std::vector<Feed> feeds_;
  std::vector<uint8_t> taps_;  // tap requests: every kernel's outputs, framed as the response body
  ThreadFollower follower_;
  InlineCount count_;  // this model's Predict calls and how many ran on the serving thread (a stats request)
};

}  // namespace msrl
