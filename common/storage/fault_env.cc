#include "common/storage/fault_env.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace pstrain {

class FaultWritableFile : public WritableFile {
 public:
  FaultWritableFile(FaultEnv* env, std::string path, std::unique_ptr<WritableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}

  absl::Status Append(absl::string_view data) override {
    RETURN_IF_ERROR(env_->Operation("append " + path_));
    int64_t fit = 0;
    absl::Status space = env_->Reserve(path_, static_cast<int64_t>(data.size()), &fit);
    RETURN_IF_ERROR(base_->Append(data.substr(0, static_cast<size_t>(fit))));
    env_->Written(path_, fit, /*synced=*/false);
    return space;
  }
  absl::Status WriteAt(int64_t offset, absl::string_view data) override {
    RETURN_IF_ERROR(env_->Operation("write " + path_));
    int64_t fit = 0;
    absl::Status space = env_->Reserve(path_, static_cast<int64_t>(data.size()), &fit);
    RETURN_IF_ERROR(base_->WriteAt(offset, data.substr(0, static_cast<size_t>(fit))));
    env_->Written(path_, fit, /*synced=*/false);
    return space;
  }
  absl::Status Sync() override {
    RETURN_IF_ERROR(env_->Operation("fsync " + path_));
    RETURN_IF_ERROR(base_->Sync());
    env_->Synced(path_);
    return absl::OkStatus();
  }
  absl::Status Close() override {
    RETURN_IF_ERROR(env_->Operation("close " + path_));
    return base_->Close();
  }

 private:
  FaultEnv* const env_;
  const std::string path_;
  std::unique_ptr<WritableFile> base_;
};

class FaultRandomRWFile : public RandomRWFile {
 public:
  FaultRandomRWFile(FaultEnv* env, std::string path, std::unique_ptr<RandomRWFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}

  absl::Status Write(int64_t offset, absl::string_view data) override {
    RETURN_IF_ERROR(env_->Operation("write " + path_));
    int64_t fit = 0;
    absl::Status space = env_->Reserve(path_, static_cast<int64_t>(data.size()), &fit);
    RETURN_IF_ERROR(base_->Write(offset, data.substr(0, static_cast<size_t>(fit))));
    return space;
  }
  absl::Status Read(int64_t offset, int64_t n, char* dst) override {
    RETURN_IF_ERROR(env_->Read(path_));
    return base_->Read(offset, n, dst);
  }
  void Prefetch(int64_t offset, int64_t n) override { base_->Prefetch(offset, n); }

 private:
  FaultEnv* const env_;
  const std::string path_;
  std::unique_ptr<RandomRWFile> base_;
};

void FaultEnv::FailReadsFrom(int64_t k) {
  absl::MutexLock lock(&mu_);
  fail_reads_from_ = k < 0 ? -1 : reads_ + k;
}

absl::Status FaultEnv::Read(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (fail_reads_from_ >= 0 && reads_ >= fail_reads_from_) {
    return absl::InternalError(absl::StrCat("read ", path, ": Input/output error (injected)"));
  }
  ++reads_;
  return absl::OkStatus();
}

void FaultEnv::CrashAtOperation(int64_t k) {
  absl::MutexLock lock(&mu_);
  crash_at_ = k < 0 ? -1 : ops_ + k;
}

void FaultEnv::SetDiskSpace(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  space_ = bytes;
}

int64_t FaultEnv::operations() const {
  absl::MutexLock lock(&mu_);
  return ops_;
}

int64_t FaultEnv::bytes_written() const {
  absl::MutexLock lock(&mu_);
  return written_;
}

bool FaultEnv::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

absl::Status FaultEnv::Operation(const std::string& what) {
  absl::MutexLock lock(&mu_);
  if (crashed_) return absl::UnavailableError(absl::StrCat(what, ": the machine has crashed"));
  if (ops_ == crash_at_) {
    CrashLocked();
    return absl::UnavailableError(absl::StrCat(what, ": crash injected at operation ", ops_));
  }
  ++ops_;
  return absl::OkStatus();
}

