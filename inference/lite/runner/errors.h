// Handshake failures: each kind of load failure gets its own exit code and "kind" in the JSON line, so the
// client (common._KIND_ERRORS) can raise a distinct exception without parsing prose.
#pragma once

#include <cstdint>
#include <string>

#include "include/api/status.h"

namespace msrl {

enum Exit : int {
  kExitArgs = 2,
  kExitMissing = 3,
  kExitLoad = 4,
  kExitMindIR = 5,
  kExitDevice = 6,
  kExitProtocol = 7,  // the request stream became unreadable; exits after one error frame
};

struct LoadFailure {
  Exit code = kExitLoad;
  const char *kind = "load";
  std::string message;
  int64_t mind_ir_version = -1;      // the file's, as Lite read it (mindir_version failures only)
  int64_t max_mind_ir_version = -1;  // the most this Lite reads (mindir_version failures only)
};

// The protocol channel (a private dup of the original stdout) that handshake lines go to.
void SetProtocolFd(int fd);
int ProtocolFd();

[[noreturn]] void FailHandshake(const LoadFailure &failure);
[[noreturn]] void FailHandshake(Exit code, const char *kind, const std::string &msg);

// Lite's own refusal of a too-new MindIR: "maximum mind ir version: M ... mind ir version: F".
bool ParseMindIRRefusal(const std::string &log, int64_t *max_version, int64_t *file_version);

// Sorts a failed Model::Build into a kind from the captured Lite log and the request.
LoadFailure ClassifyLoadFailure(const std::string &log, const mindspore::Status &status, const std::string &model,
                                const std::string &device, uint32_t device_id, const std::string &lite_version);

}  // namespace msrl
