#include "common/observability/event_writer.h"

#include <stdlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "proto/tensorboard.pb.h"

namespace pstrain {
namespace {

uint64_t Le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

TEST_CASE("TFRecord framing: length, masked CRC32C of it, data, masked CRC32C of it",
          "[tensorboard]") {
  CHECK(MaskedCrc32c("123456789", 9) == 0xc78ab0e5u);  // CRC32C 0xE3069283, masked
  const std::string r = TfRecord("hello");
  REQUIRE(r.size() == 8 + 4 + 5 + 4);
  CHECK(Le(r, 0, 8) == 5);
  CHECK(Le(r, 8, 4) == MaskedCrc32c(r.data(), 8));
  CHECK(r.substr(12, 5) == "hello");
  CHECK(Le(r, 17, 4) == MaskedCrc32c("hello", 5));
}

TEST_CASE("an event file starts with its version and holds scalar events", "[tensorboard]") {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/events-XXXXXX");
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  auto w = EventWriter::Create(Env::Default(), JoinPath(dir, "events"));
  REQUIRE(w.ok());
  CHECK((*w)->path().find("/events/events.out.tfevents.") != std::string::npos);
  REQUIRE((*w)->WriteScalars(100, {{"eval/accuracy", 0.5}, {"train/loss", 1.25}}).ok());
  REQUIRE((*w)->WriteScalars(200, {{"eval/accuracy", 0.75}}).ok());
  auto bytes = Env::Default()->ReadFile((*w)->path());
  REQUIRE(bytes.ok());
  std::vector<tensorflow::Event> events;
  for (size_t at = 0; at < bytes->size();) {
    REQUIRE(at + 12 <= bytes->size());
    const uint64_t n = Le(*bytes, at, 8);
    CHECK(Le(*bytes, at + 8, 4) == MaskedCrc32c(bytes->data() + at, 8));
    REQUIRE(at + 12 + n + 4 <= bytes->size());
    CHECK(Le(*bytes, at + 12 + n, 4) == MaskedCrc32c(bytes->data() + at + 12, n));
    tensorflow::Event e;
    REQUIRE(e.ParseFromArray(bytes->data() + at + 12, static_cast<int>(n)));
    events.push_back(e);
    at += 12 + n + 4;
  }
  REQUIRE(events.size() == 3);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[1].step() == 100);
  REQUIRE(events[1].summary().value_size() == 2);
  CHECK(events[1].summary().value(0).tag() == "eval/accuracy");
  CHECK(events[1].summary().value(0).simple_value() == 0.5f);
  CHECK(events[1].summary().value(1).simple_value() == 1.25f);
  CHECK(events[2].step() == 200);
  CHECK(events[2].wall_time() >= events[1].wall_time());

  // Read back while being written: every scalar; a torn last record (a
  // writer mid-append) ends the read; a damaged record is an error.
  const std::string events_dir = JoinPath(dir, "events");
  auto scalars = ReadScalarEvents(Env::Default(), events_dir);
  REQUIRE(scalars.ok());
  REQUIRE(scalars->size() == 3);
  CHECK((*scalars)[0].step == 100);
  CHECK((*scalars)[0].tag == "eval/accuracy");
  CHECK((*scalars)[0].value == 0.5);
  CHECK((*scalars)[2].step == 200);
  CHECK((*scalars)[2].value == 0.75);
  for (size_t cut : {size_t{1}, size_t{5}, size_t{13}, size_t{20}}) {
    INFO(cut);
    REQUIRE(Env::Default()->WriteFile((*w)->path(), bytes->substr(0, bytes->size() - cut), true)
                .ok());
    auto torn = ReadScalarEvents(Env::Default(), events_dir);
    REQUIRE(torn.ok());
    CHECK(torn->size() == 2);
  }
  std::string damaged = *bytes;
  damaged[damaged.size() - 8] ^= 1;  // inside the last record's data
  REQUIRE(Env::Default()->WriteFile((*w)->path(), damaged, true).ok());
  auto bad = ReadScalarEvents(Env::Default(), events_dir);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find("fails its CRC") != std::string::npos);
  auto none = ReadScalarEvents(Env::Default(), JoinPath(dir, "no_such_dir"));
  REQUIRE(none.ok());
  CHECK(none->empty());
}

}  // namespace
}  // namespace pstrain
