#include "lite_log.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>

#include "protocol.h"

namespace msrl {

StderrCapture::StderrCapture() {
  std::fflush(stderr);
  char tmpl[] = "/tmp/msrl-lite-runner-XXXXXX";
  fd_ = mkstemp(tmpl);
  if (fd_ < 0) return;
  unlink(tmpl);
  saved_ = dup(STDERR_FILENO);
  dup2(fd_, STDERR_FILENO);
}

std::string StderrCapture::Release() {
  if (fd_ < 0) return "";
  std::fflush(stderr);
  dup2(saved_, STDERR_FILENO);
  close(saved_);
  std::string text;
  char buf[65536];
  lseek(fd_, 0, SEEK_SET);
  for (ssize_t n; (n = read(fd_, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  close(fd_);
  fd_ = -1;
  WriteAll(STDERR_FILENO, text.data(), text.size());
  return text;
}

std::string LogMessage(const std::string &line) {
  const size_t file_end = line.find("] ", line.find(" ["));
  const size_t func_end = file_end == std::string::npos ? file_end : line.find("] ", file_end + 2);
  return func_end == std::string::npos ? line : line.substr(func_end + 2);
}

std::string FirstErrorLine(const std::string &log) {
  size_t start = 0;
  while (start < log.size()) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    const std::string line = log.substr(start, end - start);
    if (line.rfind("[ERROR]", 0) == 0 && line.find("null exception handler") == std::string::npos) {
      return LogMessage(line);
    }
    start = end + 1;
  }
  return "";
}

}  // namespace msrl
