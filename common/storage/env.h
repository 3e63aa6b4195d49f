// The file-system interface every persistent write goes through (after
// LevelDB's Env). Tests swap in an Env that injects faults; production uses
// Env::Default(), a thin POSIX layer. Implementations are thread-safe.
#ifndef PSTRAIN_COMMON_STORAGE_ENV_H_
#define PSTRAIN_COMMON_STORAGE_ENV_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// A file being written in pieces (a checkpoint shard never sits in one
// string). Close() without Sync() leaves durability to the OS; the
// destructor closes a file that was not closed and drops its errors.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes `data` after the furthest byte written so far.
  virtual absl::Status Append(absl::string_view data) = 0;
  // Writes `data` at `offset`, in a range not written yet (a writer filling
  // several ranges of the file at once: a checkpoint shard's columns of a
  // table read a chunk of rows at a time); bytes never written read as
  // zeros. Append goes on after the furthest byte written either way.
  virtual absl::Status WriteAt(int64_t offset, absl::string_view data) = 0;
  virtual absl::Status Sync() = 0;  // fsync
  virtual absl::Status Close() = 0;
};

// A file read and written in place at offsets (an embedding table's disk
// tier, whose records are rewritten where they lie). Not a durable store:
// nothing is fsynced. The destructor closes it.
class RandomRWFile {
 public:
  virtual ~RandomRWFile() = default;
  // Writes `data` at `offset`, growing the file when it ends before.
  virtual absl::Status Write(int64_t offset, absl::string_view data) = 0;
  // Reads `n` bytes at `offset` into `dst`; OUT_OF_RANGE when the file ends
  // before them.
  virtual absl::Status Read(int64_t offset, int64_t n, char* dst) = 0;
  // A hint that `n` bytes at `offset` will be read soon: the OS may start
  // reading them from the disk now, without waiting (posix_fadvise's
  // WILLNEED), so that many such reads wait on the disk together. Never an
  // error; the default does nothing.
  virtual void Prefetch(int64_t offset, int64_t n) {}
};

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
  // Creates or truncates `path` for writing in pieces.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // Creates or truncates `path` (mode 0600) for reads and writes in place.
  virtual absl::StatusOr<std::unique_ptr<RandomRWFile>> NewRandomRWFile(
      const std::string& path) = 0;
  // `n` bytes at `offset`; OUT_OF_RANGE when the file is shorter.
  virtual absl::StatusOr<std::string> ReadFileRange(const std::string& path, int64_t offset,
                                                    int64_t n) = 0;
  // The same into `dst` (n bytes of caller memory): no intermediate copy.
  virtual absl::Status ReadFileRangeInto(const std::string& path, int64_t offset, int64_t n,
                                         char* dst) = 0;
  // The names in `dir` (not "." or ".."), sorted.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  virtual absl::StatusOr<int64_t> FileSize(const std::string& path) = 0;
  virtual bool IsDirectory(const std::string& path) = 0;
  // Removes an empty directory.
  virtual absl::Status DeleteDir(const std::string& dir) = 0;
};

// Removes `dir`, its files and its subdirectories.
absl::Status DeleteRecursively(Env* env, const std::string& dir);

// Crash-safe replacement of `path`: write "path.tmp", fsync, rename over
// `path`, fsync the directory. A reader sees the old or the new file, never a
// torn one.
absl::Status WriteFileAtomically(Env* env, const std::string& path, absl::string_view data);
// The same for a file written in pieces: `write` appends to "path.tmp", which
// is then fsynced, closed and renamed over `path`, and the directory fsynced.
// On any error the temp file is removed and `path` is left as it was.
absl::Status WriteFileStreamAtomically(Env* env, const std::string& path,
                                       const std::function<absl::Status(WritableFile*)>& write);

// Writes `content` to `path` through a temp file of mode 0600 that is then
// renamed: never readable by others, even for a moment.
absl::Status WritePrivateFile(const std::string& path, const std::string& content);
// A file that must stay private (a key, a secret): refused when it is not a
// regular file, is larger than `max_bytes`, or is open to group or others.
absl::StatusOr<std::string> ReadPrivateFile(const std::string& path, size_t max_bytes);

// A file read from a directory another party may have written (a
// checkpoint's manifest, pointer and shards, a model file): refused before
// it is opened unless it is a regular file (a FIFO, device, socket or
// directory could hang the reader or never end), reached without a symlink
// that leads out of its own directory, and at most `max_bytes` long.
// FAILED_PRECONDITION naming the path and what it is; NOT_FOUND when absent.
absl::Status CheckContainedFile(const std::string& path, int64_t max_bytes);
// Where a writer that must stay beneath `root` (an export's output directory)
// may create `path` (inside `root`): refused when `path`, its temporary
// "path.tmp", or a directory between `root` and it is a symlink, or when
// `path` is not beneath `root`. `root` itself may be a symlink.
absl::Status CheckWritableBelow(const std::string& root, const std::string& path);

// `path` with every symlink resolved, absolute; empty when it cannot be
// (missing, a dangling link, a loop).
std::string RealPath(const std::string& path);

// $TMPDIR when set and not empty, else /tmp.
std::string TempDirectory();

std::string Dirname(const std::string& path);
std::string JoinPath(const std::string& a, const std::string& b);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_STORAGE_ENV_H_
