#include "common/storage/tensor_file.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "catch2/catch.hpp"
#include "common/base/crc32c.h"

namespace pstrain {
namespace {

TEST_CASE("CRC32C matches the standard check values", "[crc32c]") {
  CHECK(Crc32c("123456789", 9) == 0xE3069283u);
  CHECK(Crc32c("", 0) == 0u);
  std::string zeros(32, '\0');
  CHECK(Crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);  // RFC 3720 B.4
  // Extending in pieces equals one pass.
  CHECK(Crc32cExtend(Crc32c("1234", 4), "56789", 5) == 0xE3069283u);
  CHECK(Crc32cExtendPortable(0, "123456789", 9) == 0xE3069283u);
}

TEST_CASE("CRC32C: the hardware path equals the tables at every length and alignment",
          "[crc32c]") {
  std::string bytes(333, '\0');
  uint32_t x = 12345;
  for (char& c : bytes) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t n = 0; offset + n <= 300; ++n) {
      const char* p = bytes.data() + offset;
      INFO("offset " << offset << " length " << n);
      REQUIRE(Crc32cExtend(0, p, n) == Crc32cExtendPortable(0, p, n));
      REQUIRE(Crc32cExtend(0x1234567u, p, n) == Crc32cExtendPortable(0x1234567u, p, n));
    }
  }
  // Extending in pieces equals one pass on both.
  CHECK(Crc32cExtend(Crc32c(bytes.data(), 100), bytes.data() + 100, 233) ==
        Crc32cExtendPortable(0, bytes.data(), 333));
}

TEST_CASE("tensor files round-trip and detect damage", "[tensor_file]") {
  TensorMap m;
  m.emplace("w", Tensor({2, 3}, {1, 2, 3, 4, 5, 6}));
  m.emplace("b", Tensor({3}, {0.5f, -0.5f, 0}));
  std::string bytes = EncodeTensorFile(m);
  auto back = DecodeTensorFile(bytes, "t");
  REQUIRE(back.ok());
  CHECK(back->at("w").values() == m.at("w").values());
  CHECK(back->at("w").shape() == std::vector<int64_t>{2, 3});

  for (size_t cut : {size_t{0}, size_t{10}, bytes.size() / 2, bytes.size() - 1}) {
    auto r = DecodeTensorFile(bytes.substr(0, cut), "t");
    CHECK(absl::IsDataLoss(r.status()));
  }
  // No tensors at all: still a file that reads back.
  auto none = DecodeTensorFile(EncodeTensorFile(TensorMap()), "none");
  REQUIRE(none.ok());
  CHECK(none->empty());
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x1;
  CHECK(absl::IsDataLoss(DecodeTensorFile(flipped, "t").status()));
}

TEST_CASE("tensor files are written atomically through the Env", "[tensor_file]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = JoinPath(tmp ? tmp : "/tmp", "tensor_file_test/sub");
  REQUIRE(Env::Default()->CreateDirs(dir).ok());
  std::string path = JoinPath(dir, "model.pst");
  TensorMap m;
  m.emplace("x", Tensor({1}, {42.0f}));
  REQUIRE(WriteTensorFile(Env::Default(), path, m).ok());
  CHECK_FALSE(Env::Default()->FileExists(path + ".tmp"));
  auto back = ReadTensorFile(Env::Default(), path);
  REQUIRE(back.ok());
  CHECK(back->at("x").values()[0] == 42.0f);
  CHECK(absl::IsNotFound(ReadTensorFile(Env::Default(), path + ".nope").status()));

  // Written from memory it does not own, record by record (a final model
  // is written so, from the chief's model): the same bytes as encoded whole.
  TensorMap two;
  two.emplace("w", Tensor({2, 3}, {1, 2, 3, 4, 5, 6}));
  two.emplace("a/empty", Tensor({0, 4}, {}));
  two.emplace("b", Tensor({3}, {0.5f, -0.5f, 0}));
  std::map<std::string, TensorView> views;
  for (const auto& [name, t] : two) views.emplace(name, TensorView{t.shape(), t.data()});
  const std::string viewed = JoinPath(dir, "viewed.pst");
  REQUIRE(WriteTensorFile(Env::Default(), viewed, views).ok());
  auto bytes = Env::Default()->ReadFile(viewed);
  REQUIRE(bytes.ok());
  CHECK(*bytes == EncodeTensorFile(two));
  auto decoded = ReadTensorFile(Env::Default(), viewed);
  REQUIRE(decoded.ok());
  CHECK(decoded->at("w").values() == two.at("w").values());
  CHECK(decoded->at("a/empty").shape() == std::vector<int64_t>{0, 4});
  // A write that fails leaves the earlier file and no temp file.
  REQUIRE(Env::Default()->CreateDirs(viewed + "2.tmp").ok());  // the temp file cannot be made
  CHECK_FALSE(WriteTensorFile(Env::Default(), viewed + "2", views).ok());
  CHECK_FALSE(Env::Default()->FileExists(viewed + "2"));
}

}  // namespace
}  // namespace pstrain
