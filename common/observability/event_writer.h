// TensorBoard event files: what `tensorboard --logdir` reads. A file
// "events.out.tfevents.<seconds>.<host>.<pid>" of TFRecords, each
//   uint64 length, uint32 masked CRC32C of the length, the bytes of a
//   tensorflow.Event (proto/tensorboard.proto), uint32 masked CRC32C of them
// (little-endian; masked = rotate right 15, plus 0xa282ead8), beginning with
// an Event whose file_version is "brain.Event:2". Written through Env, each
// record as one append, so a reader never sees half of one unless the
// process dies mid-write (TensorBoard then skips the torn tail). Not
// thread-safe: one writer per file.
#ifndef PSTRAIN_COMMON_OBSERVABILITY_EVENT_WRITER_H_
#define PSTRAIN_COMMON_OBSERVABILITY_EVENT_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/storage/env.h"

namespace pstrain {

// The TFRecord framing of `data`.
std::string TfRecord(absl::string_view data);
uint32_t MaskedCrc32c(const void* data, size_t n);

class EventWriter {
 public:
  // Creates `dir` and a new event file in it.
  static absl::StatusOr<std::unique_ptr<EventWriter>> Create(Env* env, const std::string& dir);

  // One Event at `step` holding scalar (tag, value) pairs.
  absl::Status WriteScalars(int64_t step,
                            const std::vector<std::pair<std::string, double>>& scalars);
  absl::Status Sync() { return file_->Sync(); }
  const std::string& path() const { return path_; }

 private:
  EventWriter(std::string path, std::unique_ptr<WritableFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}

  const std::string path_;
  std::unique_ptr<WritableFile> file_;
};

// One scalar of an event file: what TensorBoard plots at `step`.
struct ScalarEvent {
  int64_t step = 0;
  std::string tag;
  double value = 0;
};

// The scalars of the event files in `dir` (events.out.tfevents.*, in name
// order; a resumed run adds a file), while they are being written: a file's
// read ends at a torn last record (a writer mid-append). A record whose
// CRC fails is an error naming the file and its offset. No directory: none.
absl::StatusOr<std::vector<ScalarEvent>> ReadScalarEvents(Env* env, const std::string& dir);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_OBSERVABILITY_EVENT_WRITER_H_
