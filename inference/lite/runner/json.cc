#include "json.h"

#include <cstdio>

#include "protocol.h"

namespace msrl {

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

}  // namespace msrl
