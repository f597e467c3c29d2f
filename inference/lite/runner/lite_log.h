// Lite reports failures through its glog output, not through the returned Status: capture the output around a
// call and pick out the line that names the root cause. Shared by the runner, libmsrl-lite.so and the converter.
#pragma once

#include <string>

namespace msrl {

class LogCapture {
 public:
  // Captures stderr, and stdout too when `with_stdout` (the converter prints a banner there).
  explicit LogCapture(bool with_stdout = false);
  // Restores the streams and returns the captured text; `replay` writes it back to stderr, which stays the
  // diagnostics channel.
  std::string Release(bool replay = true);

 private:
  int fd_ = -1;
  int saved_err_ = -1;
  int saved_out_ = -1;
};

// glog line: "[ERROR] ME(pid,...):date [file:line] func] message" -> "message".
std::string LogMessage(const std::string &line);

// The first [ERROR] names the root cause; later ones only unwind the call chain. MindSpore's generic
// "null exception handler" line precedes the real exception text, so it is skipped.
std::string FirstErrorLine(const std::string &log);

}  // namespace msrl
