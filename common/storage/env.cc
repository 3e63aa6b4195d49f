#include "common/storage/env.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace pstrain {
namespace {

absl::Status IoError(const std::string& what, const std::string& path, int err) {
  std::string msg = absl::StrCat(what, " ", path, ": ", strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == ENOSPC) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(absl::string_view data) override { return WriteAt(end_, data); }

  absl::Status WriteAt(int64_t offset, absl::string_view data) override {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": closed"));
    const char* p = data.data();
    size_t left = data.size();
    int64_t at = offset;
    while (left > 0) {
      ssize_t n = ::pwrite(fd_, p, left, static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError("write", path_, errno);
      p += n;
      left -= static_cast<size_t>(n);
      at += n;
    }
    end_ = std::max(end_, at);
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": closed"));
    if (::fsync(fd_) != 0) return IoError("fsync", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (fd_ < 0) return absl::OkStatus();
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return IoError("close", path_, errno);
    return absl::OkStatus();
  }

 private:
  const std::string path_;
  int fd_;
  int64_t end_ = 0;  // the furthest byte written
};

class PosixRandomRWFile : public RandomRWFile {
 public:
  PosixRandomRWFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixRandomRWFile() override { ::close(fd_); }

  absl::Status Write(int64_t offset, absl::string_view data) override {
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      ssize_t n = ::pwrite(fd_, p, left, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError("write", path_, errno);
      p += n;
      left -= static_cast<size_t>(n);
      offset += n;
    }
    return absl::OkStatus();
  }

  void Prefetch(int64_t offset, int64_t n) override {
    (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(n),
                          POSIX_FADV_WILLNEED);
  }

  absl::Status Read(int64_t offset, int64_t n, char* dst) override {
    while (n > 0) {
      ssize_t got = ::pread(fd_, dst, static_cast<size_t>(n), static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return IoError("read", path_, errno);
      if (got == 0) {
        return absl::OutOfRangeError(absl::StrCat("read ", path_, ": ", n,
                                                  " bytes past the end at offset ", offset));
      }
      dst += got;
      n -= got;
      offset += got;
    }
    return absl::OkStatus();
  }

 private:
  const std::string path_;
  const int fd_;
};

class PosixEnv : public Env {
 public:
  absl::StatusOr<std::unique_ptr<RandomRWFile>> NewRandomRWFile(
      const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return IoError("open", path, errno);
    return std::make_unique<PosixRandomRWFile>(path, fd);
  }

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

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return IoError("open", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  absl::StatusOr<std::string> ReadFileRange(const std::string& path, int64_t offset,
                                            int64_t n) override {
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("read ", path, ": negative range"));
    std::string out(static_cast<size_t>(n), '\0');
    RETURN_IF_ERROR(ReadFileRangeInto(path, offset, n, out.data()));
    return out;
  }

  absl::Status ReadFileRangeInto(const std::string& path, int64_t offset, int64_t n,
                                 char* dst) override {
    if (offset < 0 || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("read ", path, ": negative range"));
    }
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IoError("open", path, errno);
    int64_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(fd, dst + got, static_cast<size_t>(n - got), offset + got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        int err = errno;
        ::close(fd);
        return IoError("read", path, err);
      }
      if (r == 0) break;
      got += r;
    }
    ::close(fd);
    if (got < n) {
      return absl::OutOfRangeError(absl::StrCat(path, ": ", n, " bytes at ", offset,
                                                " asked for, the file ends after ", got));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return IoError("opendir", dir, errno);
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    const int err = errno;
    ::closedir(d);
    if (err != 0) return IoError("readdir", dir, err);
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::StatusOr<int64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return IoError("stat", path, errno);
    return static_cast<int64_t>(st.st_size);
  }

  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  absl::Status DeleteDir(const std::string& dir) override {
    if (::rmdir(dir.c_str()) != 0) return IoError("rmdir", dir, errno);
    return absl::OkStatus();
  }
};

}  // namespace

Env* Env::Default() {
  static Env* env = new PosixEnv();
  return env;
}

std::string TempDirectory() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
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

