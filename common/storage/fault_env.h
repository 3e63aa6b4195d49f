// An Env for tests that injects the faults a disk and a power cut cause,
// over the real file system (after LevelDB's FaultInjectionTestEnv):
//   - a crash at the k-th mutating operation: that operation and every later
//     one fail with UNAVAILABLE, and each file written since its last fsync
//     is cut to a torn length (half of its unsynced bytes stay), as after a
//     power cut; a test then reads what is left with Env::Default();
//   - a full disk: appends and writes past a byte budget fail with
//     RESOURCE_EXHAUSTED ("No space left on device"), the bytes that fit
//     written, as write(2) does;
//   - a failing disk: reads of files opened with NewRandomRWFile (a table's
//     disk tier) fail with an I/O error from the k-th on.
// Mutating operations: NewWritableFile, Append, WriteAt, Sync, Close, WriteFile,
// RenameFile, SyncDir, CreateDirs, DeleteFile, DeleteDir, NewRandomRWFile
// and its writes (which a crash does not tear: such files are never
// fsynced, nothing expects them to survive). Reads pass through. Thread-safe.
#ifndef PSTRAIN_COMMON_STORAGE_FAULT_ENV_H_
#define PSTRAIN_COMMON_STORAGE_FAULT_ENV_H_

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/storage/env.h"

namespace pstrain {

class FaultEnv : public Env {
 public:
  explicit FaultEnv(Env* base) : base_(base) {}

  // Crash at mutating operation `k` (0 is the first from now on; a negative
  // k never crashes).
  void CrashAtOperation(int64_t k);
  // At most `bytes` more bytes are written in all.
  void SetDiskSpace(int64_t bytes);
  // Reads of random-access files fail from the k-th from now on (0: the
  // next); a negative k never fails them.
  void FailReadsFrom(int64_t k);
  int64_t operations() const;     // mutating operations so far
  int64_t bytes_written() const;  // bytes written so far
  bool crashed() const;

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    return base_->ReadFile(path);
  }
  absl::Status WriteFile(const std::string& path, absl::string_view data, bool sync) override;
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status CreateDirs(const std::string& dir) override;
  absl::Status DeleteFile(const std::string& path) override;
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<RandomRWFile>> NewRandomRWFile(const std::string& path) override;
  absl::StatusOr<std::string> ReadFileRange(const std::string& path, int64_t offset,
                                            int64_t n) override {
    return base_->ReadFileRange(path, offset, n);
  }
  absl::Status ReadFileRangeInto(const std::string& path, int64_t offset, int64_t n,
                                 char* dst) override {
    return base_->ReadFileRangeInto(path, offset, n, dst);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }
  absl::StatusOr<int64_t> FileSize(const std::string& path) override {
    return base_->FileSize(path);
  }
  bool IsDirectory(const std::string& path) override { return base_->IsDirectory(path); }
  absl::Status DeleteDir(const std::string& dir) override;

 private:
  friend class FaultWritableFile;
  friend class FaultRandomRWFile;
  // Counts one read of a random-access file; an error from the k-th on.
  absl::Status Read(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts one mutating operation; an error once the crash point is reached
  // (which it also carries out).
  absl::Status Operation(const std::string& what) ABSL_LOCKS_EXCLUDED(mu_);
  void CrashLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many of `n` bytes fit; RESOURCE_EXHAUSTED when fewer than n.
  absl::Status Reserve(const std::string& path, int64_t n, int64_t* fit) ABSL_LOCKS_EXCLUDED(mu_);
  void Written(const std::string& path, int64_t n, bool synced) ABSL_LOCKS_EXCLUDED(mu_);
  void Synced(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);

  Env* const base_;
  mutable absl::Mutex mu_;
  int64_t ops_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t crash_at_ ABSL_GUARDED_BY(mu_) = -1;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t space_ ABSL_GUARDED_BY(mu_) = std::numeric_limits<int64_t>::max();
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reads_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fail_reads_from_ ABSL_GUARDED_BY(mu_) = -1;
  // Each file written through this Env: its size and the part fsynced.
  struct FileState {
    int64_t size = 0;
    int64_t synced = 0;
  };
  std::map<std::string, FileState> files_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_STORAGE_FAULT_ENV_H_
