// One Predict, as the runner and the in-process library both run it (so the two give the same bits): the graph
// on the calling thread (inline_run.h), in the float mode Lite's workers compute in, and Lite's own output tensors
// handed back (an empty `outputs` spares Lite converting the previous call's first).
#pragma once

#include <vector>

#include "include/api/model.h"
#include "include/api/types.h"
#include "inline_run.h"

namespace msrl {

inline mindspore::Status PredictHere(mindspore::Model *model, const std::vector<mindspore::MSTensor> &inputs,
                                     std::vector<mindspore::MSTensor> *outputs, bool inline_actors,
                                     const mindspore::MSKernelCallBack &after = nullptr) {
  FloatMode lite_mode(FloatMode::kFlushDenormals);  // restored after: the caller's own arithmetic keeps its mode
  InlineScope inline_run(inline_actors);
  outputs->clear();
  return model->Predict(inputs, outputs, nullptr, after);
}

}  // namespace msrl