absl::Status DeleteRecursively(Env* env, const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(dir));
  for (const std::string& name : names) {
    const std::string path = JoinPath(dir, name);
    if (env->IsDirectory(path)) {
      RETURN_IF_ERROR(DeleteRecursively(env, path));
    } else {
      RETURN_IF_ERROR(env->DeleteFile(path));
    }
  }
  return env->DeleteDir(dir);
}

absl::Status WritePrivateFile(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  // An existing temp file keeps its mode through O_CREAT: make it private.
  const bool ok =
      ::fchmod(fd, 0600) == 0 &&
      ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()) &&
      ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symlink";
  return "not a regular file";
}

}  // namespace

std::string RealPath(const std::string& path) {
  char* r = ::realpath(path.c_str(), nullptr);
  if (r == nullptr) return "";
  std::string out = r;
  std::free(r);
  return out;
}

absl::Status CheckContainedFile(const std::string& path, int64_t max_bytes) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return IoError("stat", path, errno);
  }
  if (S_ISLNK(st.st_mode)) {
    // A symlink may point within its own directory, no further.
    const std::string dir = RealPath(Dirname(path));
    const std::string target = RealPath(path);
    if (target.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": a symlink to nothing (dangling or a loop); refused"));
    }
    if (dir.empty() || Dirname(target) != dir) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": a symlink out of its directory; refused"));
    }
    if (::stat(path.c_str(), &st) != 0) return IoError("stat", path, errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": ", KindOf(st.st_mode), ", not a regular file; refused"));
  }
  if (st.st_size > max_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", st.st_size,
                                                      " bytes, more than such a file may be (",
                                                      max_bytes, "); refused"));
  }
  return absl::OkStatus();
}

absl::Status CheckWritableBelow(const std::string& root, const std::string& path) {
  const std::string prefix = root.empty() || root.back() == '/' ? root : root + "/";
  if (path.compare(0, prefix.size(), prefix) != 0 || path.size() == prefix.size()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not beneath ", root));
  }
  // Each component after root, the file itself, and its temporary.
  std::vector<std::string> checks;
  for (size_t at = path.find('/', prefix.size()); at != std::string::npos;
       at = path.find('/', at + 1)) {
    checks.push_back(path.substr(0, at));
  }
  checks.push_back(path);
  checks.push_back(path + ".tmp");
  for (const std::string& c : checks) {
    struct stat st;
    if (::lstat(c.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          c, " is a symlink: nothing is written through one beneath ", root));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadPrivateFile(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(err)));
  }
  const bool fits = S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) <= max_bytes;
  std::string text;
  bool read_all = false;
  if (fits) {
    text.resize(st.st_size);
    read_all = ::read(fd, text.data(), text.size()) == st.st_size;
  }
  ::close(fd);
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a key or secret file (a regular file of at most ", max_bytes, " bytes)"));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return absl::PermissionDeniedError(absl::StrCat(path, ": open to group or others (mode ", mode,
                                                    "); keys and secrets must be private: "
                                                    "chmod 600 ",
                                                    path));
  }
  if (!read_all) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return text;
}

absl::Status WriteFileAtomically(Env* env, const std::string& path, absl::string_view data) {
  const std::string tmp = path + ".tmp";
  absl::Status st = env->WriteFile(tmp, data, /*sync=*/true);
  if (st.ok()) st = env->RenameFile(tmp, path);
  if (!st.ok()) {  // a full disk, say: what was written of the temp file goes
    (void)env->DeleteFile(tmp);
    return st;
  }
  return env->SyncDir(Dirname(path));
}

absl::Status WriteFileStreamAtomically(Env* env, const std::string& path,
                                       const std::function<absl::Status(WritableFile*)>& write) {
  const std::string tmp = path + ".tmp";
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(tmp));
  absl::Status st = write(file.get());
  if (st.ok()) st = file->Sync();
  if (st.ok()) st = file->Close();
  if (st.ok()) st = env->RenameFile(tmp, path);
  if (!st.ok()) {
    file.reset();
    (void)env->DeleteFile(tmp);
    return st;
  }
  return env->SyncDir(Dirname(path));
}

}  // namespace pstrain
