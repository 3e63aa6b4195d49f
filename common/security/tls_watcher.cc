#include "common/security/tls_watcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/storage/env.h"

namespace pstrain {

namespace {

TlsWatcher::Stamp StampOf(const std::string& path) {
  TlsWatcher::Stamp stamp;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    stamp.size = st.st_size;
    stamp.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    stamp.inode = static_cast<int64_t>(st.st_ino);
    stamp.device = static_cast<int64_t>(st.st_dev);
  }
  return stamp;
}

std::string Expiry(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M UTC", t, absl::UTCTimeZone());
}

// Removes a staging directory without following links: `current` and
// `current.tmp` are links into it, the generations hold plain files.
void RemoveStaging(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = JoinPath(dir, name);
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      RemoveStaging(path);
    } else {
      ::unlink(path.c_str());
    }
  }
  ::closedir(d);
  ::rmdir(dir.c_str());
}

// Staging directories whose process is gone (killed before it could remove
// its own): pstrain-tls-* in `base` whose `lock` file no process holds. A
// lock, not a process id: processes in other PID namespaces (containers
// sharing /dev/shm) cannot see each other's ids, but the kernel's locks
// are the same for all. A directory without a lock file (one being made:
// its lock is named only once it is held) is left alone.
void RemoveStaleStaging(const std::string& base) {
  DIR* d = ::opendir(base.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(d)) {
    if (!absl::StartsWith(e->d_name, "pstrain-tls-")) continue;
    const std::string path = JoinPath(base, e->d_name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) {
      continue;
    }
    const int fd = ::open(JoinPath(path, "lock").c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) stale.push_back(path);
    ::close(fd);  // (and with it the lock just taken)
  }
  ::closedir(d);
  for (const std::string& path : stale) RemoveStaging(path);
}

}  // namespace

absl::StatusOr<std::shared_ptr<TlsWatcher>> TlsWatcher::Start(const TlsFiles& files,
                                                              const std::string& identity,
                                                              absl::Duration interval,
                                                              bool background) {
  if (interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError("certificates are looked at once a second at most");
  }
  // In memory where the machine has it: the key copy never reaches a disk.
  const std::string base =
      ::access("/dev/shm", W_OK | X_OK) == 0 ? std::string("/dev/shm") : TempDirectory();
  RemoveStaleStaging(base);
  std::shared_ptr<TlsWatcher> w(new TlsWatcher());
  w->files_ = files;
  w->identity_ = identity;
  w->interval_ = interval;
  // Stamped before it is read: a change in between is seen at the first look.
  std::vector<Stamp> stamps = w->Stamps();
  ASSIGN_OR_RETURN(TlsConfig tls, LoadTls(files));
  if (tls.identity != identity) {
    return absl::InvalidArgumentError(absl::StrCat(files.cert_file, " is the certificate of \"",
                                                   tls.identity, "\", not of ", identity));
  }
  std::string dir = JoinPath(base, absl::StrCat("pstrain-tls-", ::getpid(), "-XXXXXX"));
  if (::mkdtemp(dir.data()) == nullptr) {  // mode 0700
    return absl::FailedPreconditionError(
        absl::StrCat("TLS: cannot make a staging directory in ", base, ": ", std::strerror(errno)));
  }
  w->staging_ = dir;
  // Held while this process lives: the sign that the directory is in use.
  // Locked under another name and then renamed, so that `lock` is never
  // seen unlocked: another process starting now would take the directory
  // for a dead one's and remove it (RemoveStaleStaging).
  const std::string unnamed = JoinPath(dir, "lock.new");
  w->lock_fd_ = ::open(unnamed.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (w->lock_fd_ < 0 || ::flock(w->lock_fd_, LOCK_EX | LOCK_NB) != 0 ||
      ::rename(unnamed.c_str(), JoinPath(dir, "lock").c_str()) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("TLS: cannot lock ", dir, "/lock: ", std::strerror(errno)));
  }
  {
    absl::MutexLock lock(&w->mu_);
    w->stamps_ = std::move(stamps);
    RETURN_IF_ERROR(w->Stage(tls));
    w->current_ = std::make_shared<const TlsConfig>(std::move(tls));
  }
  const std::string current = JoinPath(dir, "current");
  w->provider_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      JoinPath(current, "key.pem"), JoinPath(current, "cert.pem"), JoinPath(current, "ca.crt"),
      static_cast<unsigned int>(absl::ToInt64Seconds(interval)));
  if (background) {
    w->thread_ = std::thread([raw = w.get()] {
      for (;;) {
        {
          absl::MutexLock lock(&raw->mu_);
          if (raw->mu_.AwaitWithTimeout(absl::Condition(&raw->stopping_), raw->interval_)) return;
        }
        raw->CheckNow();
      }
    });
  }
  return w;
}

void TlsWatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

TlsWatcher::~TlsWatcher() {
  Stop();
  provider_.reset();
  if (!staging_.empty()) RemoveStaging(staging_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::shared_ptr<const TlsConfig> TlsWatcher::current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

std::vector<TlsWatcher::Stamp> TlsWatcher::Stamps() const {
  return {StampOf(files_.ca_file), StampOf(files_.cert_file), StampOf(files_.key_file)};
}

absl::Status TlsWatcher::Stage(const TlsConfig& tls) {
  // A new generation directory, then the `current` link swapped onto it in
  // one rename: gRPC reads a whole generation or the one before. The one
  // before stays until the next swap, for a read still under way.
  const int gen = ++generation_;
  const std::string name = absl::StrCat("g", gen);
  const std::string dir = JoinPath(staging_, name);
  if (::mkdir(dir.c_str(), 0700) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("TLS: cannot make ", dir, ": ", std::strerror(errno)));
  }
  const std::string link = JoinPath(staging_, "current.tmp");
  absl::Status st = WritePrivateFile(JoinPath(dir, "ca.crt"), tls.ca_pem);
  if (st.ok()) st = WritePrivateFile(JoinPath(dir, "cert.pem"), tls.cert_pem);
  if (st.ok()) st = WritePrivateFile(JoinPath(dir, "key.pem"), tls.key_pem);
  ::unlink(link.c_str());
  if (st.ok() && (::symlink(name.c_str(), link.c_str()) != 0 ||
                  ::rename(link.c_str(), JoinPath(staging_, "current").c_str()) != 0)) {
    st = absl::FailedPreconditionError(
        absl::StrCat("TLS: cannot switch ", staging_, " to ", name, ": ", std::strerror(errno)));
  }
  if (!st.ok()) {
    ::unlink(link.c_str());
    RemoveStaging(dir);
    return st;
  }
  if (previous_generation_ > 0) {
    RemoveStaging(JoinPath(staging_, absl::StrCat("g", previous_generation_)));
  }
  previous_generation_ = current_generation_;
  current_generation_ = gen;
  return absl::OkStatus();
}

bool TlsWatcher::CheckNow() {
  const std::vector<Stamp> stamps = Stamps();
  {
    absl::MutexLock lock(&mu_);
    if (stamps == stamps_) return false;
    stamps_ = stamps;  // refused material is not read again until it changes
  }
  absl::StatusOr<TlsConfig> tls = LoadTls(files_);
  if (tls.ok() && tls->identity != identity_) {
    tls = absl::InvalidArgumentError(absl::StrCat(files_.cert_file, " is now the certificate of \"",
                                                  tls->identity, "\", not of ", identity_));
  }
  absl::Status st = tls.status();
  if (st.ok()) {
    absl::MutexLock lock(&mu_);
    st = Stage(*tls);
    if (st.ok()) current_ = std::make_shared<const TlsConfig>(*tls);
  }
  if (!st.ok()) {
    refusals_.fetch_add(1, std::memory_order_relaxed);
    LOG_WARN("TLS: the changed certificate files are refused, the current ones stay in use: {}",
             st.message());
    return false;
  }
  reloads_.fetch_add(1, std::memory_order_relaxed);
  LOG_INFO("TLS: took the renewed certificate of {} from {}, valid until {}", identity_,
           files_.cert_file, Expiry(tls->not_after));
  if (tls->not_after - absl::Now() < absl::Hours(24 * 7)) {
    LOG_WARN("the renewed certificate or its CA expires within a week, {}",
             Expiry(tls->not_after));
  }
  return true;
}

}  // namespace pstrain
