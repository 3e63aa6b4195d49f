#include "common/observability/event_writer.h"

#include <unistd.h>

#include <utility>

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

}  // namespace pstrain
