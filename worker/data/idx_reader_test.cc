#include "worker/data/idx_reader.h"

#include <cstdlib>

#include "catch2/catch.hpp"
#include "worker/data/idx.h"

namespace pstrain {
namespace {

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp ? tmp : "/tmp";
}

TEST_CASE("IDX datasets load and are validated against the model", "[idx]") {
  const std::string dir = TempDir();
  IdxArray images{{3, 2, 2}, {0, 255, 0, 255, 1, 2, 3, 4, 9, 9, 9, 9}};
  IdxArray labels{{3}, {1, 0, 2}};
  REQUIRE(WriteIdxFile(Env::Default(), dir + "/img", images).ok());
  REQUIRE(WriteIdxFile(Env::Default(), dir + "/lbl", labels).ok());
  auto d = LoadIdxDataset(Env::Default(), dir + "/img", dir + "/lbl", 4, 3, true);
  REQUIRE(d.ok());
  CHECK(d->size == 3);
  CHECK(d->dim == 4);
  CHECK(d->x[1] == 1.0f);
  CHECK(d->x[4] == Approx(1.0f / 255));
  CHECK(d->y == std::vector<int32_t>{1, 0, 2});
  auto raw = LoadIdxDataset(Env::Default(), dir + "/img", dir + "/lbl", 4, 3, false);
  REQUIRE(raw.ok());
  CHECK(raw->x[1] == 255.0f);

  auto wrong_dim = LoadIdxDataset(Env::Default(), dir + "/img", dir + "/lbl", 5, 3, true);
  CHECK(wrong_dim.status().message().find("input_dim is 5") != std::string::npos);
  auto wrong_labels = LoadIdxDataset(Env::Default(), dir + "/img", dir + "/lbl", 4, 2, true);
  CHECK(wrong_labels.status().message().find("label 2 at index 2") != std::string::npos);
  IdxArray short_labels{{2}, {1, 0}};
  REQUIRE(WriteIdxFile(Env::Default(), dir + "/lbl2", short_labels).ok());
  auto mismatch = LoadIdxDataset(Env::Default(), dir + "/img", dir + "/lbl2", 4, 3, true);
  CHECK(mismatch.status().message().find("3 images but") != std::string::npos);
  CHECK_FALSE(LoadIdxDataset(Env::Default(), dir + "/missing", dir + "/lbl", 4, 3, true).ok());
}

}  // namespace
}  // namespace pstrain
