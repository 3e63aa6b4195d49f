// Embedding tables: rows that depend on the id alone, duplicates summed,
// fixed-size ranges, sparse optimizer updates that leave other rows alone,
// expiry, admission, no lost update under concurrent pushes, and the id
// spread over servers.
#include "ps_server/embedding_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <thread>

#include "catch2/catch.hpp"
#include "common/base/embedding_ids.h"
#include "google/protobuf/text_format.h"

namespace pstrain {
namespace {

std::unique_ptr<Optimizer> MakeOptimizer(const std::string& text) {
  OptimizerConfig c;
  REQUIRE(google::protobuf::TextFormat::ParseFromString(text, &c));
  auto opt = CreateOptimizer(c);
  REQUIRE(opt.ok());
  return std::move(*opt);
}

EmbeddingTable::Options Table(int dim, int64_t num_rows = 0) {
  EmbeddingTable::Options o;
  o.name = "t";
  o.dim = dim;
  o.num_rows = num_rows;
  o.init_scale = 0.5f;
  o.seed = TableSeed(11, "t");
  return o;
}

std::vector<float> Row(EmbeddingTable& t, uint64_t id, int64_t step = 0) {
  std::vector<float> out(t.dim());
  const uint64_t ids[] = {id};
  REQUIRE(t.Lookup(ids, step, out.data()).ok());
  return out;
}

TEST_CASE("a table grown far past its first buffers (into huge-page ones) keeps every row and "
          "slot", "[embedding]") {
  // 400,000 rows of 64 floats with Adagrad: 102 MB of values and as much of
  // slots over the table's 16 shards (6.4 MB each, past the 4 MiB from
  // which a shard's new buffers are advised huge pages), each regrown many
  // times; rows updated early must keep their values and slots.
  auto adagrad = MakeOptimizer("learning_rate: 1 adagrad { initial_accumulator_value: 0.5 }");
  EmbeddingTable t(Table(64), adagrad.get());
  std::vector<uint64_t> early = {1, 2, 3};
  std::vector<float> grads(early.size() * 64, 1.0f);
  REQUIRE(t.ApplyGradients(early, grads.data(), 1.0f, 1.0f, 0.0f, 0).ok());
  std::vector<std::vector<float>> before_values(early.size());
  std::vector<OptimizerSlots> before_slots(early.size());
  for (size_t i = 0; i < early.size(); ++i) {
    REQUIRE(t.ReadRow(early[i], &before_values[i], &before_slots[i]));
  }
  std::vector<uint64_t> ids(400000);
  std::iota(ids.begin(), ids.end(), uint64_t{100});
  std::vector<float> out(ids.size() * 64);
  REQUIRE(t.Lookup(ids, 0, out.data()).ok());
  for (size_t i = 0; i < early.size(); ++i) {
    std::vector<float> values;
    OptimizerSlots slots;
    REQUIRE(t.ReadRow(early[i], &values, &slots));
    CHECK(values == before_values[i]);
    CHECK(slots == before_slots[i]);
  }
  // A late row is its initial value, as in a fresh table.
  EmbeddingTable fresh(Table(64), adagrad.get());
  CHECK(Row(fresh, 100 + 399999) == std::vector<float>(out.end() - 64, out.end()));
}

TEST_CASE("a row's first value depends on the id alone, not the server or the order",
          "[embedding]") {
  auto sgd = MakeOptimizer("learning_rate: 1 sgd {}");
  std::vector<uint64_t> ids(500);
  std::mt19937_64 rng(3);
  for (uint64_t& id : ids) id = rng();
  ids[0] = 0;
  ids[1] = ~uint64_t{0};
  // One table holding every id, touched in order, against two "servers"
  // holding their share each, touched in reverse.
  EmbeddingTable whole(Table(8), sgd.get());
  std::vector<float> all(ids.size() * 8);
  REQUIRE(whole.Lookup(ids, 0, all.data()).ok());
  EmbeddingTable server0(Table(8), sgd.get()), server1(Table(8), sgd.get());
  for (size_t k = ids.size(); k-- > 0;) {
    EmbeddingTable& s = ServerForId(ids[k], 2) == 0 ? server0 : server1;
    const std::vector<float> row = Row(s, ids[k]);
    CHECK(std::equal(row.begin(), row.end(), all.begin() + k * 8));
  }
  CHECK(server0.stats().rows + server1.stats().rows == 500);
  CHECK(server0.stats().rows > 200);
  // The values are the documented draw: uniform in [-0.5, 0.5), rows differ.
  std::vector<float> want(8);
  InitialRow(TableSeed(11, "t"), ids[7], 8, 0.5f, want.data());
  CHECK(std::equal(want.begin(), want.end(), all.begin() + 7 * 8));
  for (float v : all) {
    CHECK(v >= -0.5f);
    CHECK(v < 0.5f);
  }
  CHECK(Row(whole, ids[2]) != Row(whole, ids[3]));
  // Another table's name (or run seed) gives other values.
  EmbeddingTable::Options other = Table(8);
  other.seed = TableSeed(11, "u");
  EmbeddingTable u(other, sgd.get());
  CHECK(Row(u, ids[2]) != Row(whole, ids[2]));
  CHECK(whole.stats().bytes == 500 * 8 * 4);
}

TEST_CASE("duplicate ids in a push are summed into one update", "[embedding]") {
  auto adam = MakeOptimizer("learning_rate: 0.1 adam {}");
  EmbeddingTable t(Table(2), adam.get());
  const std::vector<float> r5 = Row(t, 5), r7 = Row(t, 7);
  const std::vector<uint64_t> ids = {5, 7, 5};
  const std::vector<float> g = {1, -2, 0.5f, 0.5f, 3, 1};
  REQUIRE(t.ApplyGradients(ids, g.data(), 1.0f, 0.1f, 0, 1).ok());
  std::vector<float> got;
  int64_t updates = 0;
  REQUIRE(t.ReadRow(5, &got, nullptr, &updates));
  CHECK(updates == 1);  // one update of the sum [4, -1], not two
  // Adam's first step moves by lr * sign(sum).
  CHECK(got[0] == Approx(r5[0] - 0.1f).epsilon(1e-5));
  CHECK(got[1] == Approx(r5[1] + 0.1f).epsilon(1e-5));
  REQUIRE(t.ReadRow(7, &got, nullptr, &updates));
  CHECK(updates == 1);
  CHECK(got[0] == Approx(r7[0] - 0.1f).epsilon(1e-5));
}

TEST_CASE("sparse updates: a row not pushed keeps its value and its slots", "[embedding]") {
  for (const char* kind : {"momentum {}", "adagrad {}", "adam {}", "ftrl {}"}) {
    INFO(kind);
    auto opt = MakeOptimizer(std::string("learning_rate: 0.05 ") + kind);
    EmbeddingTable t(Table(4), opt.get());
    const std::vector<uint64_t> both = {1, 2};
    std::vector<float> rows(8);
    REQUIRE(t.Lookup(both, 0, rows.data()).ok());
    std::vector<float> before2;
    OptimizerSlots slots_before2;
    REQUIRE(t.ReadRow(2, &before2, &slots_before2));
    // Row 1 alone, three times; the reference applies the same to its own copy.
    std::vector<float> want(rows.begin(), rows.begin() + 4);
    OptimizerSlots ref;
    opt->InitSlots(4, &ref);
    const std::vector<float> g = {0.5f, -1, 2, 0.25f};
    for (int step = 1; step <= 3; ++step) {
      const uint64_t one[] = {1};
      REQUIRE(t.ApplyGradients(one, g.data(), 1.0f, 0.05f, 0, step).ok());
      UpdateInfo u;
      u.learning_rate = 0.05f;
      u.count = step;
      opt->Apply(absl::MakeSpan(want), g, &ref, u);
    }
    std::vector<float> got;
    OptimizerSlots slots;
    int64_t updates = 0;
    REQUIRE(t.ReadRow(1, &got, &slots, &updates));
    CHECK(got == want);
    CHECK(slots == ref);
    CHECK(updates == 3);
    REQUIRE(t.ReadRow(2, &got, &slots, &updates));
    CHECK(got == before2);
    CHECK(slots == slots_before2);
    CHECK(updates == 0);
  }
}

TEST_CASE("a fixed-size table refuses ids out of range and changes nothing", "[embedding]") {
  auto sgd = MakeOptimizer("learning_rate: 1 sgd {}");
  EmbeddingTable t(Table(2, 100), sgd.get());
  std::vector<float> out(4);
  const std::vector<uint64_t> good = {0, 99}, bad = {3, 100};
  REQUIRE(t.Lookup(good, 0, out.data()).ok());
  absl::Status st = t.Lookup(bad, 0, out.data());
  CHECK(absl::IsOutOfRange(st));
  CHECK(st.message().find("id 100 out of range [0, 100)") != std::string::npos);
  CHECK(t.stats().rows == 2);  // row 3 was not created by the refused lookup
  const std::vector<float> g = {1, 1, 1, 1};
  const std::vector<float> row0 = Row(t, 0);
  const std::vector<uint64_t> mixed = {0, 1000};
  CHECK(absl::IsOutOfRange(t.ApplyGradients(mixed, g.data(), 1, 1, 0, 1)));
  CHECK(Row(t, 0) == row0);
  const std::vector<float> nan = {1, NAN};
  const uint64_t zero[] = {0};
  CHECK(absl::IsInvalidArgument(t.ApplyGradients(zero, nan.data(), 1, 1, 0, 1)));
  CHECK(Row(t, 0) == row0);
}

TEST_CASE("expiry drops rows untouched for n steps; their next touch starts afresh",
          "[embedding]") {
  auto sgd = MakeOptimizer("learning_rate: 1 sgd {}");
  EmbeddingTable::Options o = Table(2);
  o.expire_after_steps = 10;
  EmbeddingTable t(o, sgd.get());
  const std::vector<float> fresh = Row(t, 42, 0);
  Row(t, 43, 0);
  const std::vector<float> g = {1, 1};
  const uint64_t id42[] = {42};
  REQUIRE(t.ApplyGradients(id42, g.data(), 1, 1, 0, 5).ok());  // touched at 5
  CHECK(t.Expire(12, true) == 1);  // 43 (touched at 0) goes, 42 (at 5) stays
  CHECK(t.stats().rows == 1);
  CHECK(Row(t, 42, 12)[0] == fresh[0] - 1);
  CHECK(t.Expire(30, true) == 1);
  CHECK(t.Expire(31) == 0);  // the next sweep is due at 30 + 10 / 4
  CHECK(t.stats().rows == 0);
  CHECK(t.stats().rows_expired == 2);
  CHECK(Row(t, 42, 31) == fresh);  // created again from its initial value
  // Without expiry nothing is ever dropped.
  EmbeddingTable keep(Table(2), sgd.get());
  Row(keep, 1, 0);
  CHECK(keep.Expire(1000000) == 0);
  CHECK(keep.stats().rows == 1);
}

TEST_CASE("admission: a row is created on the k-th sighting; before, zeros and dropped "
          "gradients", "[embedding]") {
  auto sgd = MakeOptimizer("learning_rate: 1 sgd {}");
  EmbeddingTable::Options o = Table(2);
  o.admit_after = 3;
  EmbeddingTable t(o, sgd.get());
  const std::vector<float> g = {1, 1};
  const uint64_t id[] = {9};
  CHECK(Row(t, 9) == std::vector<float>{0, 0});
  REQUIRE(t.ApplyGradients(id, g.data(), 1, 1, 0, 1).ok());
  CHECK(t.stats().gradients_dropped == 1);
  CHECK(Row(t, 9) == std::vector<float>{0, 0});
  CHECK(t.stats().rows == 0);
  CHECK(t.stats().pending_ids == 1);
  std::vector<float> want(2);
  InitialRow(o.seed, 9, 2, 0.5f, want.data());
  CHECK(Row(t, 9) == want);  // the third sighting admits it
  CHECK(t.stats().rows == 1);
  CHECK(t.stats().pending_ids == 0);
  REQUIRE(t.ApplyGradients(id, g.data(), 1, 1, 0, 2).ok());
  CHECK(Row(t, 9) == std::vector<float>{want[0] - 1, want[1] - 1});
}

TEST_CASE("no lost update: 8 threads x 200 sparse pushes to one table", "[embedding][concurrency]") {
  auto sgd = MakeOptimizer("learning_rate: 1 sgd {}");
  EmbeddingTable::Options o = Table(4);
  o.init_scale = 0;  // rows start at zero: the sums stay exact
  EmbeddingTable t(o, sgd.get());
  std::vector<std::thread> threads;
  std::atomic<int> refused{0};  // asserted on the test's thread (Catch2 is not thread-safe)
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&t, &refused, k] {
      // Ids 0..63 (every shard), each twice per push (summed), plus k's own.
      std::vector<uint64_t> ids;
      for (uint64_t id = 0; id < 64; ++id) ids.insert(ids.end(), {id, id});
      ids.push_back(1000 + k);
      const std::vector<float> g(ids.size() * 4, 1.0f);
      for (int i = 0; i < 200; ++i) {
        if (!t.ApplyGradients(ids, g.data(), 1.0f, 1.0f, 0, i).ok()) ++refused;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(refused == 0);
  for (uint64_t id = 0; id < 64; ++id) {
    std::vector<float> v;
    int64_t updates = 0;
    REQUIRE(t.ReadRow(id, &v, nullptr, &updates));
    CHECK(v == std::vector<float>(4, -8 * 200 * 2));
    CHECK(updates == 8 * 200);
  }
  for (int k = 0; k < 8; ++k) CHECK(Row(t, 1000 + k) == std::vector<float>(4, -200));
}

TEST_CASE("ids spread evenly over servers by hash, and consistently", "[embedding]") {
  // Consecutive ids and strided ids (where id mod n would pile up) alike.
  for (uint64_t stride : {uint64_t{1}, uint64_t{4}, uint64_t{1} << 20}) {
    for (int n : {2, 3, 4, 5}) {
      std::vector<int> count(n, 0);
      for (uint64_t i = 0; i < 100000; ++i) ++count[ServerForId(i * stride, n)];
      for (int c : count) CHECK(std::abs(c - 100000 / n) < 100000 / n / 20);  // within 5%
    }
  }
  // Going from 4 to 5 servers moves about a fifth of the ids, all to the new one.
  int moved = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    const int a = ServerForId(i, 4), b = ServerForId(i, 5);
    if (a != b) {
      ++moved;
      CHECK(b == 4);
    }
  }
  CHECK(std::abs(moved - 20000) < 1000);
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

TEST_CASE("rows exported for a checkpoint import into another table bitwise", "[embedding][checkpoint]") {
  auto adam = MakeOptimizer("learning_rate: 0.1 adam {}");
  EmbeddingTable a(Table(3), adam.get());
  std::vector<uint64_t> ids = {9, 1ull << 60, 4, 77, 9};
  std::vector<float> grads(ids.size() * 3);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.25f * static_cast<float>(i) - 1;
  REQUIRE(a.ApplyGradients(ids, grads.data(), 1.0f, 0.1f, 0, 5).ok());
  REQUIRE(a.ApplyGradients({4}, grads.data(), 1.0f, 0.1f, 0, 6).ok());
  const EmbeddingTable::Rows rows = a.ExportRows().value();
  REQUIRE(rows.ids.size() == 4);
  REQUIRE(rows.slots.size() == 2);

  EmbeddingTable b(Table(3), adam.get());
  REQUIRE(b.ImportRows(rows.ids, rows.values.data(), rows.slots, rows.updates, rows.touched).ok());
  for (uint64_t id : {9ull, 1ull << 60, 4ull, 77ull}) {
    INFO(id);
    std::vector<float> va, vb;
    OptimizerSlots sa, sb;
    int64_t ua = 0, ub = 0;
    REQUIRE(a.ReadRow(id, &va, &sa, &ua));
    REQUIRE(b.ReadRow(id, &vb, &sb, &ub));
    CHECK(va == vb);
    CHECK(sa == sb);
    CHECK(ua == ub);
  }
  // The next update is the same on both: slots and counts came along.
  REQUIRE(a.ApplyGradients({4}, grads.data(), 1.0f, 0.1f, 0, 7).ok());
  REQUIRE(b.ApplyGradients({4}, grads.data(), 1.0f, 0.1f, 0, 7).ok());
  std::vector<float> va, vb;
  REQUIRE(a.ReadRow(4, &va));
  REQUIRE(b.ReadRow(4, &vb));
  CHECK(va == vb);
  CHECK(b.ExportRows().value().ids == a.ExportRows().value().ids);

  // Without slots: the values alone, fresh optimizer state.
  EmbeddingTable c(Table(3), adam.get());
  REQUIRE(c.ImportRows(rows.ids, rows.values.data(), {}, {}, {}).ok());
  OptimizerSlots sc;
  int64_t uc = -1;
  std::vector<float> vc;
  REQUIRE(c.ReadRow(77, &vc, &sc, &uc));
  CHECK(uc == 0);
  CHECK(sc[0] == std::vector<float>(3, 0.0f));

  // Refused, changing nothing: a wrong slot count or size, a non-finite
  // value, an id outside a fixed-size table.
  EmbeddingTable d(Table(3, 100), adam.get());
  const std::vector<uint64_t> in_range = {1, 2};
  std::vector<float> values(6, 1.0f);
  CHECK(!d.ImportRows(in_range, values.data(), {values}, {}, {}).ok());
  CHECK(!d.ImportRows(in_range, values.data(), {values, std::vector<float>(5)}, {}, {}).ok());
  values[4] = std::nanf("");
  CHECK(!d.ImportRows(in_range, values.data(), {}, {}, {}).ok());
  values[4] = 1;
  const std::vector<uint64_t> out_of_range = {1, 100};
  CHECK(!d.ImportRows(out_of_range, values.data(), {}, {}, {}).ok());
  CHECK(d.stats().rows == 0);
}

TEST_CASE("a save's delta holds the rows changed since the save before and the ids dropped",
          "[embedding][checkpoint][incremental]") {
  auto adam = MakeOptimizer("learning_rate: 0.1 adam {}");
  EmbeddingTable::Options o = Table(2);
  o.expire_after_steps = 10;
  EmbeddingTable t(o, adam.get());
  const std::vector<float> g = {0.5f, -1};
  for (uint64_t id = 0; id < 100; ++id) Row(t, id, 0);  // 100 rows, all touched at 0
  const uint32_t first = t.EndGeneration();  // a full save: every row
  CHECK(t.ExportRows().value().ids.size() == 100);

  // Between saves: 3 rows updated, one looked up, one created; then rows
  // untouched since 0 expire at 12, except those 5.
  for (uint64_t id : {3, 50, 97}) REQUIRE(t.ApplyGradients({id}, g.data(), 1, 0.1f, 0, 5).ok());
  Row(t, 7, 6);
  Row(t, 1000, 6);
  REQUIRE(t.Expire(12, true) == 96);
  const uint32_t second = t.EndGeneration();
  CHECK(second == first + 1);
  EmbeddingTable::Rows delta = t.ExportChangedRows(first).value();
  std::sort(delta.ids.begin(), delta.ids.end());
  CHECK(delta.ids == std::vector<uint64_t>{3, 7, 50, 97, 1000});
  CHECK(delta.values.size() == 5 * 2);
  CHECK(delta.slots.size() == 2);
  CHECK(delta.deleted.size() == 96);
  CHECK(std::count(delta.deleted.begin(), delta.deleted.end(), 3) == 0);

  // Nothing changed since: an empty delta. A dropped id created again is a
  // row of the next delta, not a drop.
  CHECK(t.ExportChangedRows(second).value().ids.empty());
  CHECK(t.ExportChangedRows(second).value().deleted.empty());
  Row(t, 0, 13);
  const uint32_t third = t.EndGeneration();
  EmbeddingTable::Rows next = t.ExportChangedRows(second).value();
  CHECK(next.ids == std::vector<uint64_t>{0});
  CHECK(next.deleted.empty());
  // Against the first save, both deltas together (id 0 is a row again).
  CHECK(t.ExportChangedRows(first).value().ids.size() == 6);
  CHECK(t.ExportChangedRows(first).value().deleted.size() == 95);
  // Drops stamped at or before a save no delta rests on are forgotten.
  t.ForgetDeletedThrough(third);
  CHECK(t.ExportChangedRows(first).value().deleted.empty());
  // Imported rows count as changed.
  const EmbeddingTable::Rows all = t.ExportRows().value();
  REQUIRE(t.ImportRows({all.ids[0]}, all.values.data(), {}, {}, {}).ok());
  CHECK(t.ExportChangedRows(third).value().ids == std::vector<uint64_t>{all.ids[0]});
}

TEST_CASE("a peek reads rows as a lookup would and changes nothing", "[embedding]") {
  auto sgd = MakeOptimizer("learning_rate: 1 sgd {}");
  EmbeddingTable::Options o = Table(2);
  o.expire_after_steps = 10;
  EmbeddingTable t(o, sgd.get());
  const std::vector<float> g = {1, 1};
  REQUIRE(t.ApplyGradients({5}, g.data(), 1, 1, 0, 0).ok());
  const uint32_t saved = t.EndGeneration();
  std::vector<float> out(4);
  const std::vector<uint64_t> ids = {5, 6};
  REQUIRE(t.Peek(ids, out.data()).ok());
  std::vector<float> five(2), six(2);
  InitialRow(o.seed, 5, 2, 0.5f, five.data());
  InitialRow(o.seed, 6, 2, 0.5f, six.data());
  CHECK(out == std::vector<float>{five[0] - 1, five[1] - 1, six[0], six[1]});  // 6 as created
  CHECK(t.stats().rows == 1);                     // but it is not
  CHECK(t.ExportChangedRows(saved).value().ids.empty());  // nor is 5 touched
  CHECK(t.Expire(11, true) == 1);                 // so it expires at 0 + 10
  // Not admitted yet: zeros, and the peek is no sighting.
  o.admit_after = 2;
  EmbeddingTable a(o, sgd.get());
  REQUIRE(a.Peek(ids, out.data()).ok());
  CHECK(out == std::vector<float>(4, 0.0f));
  CHECK(a.stats().pending_ids == 0);
  // Ids outside a fixed-size table are refused, as for a lookup.
  EmbeddingTable f(Table(2, 4), sgd.get());
  CHECK(f.Peek(ids, out.data()).code() == absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace pstrain
