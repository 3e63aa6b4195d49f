// The directory-following source: parts read in the order of their numbers
// as they appear and grow, each line once across the workers, a torn last
// line waiting for the rest, a cursor that resumes with the very next line,
// malformed lines skipped up to the limit, and a wait that Cancel ends.
#include "worker/data/part_stream.h"

#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/base/embedding_ids.h"
#include "common/storage/env.h"

namespace pstrain {
namespace {

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(tmp != nullptr ? tmp : "/tmp", name);
  (void)DeleteRecursively(Env::Default(), dir);
  REQUIRE(Env::Default()->CreateDirs(dir).ok());
  return dir;
}

// A Criteo line whose first integer field is `n` (the label n % 2): each
// line of a test has its own n, read back as log1p(n).
std::string Line(int n) {
  std::string line = absl::StrCat(n % 2, "\t", n);
  for (int j = 1; j < 13; ++j) line += "\t1";
  for (int j = 0; j < 26; ++j) line += "\tab";
  return line + "\n";
}

std::string Lines(int first, int count) {
  std::string out;
  for (int n = first; n < first + count; ++n) out += Line(n);
  return out;
}

void Write(const std::string& dir, const std::string& name, const std::string& text) {
  REQUIRE(Env::Default()->WriteFile(JoinPath(dir, name), text, false).ok());
}

std::unique_ptr<PartStream> Open(const std::string& dir, int worker, int workers, int batch,
                                 int max_malformed = 100) {
  PartStream::Options o;
  o.dir = dir;
  o.worker = worker;
  o.num_workers = workers;
  o.batch_size = batch;
  o.max_malformed = max_malformed;
  o.poll = absl::Milliseconds(5);
  auto s = PartStream::Open(Env::Default(), o);
  REQUIRE(s.ok());
  return std::move(*s);
}

// The n of each line of the next batch.
std::vector<int> Batch(PartStream* s) {
  const int b = s->batch_size();
  std::vector<float> x(b * 13);
  std::vector<int32_t> y(b);
  std::vector<uint64_t> ids(b * 26);
  REQUIRE(s->Next(x.data(), y.data(), ids.data()).ok());
  std::vector<int> out;
  for (int r = 0; r < b; ++r) {
    const int n = static_cast<int>(std::lround(std::expm1(x[r * 13])));
    CHECK(y[r] == n % 2);
    CHECK(ids[r * 26] == FeatureId(0, "ab", 2));
    out.push_back(n);
  }
  return out;
}

TEST_CASE("parts are read in the order of their numbers, each line once across the workers",
          "[data][stream]") {
  const std::string dir = FreshDir("stream_order");
  Write(dir, "part-10.tsv", Lines(100, 6));  // after part-9, though it sorts first
  Write(dir, "part-9.tsv", Lines(0, 5));
  Write(dir, "README", "not a part");
  Write(dir, "part-11.tsv.tmp", Lines(900, 3));  // a writer's, before its rename
  Write(dir, "part-11.tsv", Lines(200, 1));  // the last: read as it is
  // Worker w: lines w, w + 3, ... of part 9 (5 lines), then of part 10
  // (6), then of part 11 (1, worker 0's).
  const std::vector<std::vector<int>> want = {
      {0, 3, 100, 103, 200}, {1, 4, 101, 104}, {2, 102, 105}};
  std::set<int> seen;
  for (int w = 0; w < 3; ++w) {
    auto s = Open(dir, w, 3, 1);
    std::vector<int> got;
    for (size_t k = 0; k < want[w].size(); ++k) got.push_back(Batch(s.get())[0]);
    CHECK(got == want[w]);
    for (int n : got) CHECK(seen.insert(n).second);
  }
  CHECK(seen.size() == 12);  // every line once (the .tmp file's none)
}

TEST_CASE("a stream waits for parts to come and grow; a torn last line waits for the rest",
          "[data][stream]") {
  const std::string dir = FreshDir("stream_wait");
  auto s = Open(dir, 0, 1, 4);
  // Catch's assertions are the test thread's alone: the writer keeps its
  // outcomes for after the join.
  std::vector<absl::Status> written;
  std::thread writer([&dir, &written] {
    auto write = [&](const std::string& name, const std::string& text) {
      written.push_back(Env::Default()->WriteFile(JoinPath(dir, name), text, false));
    };
    absl::SleepFor(absl::Milliseconds(50));
    const std::string two = Lines(0, 2);
    write("part-0", two + Line(2).substr(0, 10));  // the third line torn
    absl::SleepFor(absl::Milliseconds(50));
    write("part-0", two + Line(2));  // completed
    absl::SleepFor(absl::Milliseconds(50));
    write("part-1", Lines(3, 2));
  });
  const absl::Time start = absl::Now();
  CHECK(Batch(s.get()) == std::vector<int>{0, 1, 2, 3});
  CHECK(absl::Now() - start >= absl::Milliseconds(100));
  writer.join();
  for (const absl::Status& st : written) CHECK(st.ok());
  CHECK(s->cursor() == DataCursor{1, 1});  // one line of part 1 passed
  // A part is complete once a later one exists: its last line needs no
  // newline then.
  Write(dir, "part-1", Lines(3, 2) + Line(5).substr(0, Line(5).size() - 1));
  Write(dir, "part-2", Lines(6, 2));
  CHECK(Batch(s.get()) == std::vector<int>{4, 5, 6, 7});
}

TEST_CASE("a cursor resumes with the very next line, mid-part; a part gone is named",
          "[data][stream]") {
  const std::string dir = FreshDir("stream_resume");
  Write(dir, "part-3", Lines(0, 7));
  Write(dir, "part-4", Lines(7, 7));
  auto a = Open(dir, 1, 2, 3);
  CHECK(Batch(a.get()) == std::vector<int>{1, 3, 5});
  const DataCursor at = a->cursor();
  CHECK(at == DataCursor{3, 6});
  const std::vector<int> next = Batch(a.get());
  CHECK(next == std::vector<int>{8, 10, 12});  // into part 4: its lines 1, 3, 5
  auto b = Open(dir, 1, 2, 3);
  REQUIRE(b->Restore(at).ok());
  CHECK(Batch(b.get()) == next);
  // The cursor's part removed (a retention job), or cut short: refused.
  auto c = Open(dir, 1, 2, 3);
  const absl::Status short_part = c->Restore({3, 9});
  CHECK(short_part.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(short_part.message()).find("has only 7 lines") != std::string::npos);
  REQUIRE(Env::Default()->DeleteFile(JoinPath(dir, "part-3")).ok());
  const absl::Status gone = c->Restore(at);
  CHECK(gone.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(gone.message()).find("has no part numbered 3") != std::string::npos);
  // At a part's start a missing one is no loss: the next is taken.
  REQUIRE(c->Restore({3, 0}).ok());
  CHECK(Batch(c.get()) == next);
}

TEST_CASE("malformed lines are skipped up to the limit; Cancel ends a wait", "[data][stream]") {
  const std::string dir = FreshDir("stream_bad");
  Write(dir, "part-0", Line(0) + "not\ta\tline\n\n" + Line(1) + "1\tx\n" + Line(2));
  auto s = Open(dir, 0, 1, 3, /*max_malformed=*/2);
  CHECK(Batch(s.get()) == std::vector<int>{0, 1, 2});
  CHECK(s->malformed() == 2);
  auto strict = Open(dir, 0, 1, 3, /*max_malformed=*/1);
  std::vector<float> x(3 * 13);
  std::vector<int32_t> y(3);
  const absl::Status st = strict->Next(x.data(), y.data(), nullptr);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(st.message()).find("more than 1 malformed lines") != std::string::npos);
  CHECK(std::string(st.message()).find("part-0:5") != std::string::npos);

