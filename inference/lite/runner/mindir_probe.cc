#include "mindir_probe.h"

#include <memory>
#include <vector>

#include "errors.h"
#include "include/api/context.h"
#include "include/api/model.h"
#include "json.h"
#include "lite_log.h"

namespace msrl {

namespace {

void PutVarint(std::vector<uint8_t> *out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<uint8_t>(v));
}

void PutString(std::vector<uint8_t> *out, uint32_t field, const std::string &s) {
  PutVarint(out, (field << 3) | 2);
  PutVarint(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

}  // namespace

int64_t ProbeMaxMindIRVersion(std::string *detail) {
  constexpr int64_t kBeyondAny = 0x7fffffff;
  std::vector<uint8_t> header;
  PutString(&header, 2, "MindSpore");   // ModelProto.producer_name
  PutString(&header, 5, "msrl-probe");  // ModelProto.model_version
  PutVarint(&header, (13 << 3) | 0);    // ModelProto.mind_ir_version
  PutVarint(&header, kBeyondAny);

  auto ctx = std::make_shared<mindspore::Context>();
  auto cpu = std::make_shared<mindspore::CPUDeviceInfo>();
  ctx->MutableDeviceInfo().push_back(cpu);
  mindspore::Model model;
  LogCapture capture;
  const mindspore::Status st = model.Build(header.data(), header.size(), mindspore::kMindIR, ctx);
  const std::string log = capture.Release();
  int64_t max_version = -1, file_version = -1;
  if (ParseMindIRRefusal(log, &max_version, &file_version) && file_version == kBeyondAny) {
    *detail = "Lite's own refusal of a MindIR v" + std::to_string(kBeyondAny) + " header";
    return max_version;
  }
  *detail = st.IsOk() ? "Lite accepted a MindIR header of any version (no version check)"
                      : "Lite refused the probe without naming its maximum: " + OneLine(FirstErrorLine(log));
  return -1;
}

}  // namespace msrl
