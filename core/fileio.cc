#include "core/fileio.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace mlafuzz {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw std::runtime_error(what + " '" + path + "': " + std::strerror(err));
}

// Closes the descriptor on every path out of write_file_atomic.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void write_file_atomic(const std::string& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  // Same folder as the target, so the rename never crosses file systems.
  // Built by appends: GCC 12 warns falsely (-Wrestrict) on "." + string + "...".
  std::string name(1, '.');
  name.append(target.filename().string());
  name.append(".tmpXXXXXX");
  std::string tmp = (dir / name).string();
  Fd f;
  f.fd = ::mkstemp(tmp.data());
  if (f.fd < 0) fail("cannot create a temporary file next to", path, errno);
  auto discard = [&](const char* what) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(what, path, err);
  };
  // mkstemp creates 0600; give the file the usual permissions (subject to umask).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(f.fd, 0666 & ~mask) != 0) discard("cannot set permissions of");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      discard("cannot write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(f.fd) != 0) discard("cannot sync");
  if (::close(f.fd) != 0) {
    f.fd = -1;
    discard("cannot close");
  }
  f.fd = -1;
  if (::rename(tmp.c_str(), path.c_str()) != 0) discard("cannot rename a temporary file onto");
  // Persist the directory entry too, so the rename survives a power cut.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string read_file(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY);
  if (f.fd < 0) fail("cannot open", path, errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail("cannot stat", path, errno);
  if (S_ISDIR(st.st_mode)) throw std::runtime_error("cannot read '" + path + "': is a folder");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot read", path, errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw std::runtime_error("cannot create folder '" + path + "': " + ec.message());
  if (!std::filesystem::is_directory(path)) {
    throw std::runtime_error("cannot create folder '" + path + "': a file is in the way");
  }
}

std::string utc_now_iso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

}  // namespace mlafuzz
