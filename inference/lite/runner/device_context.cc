#include "device_context.h"

#include <memory>

#include "json.h"

namespace msrl {

namespace {
constexpr const char *kAscendModes[] = {"enforce_fp32", "enforce_origin", "preferred_fp32", "preferred_optimal",
                                        "enforce_fp16"};

bool IsAscendMode(const std::string &mode) {
  for (const char *m : kAscendModes) {
    if (mode == m) return true;
  }
  return false;
}
}  // namespace

std::string ConfigureDevice(mindspore::Context *ctx, const std::string &device, uint32_t device_id,
                            const std::string &precision_mode) {
  if (device == "ascend") {
    if (precision_mode.empty()) {
      return "device ascend without a precision mode: Lite would use its default, enforce_fp16 (a float32 graph "
             "computed in fp16); pass the bundle's mode (--precision-mode enforce_origin keeps float32)";
    }
    if (!IsAscendMode(precision_mode)) {
      return "precision mode '" + precision_mode +
             "' is not one of enforce_fp32, enforce_origin, preferred_fp32, preferred_optimal, enforce_fp16";
    }
    auto info = std::make_shared<mindspore::AscendDeviceInfo>();
    info->SetDeviceID(device_id);
    info->SetPrecisionMode(precision_mode);
    ctx->MutableDeviceInfo().push_back(info);
    return "";
  }
  if (device != "cpu") return "device must be cpu or ascend";
  if (!precision_mode.empty() && precision_mode != "enforce_fp32" && precision_mode != "enforce_fp16") {
    return "precision mode '" + precision_mode + "' on the CPU must be enforce_fp32 or enforce_fp16";
  }
  auto info = std::make_shared<mindspore::CPUDeviceInfo>();
  info->SetEnableFP16(precision_mode == "enforce_fp16");
  ctx->MutableDeviceInfo().push_back(info);
  return "";
}

std::string DescribeDevice(const mindspore::Context &ctx) {
  auto &infos = const_cast<mindspore::Context &>(ctx).MutableDeviceInfo();
  if (infos.empty()) return "\"device\": null";
  const auto &info = infos.front();
  if (auto ascend = info->Cast<mindspore::AscendDeviceInfo>()) {
    return "\"device\": \"ascend\", \"device_id\": " + std::to_string(ascend->GetDeviceID()) +
           ", \"precision_mode\": " + JsonStr(ascend->GetPrecisionMode()) + ", \"enable_fp16\": null";
  }
  auto cpu = info->Cast<mindspore::CPUDeviceInfo>();
  const bool fp16 = cpu && cpu->GetEnableFP16();
  return std::string("\"device\": \"cpu\", \"device_id\": 0, \"precision_mode\": ") +
         (fp16 ? "\"enforce_fp16\"" : "null") + ", \"enable_fp16\": " + (fp16 ? "true" : "false");
}

}  // namespace msrl
