// Which MindIR versions this Lite accepts, asked of Lite itself.
//
// MindSpore's loader (load_model.cc, CheckModelConfigureInfo) accepts a ModelProto iff
// mind_ir::Version_IsValid(mind_ir_version), i.e. 0 <= v <= mind_ir::Version_MAX of the mind_ir.proto compiled
// into that build, and its refusal names Version_MAX. The probe hands Lite a header-only MindIR (producer_name,
// model_version, mind_ir_version = 2^31-1) and reads the maximum back from that refusal. The runner itself never
// parses MindIR files: reading a file's version is inference/bundle/mindir.py's job (one reading rule).
#pragma once

#include <cstdint>
#include <string>

namespace msrl {

// Version_MAX of the linked Lite, or -1 with *detail saying why it could not be told.
int64_t ProbeMaxMindIRVersion(std::string *detail);

}  // namespace msrl
