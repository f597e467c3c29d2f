// The few JSON pieces the runner writes (handshake line, --info): hand-written, the runner links nothing else.
#pragma once

#include <string>
#include <vector>

#include "include/api/types.h"

namespace msrl {

// A JSON string literal with quotes and escapes.
std::string JsonStr(const std::string &s);
// Newlines folded to spaces, trailing blanks dropped: every error stays one line for the client.
std::string OneLine(std::string s);
// [{"name", "dtype", "shape"}, ...] as the Python client's TensorMeta expects.
std::string TensorsJson(const std::vector<mindspore::MSTensor> &ts);

}  // namespace msrl
