#include "common/env.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pstrain {
namespace {

absl::Status IoError(const std::string& what, const std::string& path, int err) {
  std::string msg = absl::StrCat(what, " ", path, ": ", strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == ENOSPC) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

class PosixEnv : public Env {
 public:
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IoError("open", path, errno);
    std::string out;
    char buf[1 << 16];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int err = errno;
        ::close(fd);
        return IoError("read", path, err);
      }
      if (n == 0) break;
      out.append(buf, n);
    }
    ::close(fd);
    return out;
  }

  absl::Status WriteFile(const std::string& path, absl::string_view data, bool sync) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return IoError("open", path, errno);
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int err = errno;
        ::close(fd);
        return IoError("write", path, err);
      }
      p += n;
      left -= n;
    }
    if (sync && ::fsync(fd) != 0) {
      int err = errno;
      ::close(fd);
      return IoError("fsync", path, err);
    }
    if (::close(fd) != 0) return IoError("close", path, errno);
    return absl::OkStatus();
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return IoError("rename", from + " -> " + to, errno);
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return IoError("open dir", dir, errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return IoError("fsync dir", dir, err);
    return absl::OkStatus();
  }

  absl::Status CreateDirs(const std::string& dir) override {
    if (dir.empty()) return absl::OkStatus();
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
    }
    std::string parent = Dirname(dir);
    if (parent != dir) RETURN_IF_ERROR(CreateDirs(parent));
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return IoError("mkdir", dir, errno);
    return absl::OkStatus();
  }

  absl::Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return IoError("unlink", path, errno);
    return absl::OkStatus();
  }

  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }
};

}  // namespace

Env* Env::Default() {
  static Env* env = new PosixEnv();
  return env;
}

std::string Dirname(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (!b.empty() && b[0] == '/') return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

absl::Status WriteFileAtomically(Env* env, const std::string& path, absl::string_view data) {
  const std::string tmp = path + ".tmp";
  RETURN_IF_ERROR(env->WriteFile(tmp, data, /*sync=*/true));
  absl::Status st = env->RenameFile(tmp, path);
  if (!st.ok()) {
    (void)env->DeleteFile(tmp);
    return st;
  }
  return env->SyncDir(Dirname(path));
}

}  // namespace pstrain
