// One Predict, as the runner and the in-process library both run it (so the two give the same bits): the graph
// on the calling thread (inline_run.h), in the float mode Lite's workers compute in, and Lite's own output tensors
// handed back (an empty `outputs` spares Lite converting the previous call's first).
#pragma once

#include <cstdint>
#include <vector>

#include "include/api/model.h"
#include "include/api/types.h"
#include "inline_run.h"

namespace msrl {

// One model's Predict calls and how many of them ran their graph on the calling thread: whether a model runs
// inline is known per model (another model of the process may run on Lite's actor thread).
struct InlineCount {
  uint64_t calls = 0;
  uint64_t inline_calls = 0;
  bool last_inline = false;
  // Whether the next call is expected on Lite's actor thread (its thread then worth pinning, pinning.h): as asked
  // before the first call, then as the last call went.
  bool HandsOff(bool inline_wanted) const { return calls == 0 ? !inline_wanted : !last_inline; }
};

inline mindspore::Status PredictHere(mindspore::Model *model, const std::vector<mindspore::MSTensor> &inputs,
                                     std::vector<mindspore::MSTensor> *outputs, bool inline_actors,
                                     InlineCount *count, const mindspore::MSKernelCallBack &after = nullptr) {
  FloatMode lite_mode(FloatMode::kFlushDenormals);  // restored after: the caller's own arithmetic keeps its mode
  InlineScope inline_run(inline_actors);
  outputs->clear();
  mindspore::Status st = model->Predict(inputs, outputs, nullptr, after);
  ++count->calls;
  count->last_inline = inline_run.ran();
  count->inline_calls += count->last_inline;
  return st;
}

}  // namespace msrl
