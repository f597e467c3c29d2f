// Lite reports load failures through its glog output, not through the returned Status: capture stderr around
// a call and pick out the line that names the root cause.
#pragma once

#include <string>

namespace msrl {

class StderrCapture {
 public:
  StderrCapture();
  // Restores stderr, replays the captured text to it (it stays the diagnostics channel) and returns it.
  std::string Release();

 private:
  int fd_ = -1;
  int saved_ = -1;
};

// glog line: "[ERROR] ME(pid,...):date [file:line] func] message" -> "message".
std::string LogMessage(const std::string &line);

// The first [ERROR] names the root cause; later ones only unwind the call chain. MindSpore's generic
// "null exception handler" line precedes the real exception text, so it is skipped.
std::string FirstErrorLine(const std::string &log);

}  // namespace msrl
