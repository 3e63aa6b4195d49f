// Click-through training data that keeps coming (data.train_dir): a
// directory into which part files appear, as hourly log dumps do, each in
// the Criteo TSV layout (criteo_reader.h). Parts are named part-<n> or
// part-<n>.<anything> (n a non-negative integer; other names are ignored)
// and read in the order of n; each is read as it grows, and is complete
// once a part of a higher number exists: until then a last line without
// its newline waits for the rest.
//
// Each line once across all workers: line i of a part (counting every
// line, blank and malformed ones too, so that every worker counts alike) is
// worker i % num_workers's; a batch goes on into the next part. No epochs:
// the cursor is the part's number and the lines of it passed, and restoring
// it goes on with the very next line (checkpoints save it as epoch and
// position). Next waits for data as long as it must: the trainer's own
// deadline bounds it, and Cancel ends it.
//
// Malformed lines are skipped with a warning naming the file and line, up
// to data.max_malformed_lines since the stream started or was restored; one
// more fails the stream.
#ifndef PSTRAIN_WORKER_DATA_PART_STREAM_H_
#define PSTRAIN_WORKER_DATA_PART_STREAM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/storage/env.h"
#include "worker/data/batch_source.h"
#include "worker/data/criteo_reader.h"

namespace pstrain {

class PartStream : public BatchSource {
 public:
  struct Options {
    std::string dir;
    int worker = 0;
    int num_workers = 1;
    int batch_size = 1;
    int max_malformed = 100;
    absl::Duration poll = absl::Milliseconds(200);  // how often a wait looks again
    FeatureSchema schema;  // the parts' columns (none: Criteo's); a header is each part's
  };

  // Checks the options and that `dir` is a directory (it may be empty yet).
  static absl::StatusOr<std::unique_ptr<PartStream>> Open(Env* env, Options options);

  int batch_size() const override { return options_.batch_size; }
  int dim() const override { return layout_.numeric(); }         // the dense features
  int id_fields() const override { return layout_.id_slots(); }  // the categorical ids
  absl::Status Next(float* x, int32_t* y, uint64_t* ids) override;
  // The part's number (the first part at or after it when that one is not
  // there yet), and the lines of it passed.
  DataCursor cursor() const override { return {part_, line_}; }
  // FAILED_PRECONDITION when the cursor is inside a part that is gone (a
  // part is never skipped silently), or past the end of one.
  absl::Status Restore(const DataCursor& cursor) override;
  void Cancel() override;
  const char* epoch_name() const override { return "part"; }
  const char* position_name() const override { return "line"; }

  // Lines this worker took, and malformed ones it skipped, so far.
  int64_t examples() const { return examples_; }
  int64_t malformed() const { return malformed_; }

 private:
  PartStream(Env* env, Options options)
      : env_(env), options_(std::move(options)), layout_(options_.schema) {}

  // The parts in the directory: number -> file name.
  absl::StatusOr<std::map<int64_t, std::string>> ListParts() const;
  // The next line of the stream into `line` (its newline and CR stripped)
  // and its index in its part into `index`; false when there is none yet.
  absl::StatusOr<bool> NextLine(std::string* line, int64_t* index);
  // Reads what the current part has past what was read.
  absl::Status ReadMore(int64_t* got);
  // Waits one poll, or until cancelled (CANCELLED then).
  absl::Status Wait();

  Env* const env_;
  const Options options_;
  const ClickThroughLayout layout_;
  // Where the stream stands: the part (its number, and its file once open),
  // the lines and bytes of it passed, and what was read past them.
  int64_t part_ = 0;
  std::string file_;  // "" while part_ is not open yet
  int64_t line_ = 0;
  int64_t offset_ = 0;
  std::string buffer_;  // bytes read; those from buffer_pos_ on follow offset_
  size_t buffer_pos_ = 0;
  int64_t examples_ = 0, malformed_ = 0;
  absl::Time last_waiting_log_ = absl::InfinitePast();

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_DATA_PART_STREAM_H_
