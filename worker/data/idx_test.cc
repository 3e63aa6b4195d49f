#include "worker/data/idx.h"

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

TEST_CASE("IDX images and labels round-trip", "[idx]") {
  IdxArray images{{2, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}};
  std::string bytes = EncodeIdx(images);
  CHECK(bytes.size() == 4 + 12 + 12);
  CHECK(bytes[3] == 3);
  auto back = DecodeIdx(bytes, "img");
  REQUIRE(back.ok());
  CHECK(back->dims == images.dims);
  CHECK(back->data == images.data);
}

TEST_CASE("MNIST's header layout is read big-endian", "[idx]") {
  // 00 00 08 01 | 00 00 00 03 | 7 8 9 : three labels.
  std::string bytes = {0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9};
  auto a = DecodeIdx(bytes, "labels");
  REQUIRE(a.ok());
  CHECK(a->dims == std::vector<int64_t>{3});
  CHECK(a->data == std::vector<uint8_t>{7, 8, 9});
}

TEST_CASE("bad IDX files are refused with the file named", "[idx]") {
  std::string good = {0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9};
  auto r = DecodeIdx(good.substr(0, 10), "labels.idx");
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()).find("labels.idx") != std::string::npos);
  std::string wrong_type = good;
  wrong_type[2] = 0x0D;  // float
  CHECK_FALSE(DecodeIdx(wrong_type, "x").ok());
  CHECK_FALSE(DecodeIdx("", "x").ok());
  std::string bad_magic = good;
  bad_magic[0] = 1;
  CHECK_FALSE(DecodeIdx(bad_magic, "x").ok());
}

}  // namespace
}  // namespace pstrain
