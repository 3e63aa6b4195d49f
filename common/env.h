// The file-system interface every persistent write goes through (after
// LevelDB's Env). Tests swap in an Env that injects faults; production uses
// Env::Default(), a thin POSIX layer. Implementations are thread-safe.
#ifndef PSTRAIN_COMMON_ENV_H_
#define PSTRAIN_COMMON_ENV_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

class Env {
 public:
  virtual ~Env() = default;
  static Env* Default();

  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // Creates or truncates `path` with `data`; fsyncs it when `sync`.
  virtual absl::Status WriteFile(const std::string& path, absl::string_view data, bool sync) = 0;
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  virtual absl::Status CreateDirs(const std::string& dir) = 0;
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  virtual bool FileExists(const std::string& path) = 0;
};

// Crash-safe replacement of `path`: write "path.tmp", fsync, rename over
// `path`, fsync the directory. A reader sees the old or the new file, never a
// torn one.
absl::Status WriteFileAtomically(Env* env, const std::string& path, absl::string_view data);

std::string Dirname(const std::string& path);
std::string JoinPath(const std::string& a, const std::string& b);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_ENV_H_
