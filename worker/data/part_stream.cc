#include "worker/data/part_stream.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "worker/data/criteo_reader.h"

namespace pstrain {
namespace {

constexpr int64_t kReadBytes = int64_t{4} << 20;  // at most this much a read

// The number in a part file's name ("part-17", "part-17.tsv"), or -1.
int64_t PartNumber(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "part-") || absl::EndsWith(name, ".tmp")) return -1;
  size_t digits = 0;
  while (digits < name.size() && absl::ascii_isdigit(static_cast<unsigned char>(name[digits]))) {
    ++digits;
  }
  if (digits == 0 || digits > 18 || (digits < name.size() && name[digits] != '.')) return -1;
  int64_t n = 0;
  if (!absl::SimpleAtoi(name.substr(0, digits), &n)) return -1;
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PartStream>> PartStream::Open(Env* env, Options options) {
  if (options.batch_size < 1 || options.num_workers < 1 || options.worker < 0 ||
      options.worker >= options.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("part stream: worker ", options.worker, " of ",
                                                   options.num_workers, ", batch ",
                                                   options.batch_size));
  }
  if (!env->IsDirectory(options.dir)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.train_dir: ", options.dir, " is not a directory (create it; parts may come later)"));
  }
  return std::unique_ptr<PartStream>(new PartStream(env, std::move(options)));
}

absl::StatusOr<std::map<int64_t, std::string>> PartStream::ListParts() const {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(options_.dir));
  std::map<int64_t, std::string> parts;
  for (const std::string& name : names) {
    const int64_t n = PartNumber(name);
    if (n < 0) continue;
    auto [it, fresh] = parts.emplace(n, name);
    if (!fresh) {
      return absl::FailedPreconditionError(absl::StrCat(options_.dir, ": two parts numbered ", n,
                                                        ", ", it->second, " and ", name));
    }
  }
  return parts;
}

absl::Status PartStream::ReadMore(int64_t* got) {
  *got = 0;
  const std::string path = JoinPath(options_.dir, file_);
  ASSIGN_OR_RETURN(int64_t size, env_->FileSize(path));
  buffer_.erase(0, buffer_pos_);
  buffer_pos_ = 0;
  const int64_t at = offset_ + static_cast<int64_t>(buffer_.size());
  if (size < at) {
    return absl::DataLossError(absl::StrCat(path, ": shrank to ", size, " bytes while read (",
                                            at, " were read): parts must only grow"));
  }
  if (size == at) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string more,
                   env_->ReadFileRange(path, at, std::min(size - at, kReadBytes)));
  *got = static_cast<int64_t>(more.size());
  buffer_ += more;
  return absl::OkStatus();
}

absl::StatusOr<bool> PartStream::NextLine(std::string* line, int64_t* index) {
  for (;;) {
    if (file_.empty()) {
      ASSIGN_OR_RETURN(auto parts, ListParts());
      auto it = parts.lower_bound(part_);
      if (it == parts.end()) return false;
      part_ = it->first;
      file_ = it->second;
    }
    const size_t nl = buffer_.find('\n', buffer_pos_);
    if (nl != std::string::npos) {
      line->assign(buffer_, buffer_pos_, nl - buffer_pos_);
      offset_ += static_cast<int64_t>(nl + 1 - buffer_pos_);
      buffer_pos_ = nl + 1;
      break;
    }
    int64_t got = 0;
    RETURN_IF_ERROR(ReadMore(&got));
    if (got > 0) continue;
    // Nothing new: the part is complete once a later one exists (read it
    // once more: it may have grown before that one appeared).
    ASSIGN_OR_RETURN(auto parts, ListParts());
    auto later = parts.upper_bound(part_);
    if (later == parts.end()) return false;
    RETURN_IF_ERROR(ReadMore(&got));
    if (got > 0) continue;
    if (buffer_pos_ < buffer_.size()) {  // its last line, without a newline
      line->assign(buffer_, buffer_pos_, std::string::npos);
      offset_ += static_cast<int64_t>(buffer_.size() - buffer_pos_);
      buffer_pos_ = buffer_.size();
      break;
    }
    part_ = later->first;
    file_ = later->second;
    line_ = 0;
    offset_ = 0;
    buffer_.clear();
    buffer_pos_ = 0;
  }
  if (!line->empty() && line->back() == '\r') line->pop_back();
  *index = line_++;
  return true;
}

absl::Status PartStream::Wait() {
  if (absl::Now() - last_waiting_log_ > absl::Seconds(30)) {
    last_waiting_log_ = absl::Now();
    LOG_INFO("waiting for data: {} has nothing past part {} line {} yet", options_.dir, part_,
             line_);
  }
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&cancelled_), options_.poll);
  if (cancelled_) return absl::CancelledError("the part stream was cancelled");
  return absl::OkStatus();
}

absl::Status PartStream::Next(float* x, int32_t* y, uint64_t* ids) {
  std::vector<uint64_t> scratch;
  if (ids == nullptr) scratch.resize(static_cast<size_t>(layout_.id_slots()));
  std::string line;
  for (int rows = 0; rows < options_.batch_size;) {
    int64_t index = 0;
    ASSIGN_OR_RETURN(bool got, NextLine(&line, &index));
    if (!got) {
      RETURN_IF_ERROR(Wait());
      continue;
    }
    if (index % options_.num_workers != options_.worker) continue;
    if (index == 0 && layout_.header()) continue;
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank
    const std::string reason = layout_.Parse(
        line, x + static_cast<size_t>(rows) * layout_.numeric(),
        ids != nullptr ? ids + static_cast<size_t>(rows) * layout_.id_slots() : scratch.data(),
        &y[rows]);
    if (!reason.empty()) {
      const std::string where = absl::StrCat(JoinPath(options_.dir, file_), ":", index + 1);
      if (++malformed_ > options_.max_malformed) {
        return absl::InvalidArgumentError(absl::StrCat(
            options_.dir, ": more than ", options_.max_malformed, " malformed lines (", where,
            ": ", reason, ")"));
      }
      LOG_WARN("{}: {}; line skipped", where, reason);
      continue;
    }
    ++rows;
    ++examples_;
  }
  return absl::OkStatus();
}

absl::Status PartStream::Restore(const DataCursor& cursor) {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = false;
  }
  if (cursor.epoch < 0 || cursor.position < 0) {
    return absl::InvalidArgumentError(absl::StrCat("data cursor: part ", cursor.epoch, " line ",
                                                   cursor.position));
  }
  part_ = cursor.epoch;
  file_.clear();
  malformed_ = 0;  // lines read again are counted again
  line_ = 0;
  offset_ = 0;
  buffer_.clear();
  buffer_pos_ = 0;
  if (cursor.position == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto parts, ListParts());
  auto it = parts.find(cursor.epoch);
  if (it == parts.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("data cursor: part ", cursor.epoch, " line ", cursor.position, ", but ",
                     options_.dir, " has no part numbered ", cursor.epoch, " (removed?)"));
  }
  file_ = it->second;
  std::string line;
  while (line_ < cursor.position) {
    const int64_t passed = line_;
    int64_t index = 0;
    ASSIGN_OR_RETURN(bool got, NextLine(&line, &index));
    if (!got || part_ != cursor.epoch) {
      return absl::FailedPreconditionError(
          absl::StrCat("data cursor: part ", cursor.epoch, " line ", cursor.position, ", but ",
                       JoinPath(options_.dir, it->second), " has only ", passed, " lines"));
    }
  }
  return absl::OkStatus();
}

void PartStream::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

}  // namespace pstrain