  // Nothing more comes: Next waits until cancelled, then and after says so.
  std::thread cancel([&s] {
    absl::SleepFor(absl::Milliseconds(50));
    s->Cancel();
  });
  CHECK(s->Next(x.data(), y.data(), nullptr).code() == absl::StatusCode::kCancelled);
  cancel.join();
  CHECK(s->Next(x.data(), y.data(), nullptr).code() == absl::StatusCode::kCancelled);
  REQUIRE(s->Restore({0, 0}).ok());  // a restore ends the cancel
  CHECK(Batch(s.get()) == std::vector<int>{0, 1, 2});
  // Not a directory: refused at once.
  PartStream::Options o;
  o.dir = JoinPath(dir, "part-0");
  CHECK(PartStream::Open(Env::Default(), o).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}


TEST_CASE("parts of a schema of the user's own: each part's header skipped, columns as declared",
          "[data][stream][schema]") {
  const std::string dir = FreshDir("schema_parts");
  // label last, one number, one category, comma-separated, a header per part.
  auto part = [](int first, int count) {
    std::string text = "n,item,click\n";
    for (int n = first; n < first + count; ++n) absl::StrAppend(&text, n, ",ab,", n % 2, "\n");
    return text;
  };
  Write(dir, "part-0.csv", part(0, 5));
  Write(dir, "part-1.csv", part(5, 5));
  PartStream::Options o;
  o.dir = dir;
  o.batch_size = 10;
  o.max_malformed = 0;  // a header read as data would fail the stream
  o.poll = absl::Milliseconds(5);
  o.schema.set_separator(",");
  o.schema.set_header(true);
  o.schema.add_columns()->set_kind(FeatureColumn::NUMERIC);
  o.schema.add_columns()->set_kind(FeatureColumn::CATEGORICAL);
  o.schema.add_columns()->set_kind(FeatureColumn::LABEL);
  auto s = PartStream::Open(Env::Default(), o);
  REQUIRE(s.ok());
  CHECK((*s)->dim() == 1);
  CHECK((*s)->id_fields() == 1);
  std::vector<float> x(10);
  std::vector<int32_t> y(10);
  std::vector<uint64_t> ids(10);
  REQUIRE((*s)->Next(x.data(), y.data(), ids.data()).ok());
  for (int n = 0; n < 10; ++n) {
    CHECK(x[n] == static_cast<float>(n));
    CHECK(y[n] == n % 2);
    CHECK(ids[n] == FeatureId(0, "ab", 2));
  }
  CHECK((*s)->malformed() == 0);
}

}  // namespace
}  // namespace pstrain
