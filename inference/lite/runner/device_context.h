// The device part of a Lite context, one home for the runner (main.cc) and the in-process library (inprocess.cc):
// the CPU, or Ascend with the precision mode the bundle names (AscendDeviceInfo::SetPrecisionMode), never Lite's
// default. Lite's Ascend default, enforce_fp16, computes a float32 graph in fp16, so an Ascend context without a
// mode is refused. On the CPU, precision mode enforce_fp16 asks for Lite's fp16 kernels (CPUDeviceInfo::
// SetEnableFP16), which only its ARM builds have; an x86_64 build computes in float32 either way.
#pragma once

#include <cstdint>
#include <string>

#include "include/api/context.h"

namespace msrl {

// Adds the device info to ctx. Returns "" on success, else the one-line reason (an unknown device or mode, or an
// Ascend device without a mode).
std::string ConfigureDevice(mindspore::Context *ctx, const std::string &device, uint32_t device_id,
                            const std::string &precision_mode);

// The context's device as Lite's objects hold it now (read back, not echoed): JSON fields
// "device", "device_id", "precision_mode", "enable_fp16".
std::string DescribeDevice(const mindspore::Context &ctx);

}  // namespace msrl
