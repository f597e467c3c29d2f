// Models kept for the input shapes they ran at. Lite 2.0.0 corrupts its heap resizing some graphs after a Predict
// (a broadcast Sub on [1, batch, n], a one-step GRU's graph), so a new batch runs on a model built again, and a model
// that ran at some shapes serves them again without a resize: a caller alternating a few batches builds each once.
// The runner (server.cc) and the in-process library (inprocess.cc) both keep them here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "include/api/model.h"

namespace msrl {

class KeptModels {
 public:
  using Shapes = std::vector<std::vector<int64_t>>;
  static constexpr size_t kKept = 3;  // besides the model in use

  // The model that ran at ``shapes`` before, taken out of the kept ones (nullptr: none).
  std::unique_ptr<mindspore::Model> Take(const Shapes &shapes) {
    auto it = std::find_if(kept_.begin(), kept_.end(), [&](const auto &k) { return k.first == shapes; });
    if (it == kept_.end()) return nullptr;
    std::unique_ptr<mindspore::Model> model = std::move(it->second);
    kept_.erase(it);
    return model;
  }

  // Keeps ``model`` for the ``shapes`` it ran at, the least recently used dropped beyond kKept.
  void Keep(Shapes shapes, std::unique_ptr<mindspore::Model> model) {
    kept_.emplace_back(std::move(shapes), std::move(model));
    if (kept_.size() > kKept) kept_.erase(kept_.begin());
  }

 private:
  std::vector<std::pair<Shapes, std::unique_ptr<mindspore::Model>>> kept_;  // the most recently used last
};

}  // namespace msrl
