#include "core/command.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "core/settings.h"

namespace mlafuzz {

std::string executable_path() {
  std::string buf(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return "";
  buf.resize(static_cast<size_t>(n));
  return buf;
}

std::string shell_word(const std::string& s) {
  const auto safe = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("_-.,:/=+@%~").find(c) != std::string_view::npos;
  };
  bool plain = !s.empty() && s[0] != '~';  // a leading ~ would expand to a home folder
  for (const char c : s) plain = plain && safe(c);
  if (plain) return s;
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string command_to_run_again() {
  if (auto e = settings::text("MLAFUZZ_COMMAND")) return *e;
  std::string cmd;
  for (const char* var : {"MLAFUZZ_PYTHON", "MLAFUZZ_PYTHON_PACKAGE_DIR"}) {
    if (auto v = settings::text(var)) cmd += std::string(var) + "=" + shell_word(*v) + " ";
  }
  const std::string exe = executable_path();
  return cmd + (exe.empty() ? std::string("mlafuzz") : shell_word(exe));
}

}  // namespace mlafuzz