void FaultEnv::CrashLocked() {
  crashed_ = true;
  // What never reached an fsync is torn: half of it made it to the disk.
  for (const auto& [path, f] : files_) {
    if (f.size > f.synced) (void)::truncate(path.c_str(), f.synced + (f.size - f.synced) / 2);
  }
}

absl::Status FaultEnv::Reserve(const std::string& path, int64_t n, int64_t* fit) {
  absl::MutexLock lock(&mu_);
  *fit = std::min(n, space_);
  space_ -= *fit;
  written_ += *fit;
  if (*fit < n) {
    return absl::ResourceExhaustedError(
        absl::StrCat("write ", path, ": No space left on device (injected)"));
  }
  return absl::OkStatus();
}

void FaultEnv::Written(const std::string& path, int64_t n, bool synced) {
  absl::MutexLock lock(&mu_);
  FileState& f = files_[path];
  f.size += n;
  if (synced) f.synced = f.size;
}

void FaultEnv::Synced(const std::string& path) {
  absl::MutexLock lock(&mu_);
  FileState& f = files_[path];
  f.synced = f.size;
}

absl::Status FaultEnv::WriteFile(const std::string& path, absl::string_view data, bool sync) {
  RETURN_IF_ERROR(Operation("write " + path));
  {
    absl::MutexLock lock(&mu_);
    files_[path] = FileState();  // created or truncated
  }
  int64_t fit = 0;
  absl::Status space = Reserve(path, static_cast<int64_t>(data.size()), &fit);
  if (!space.ok()) {
    RETURN_IF_ERROR(base_->WriteFile(path, data.substr(0, static_cast<size_t>(fit)), false));
    Written(path, fit, false);
    return space;
  }
  RETURN_IF_ERROR(base_->WriteFile(path, data, sync));
  Written(path, fit, sync);
  return absl::OkStatus();
}

absl::Status FaultEnv::RenameFile(const std::string& from, const std::string& to) {
  RETURN_IF_ERROR(Operation("rename " + from));
  RETURN_IF_ERROR(base_->RenameFile(from, to));
  absl::MutexLock lock(&mu_);
  auto it = files_.find(from);
  if (it == files_.end()) {
    files_.erase(to);
  } else {
    files_[to] = it->second;
    files_.erase(from);
  }
  return absl::OkStatus();
}

absl::Status FaultEnv::SyncDir(const std::string& dir) {
  RETURN_IF_ERROR(Operation("fsync dir " + dir));
  return base_->SyncDir(dir);
}

absl::Status FaultEnv::CreateDirs(const std::string& dir) {
  RETURN_IF_ERROR(Operation("mkdir " + dir));
  return base_->CreateDirs(dir);
}

absl::Status FaultEnv::DeleteFile(const std::string& path) {
  RETURN_IF_ERROR(Operation("unlink " + path));
  RETURN_IF_ERROR(base_->DeleteFile(path));
  absl::MutexLock lock(&mu_);
  files_.erase(path);
  return absl::OkStatus();
}

absl::Status FaultEnv::DeleteDir(const std::string& dir) {
  RETURN_IF_ERROR(Operation("rmdir " + dir));
  return base_->DeleteDir(dir);
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultEnv::NewWritableFile(const std::string& path) {
  RETURN_IF_ERROR(Operation("create " + path));
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> base, base_->NewWritableFile(path));
  {
    absl::MutexLock lock(&mu_);
    files_[path] = FileState();
  }
  return std::unique_ptr<WritableFile>(new FaultWritableFile(this, path, std::move(base)));
}

absl::StatusOr<std::unique_ptr<RandomRWFile>> FaultEnv::NewRandomRWFile(const std::string& path) {
  RETURN_IF_ERROR(Operation("create " + path));
  ASSIGN_OR_RETURN(std::unique_ptr<RandomRWFile> base, base_->NewRandomRWFile(path));
  return std::unique_ptr<RandomRWFile>(new FaultRandomRWFile(this, path, std::move(base)));
}

}  // namespace pstrain
