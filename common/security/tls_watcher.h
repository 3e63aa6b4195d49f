// Certificates renewed in place, for every daemon that serves or calls over
// mutual TLS (common/security/tls.h): the task's files watched, renewed
// material checked and handed to gRPC and the monitoring endpoint.
// Thread-safe: the material is guarded by mu_; the watching thread and
// CheckNow take turns under it.
#ifndef PSTRAIN_COMMON_SECURITY_TLS_WATCHER_H_
#define PSTRAIN_COMMON_SECURITY_TLS_WATCHER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/security/tls.h"
#include "grpcpp/security/tls_certificate_provider.h"

namespace pstrain {

// Certificates renewed in place, without restarting the task. Every
// `interval` (on a thread of its own, unless `background` is false: then
// only CheckNow does) it looks at the task's three files (size, time, inode: a
// Kubernetes secret's symlink swap counts); when one changed it reads them
// with LoadTls, and takes them only when they pass and are still the
// certificate of the same identity. Taken material goes to gRPC through a
// private staging directory (mode 0700, in /dev/shm where there is one, so
// the key stays off disk; should the process die without removing it, the
// next watcher on the machine does, once no process holds its lock file)
// whose `current` link is swapped atomically, the
// way gRPC's FileWatcherCertificateProvider asks for, so gRPC never reads
// a key and a certificate that do not match; and to the monitoring endpoint
// through current(). Refused material is logged once (its files' stamps
// are kept) and the current material stays. New connections use the new
// certificate within two intervals (gRPC rereads the staging directory on
// the same interval); connections already open keep theirs.
class TlsWatcher {
 public:
  // Reads `files` (LoadTls), which must be the certificate of `identity`.
  static absl::StatusOr<std::shared_ptr<TlsWatcher>> Start(const TlsFiles& files,
                                                           const std::string& identity,
                                                           absl::Duration interval,
                                                           bool background = true);
  ~TlsWatcher();  // stops watching and removes the staging directory

  // The material in use now (its `watcher` is null).
  std::shared_ptr<const TlsConfig> current() const ABSL_LOCKS_EXCLUDED(mu_);
  // What gRPC credentials read the material from.
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider() const {
    return provider_;
  }
  // Looks at the files now; true when it took new material.
  bool CheckNow() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t reloads() const { return reloads_.load(std::memory_order_relaxed); }
  int64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }
  const std::string& staging_dir() const { return staging_; }

  // Stat results of a file: what tells that it changed.
  struct Stamp {
    int64_t size = -1, mtime_ns = -1, inode = -1, device = -1;
    bool operator==(const Stamp& o) const {
      return size == o.size && mtime_ns == o.mtime_ns && inode == o.inode && device == o.device;
    }
  };

 private:
  TlsWatcher() = default;
  absl::Status Stage(const TlsConfig& tls) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<Stamp> Stamps() const;

  TlsFiles files_;
  std::string identity_;
  std::string staging_;
  int lock_fd_ = -1;  // holds staging_/lock while this process lives
  absl::Duration interval_;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TlsConfig> current_ ABSL_GUARDED_BY(mu_);
  std::vector<Stamp> stamps_ ABSL_GUARDED_BY(mu_);
  int generation_ ABSL_GUARDED_BY(mu_) = 0;  // the last one made
  int current_generation_ ABSL_GUARDED_BY(mu_) = 0;
  int previous_generation_ ABSL_GUARDED_BY(mu_) = 0;  // kept for a read under way
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> reloads_{0}, refusals_{0};
  std::thread thread_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_SECURITY_TLS_WATCHER_H_
