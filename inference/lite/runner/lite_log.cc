#include "lite_log.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>

#include "protocol.h"

namespace msrl {

LogCapture::LogCapture(bool with_stdout) {
  std::fflush(stdout);
  std::fflush(stderr);
  char tmpl[] = "/tmp/msrl-lite-log-XXXXXX";
  fd_ = mkstemp(tmpl);
  if (fd_ < 0) return;
  unlink(tmpl);
  saved_err_ = dup(STDERR_FILENO);
  dup2(fd_, STDERR_FILENO);
  if (with_stdout) {
    saved_out_ = dup(STDOUT_FILENO);
    dup2(fd_, STDOUT_FILENO);
  }
}

std::string LogCapture::Release(bool replay) {
  if (fd_ < 0) return "";
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(saved_err_, STDERR_FILENO);
  close(saved_err_);
  if (saved_out_ >= 0) {
    dup2(saved_out_, STDOUT_FILENO);
    close(saved_out_);
  }
  std::string text;
  char buf[65536];
  lseek(fd_, 0, SEEK_SET);
  for (ssize_t n; (n = read(fd_, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  close(fd_);
  fd_ = -1;
  if (replay) WriteAll(STDERR_FILENO, text.data(), text.size());
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
