#include "common/observability/event_writer.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"
#include "proto/tensorboard.pb.h"

namespace pstrain {
namespace {

void AppendLittleEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t LittleEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

double WallTime() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

}  // namespace

uint32_t MaskedCrc32c(const void* data, size_t n) {
  const uint32_t crc = Crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string TfRecord(absl::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  AppendLittleEndian(&out, data.size(), 8);
  AppendLittleEndian(&out, MaskedCrc32c(out.data(), 8), 4);
  out.append(data.data(), data.size());
  AppendLittleEndian(&out, MaskedCrc32c(data.data(), data.size()), 4);
  return out;
}

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Create(Env* env,
                                                                const std::string& dir) {
  RETURN_IF_ERROR(env->CreateDirs(dir));
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const std::string path =
      JoinPath(dir, absl::StrCat("events.out.tfevents.", absl::ToUnixSeconds(absl::Now()), ".",
                                 host, ".", ::getpid()));
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path));
  tensorflow::Event first;
  first.set_wall_time(WallTime());
  first.set_file_version("brain.Event:2");
  RETURN_IF_ERROR(file->Append(TfRecord(first.SerializeAsString())));
  return std::unique_ptr<EventWriter>(new EventWriter(path, std::move(file)));
}

absl::Status EventWriter::WriteScalars(
    int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  tensorflow::Event e;
  e.set_wall_time(WallTime());
  e.set_step(step);
  for (const auto& [tag, value] : scalars) {
    tensorflow::Summary::Value* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return file_->Append(TfRecord(e.SerializeAsString()));
}

absl::StatusOr<std::vector<ScalarEvent>> ReadScalarEvents(Env* env, const std::string& dir) {
  std::vector<ScalarEvent> out;
  if (!env->IsDirectory(dir)) return out;
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(dir));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, "events.out.tfevents.")) continue;
    const std::string path = JoinPath(dir, name);
    ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
    size_t at = 0;
    while (bytes.size() - at >= 12) {
      const uint64_t length = LittleEndian(bytes.data() + at, 8);
      if (LittleEndian(bytes.data() + at + 8, 4) != MaskedCrc32c(bytes.data() + at, 8)) {
        return absl::DataLossError(
            absl::StrCat(path, ": the length of the record at byte ", at, " fails its CRC"));
      }
      const size_t left = bytes.size() - at;
      if (left < 16 || length > left - 16) break;  // torn: the writer is mid-append
      const char* data = bytes.data() + at + 12;
      if (LittleEndian(data + length, 4) != MaskedCrc32c(data, length)) {
        return absl::DataLossError(
            absl::StrCat(path, ": the record at byte ", at, " fails its CRC"));
      }
      tensorflow::Event e;
      if (!e.ParseFromArray(data, static_cast<int>(length))) {
        return absl::DataLossError(
            absl::StrCat(path, ": the record at byte ", at, " is not an Event"));
      }
      for (const tensorflow::Summary::Value& v : e.summary().value()) {
        if (v.has_simple_value()) out.push_back({e.step(), v.tag(), v.simple_value()});
      }
      at += 16 + length;
    }
  }
  return out;
}

}  // namespace pstrain
