#include "common/storage/tensor_export.h"


#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"
#include "nlohmann/json.hpp"

namespace pstrain {
namespace {

TEST_CASE("npy headers are NumPy's version 1.0, 64-byte aligned, with Python tuples",
          "[export]") {
  for (const auto& [shape, tuple] :
       std::vector<std::pair<std::vector<int64_t>, std::string>>{
           {{}, "()"}, {{4}, "(4,)"}, {{2, 3}, "(2, 3)"}, {{784, 64, 1}, "(784, 64, 1)"}}) {
    const std::string h = NpyHeader(shape);
    INFO(h);
    CHECK(h.size() % 64 == 0);
    CHECK(h.compare(0, 8, std::string("\x93NUMPY\x01\x00", 8)) == 0);
    const size_t len = static_cast<unsigned char>(h[8]) | static_cast<unsigned char>(h[9]) << 8;
    CHECK(len == h.size() - 10);
    CHECK(h.back() == '\n');
    CHECK(h.find("{'descr': '<f4', 'fortran_order': False, 'shape': " + tuple + ", }") ==
          10);
  }
}

TEST_CASE("an npy file is its header then the raw floats", "[export]") {
  const std::string path = JoinPath(testing::NewTempDir("export"), "w.npy");
  const float w[] = {1.5f, -2, 3, 4e-8f, 5, 6};
  REQUIRE(WriteNpy(Env::Default(), path, {"w", {2, 3}, w}).ok());
  auto bytes = Env::Default()->ReadFile(path);
  REQUIRE(bytes.ok());
  const std::string h = NpyHeader({2, 3});
  REQUIRE(bytes->size() == h.size() + sizeof(w));
  CHECK(bytes->compare(0, h.size(), h) == 0);
  CHECK(std::memcmp(bytes->data() + h.size(), w, sizeof(w)) == 0);
  CHECK_FALSE(Env::Default()->FileExists(path + ".tmp"));
  CHECK(WriteNpy(Env::Default(), path, {"bad", {-1}, w}).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a safetensors file has a JSON header of contiguous offsets, then the tensors",
          "[export]") {
  const std::string path = JoinPath(testing::NewTempDir("export"), "model.safetensors");
  const float a[] = {1, 2, 3, 4, 5, 6};
  const float b[] = {7, 8};
  const float s[] = {9};
  REQUIRE(WriteSafetensors(Env::Default(), path,
                           {{"dense0/kernel", {3, 2}, a}, {"dense0/bias", {2}, b}, {"s", {}, s}},
                           {{"pstrain_step", "7"}})
              .ok());
  auto bytes = Env::Default()->ReadFile(path);
  REQUIRE(bytes.ok());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>((*bytes)[i])) << (8 * i);
  CHECK(n % 8 == 0);
  REQUIRE(bytes->size() == 8 + n + sizeof(a) + sizeof(b) + sizeof(s));
  const nlohmann::json j = nlohmann::json::parse(bytes->substr(8, n));
  CHECK(j["__metadata__"]["pstrain_step"] == "7");
  CHECK(j["dense0/kernel"]["dtype"] == "F32");
  CHECK(j["dense0/kernel"]["shape"] == std::vector<int64_t>{3, 2});
  CHECK(j["dense0/kernel"]["data_offsets"] == std::vector<int64_t>{0, 24});
  CHECK(j["dense0/bias"]["data_offsets"] == std::vector<int64_t>{24, 32});
  CHECK(j["s"]["shape"] == std::vector<int64_t>{});
  CHECK(j["s"]["data_offsets"] == std::vector<int64_t>{32, 36});
  const char* data = bytes->data() + 8 + n;
  CHECK(std::memcmp(data, a, sizeof(a)) == 0);
  CHECK(std::memcmp(data + 24, b, sizeof(b)) == 0);
  CHECK(std::memcmp(data + 32, s, sizeof(s)) == 0);

  // Names must be unique and not the metadata's key.
  CHECK(!SafetensorsHeader({{"x", {1}, s}, {"x", {1}, s}}, {}).ok());
  CHECK(!SafetensorsHeader({{"__metadata__", {1}, s}}, {}).ok());
  CHECK(!SafetensorsHeader({{"", {1}, s}}, {}).ok());
}

TEST_CASE("a tensor given in pieces writes the bytes its data would; a wrong count fails",
          "[export]") {
  const std::string dir = testing::NewTempDir("export_pieces");
  const float w[] = {1.5f, -2, 3, 4e-8f, 5, 6, 7, 8};  // the tensor is the first 6
  // Pieces of two floats each (three make the tensor).
  auto pieces = [&w](int count) -> ExportProducer {
    return [&w, count](const std::function<absl::Status(absl::string_view)>& append) {
      for (int p = 0; p < count; ++p) {
        absl::Status st =
            append(absl::string_view(reinterpret_cast<const char*>(w + 2 * p), 8));
        if (!st.ok()) return st;
      }
      return absl::OkStatus();
    };
  };
  ExportTensor streamed{"w", {2, 3}};
  streamed.produce = pieces(3);
  for (const bool npy : {true, false}) {
    const std::string a = JoinPath(dir, npy ? "a.npy" : "a.safetensors");
    const std::string b = JoinPath(dir, npy ? "b.npy" : "b.safetensors");
    REQUIRE((npy ? WriteNpy(Env::Default(), a, {"w", {2, 3}, w})
                 : WriteSafetensors(Env::Default(), a, {{"w", {2, 3}, w}}, {}))
                .ok());
    REQUIRE((npy ? WriteNpy(Env::Default(), b, streamed)
                 : WriteSafetensors(Env::Default(), b, {streamed}, {}))
                .ok());
    CHECK(Env::Default()->ReadFile(a).value() == Env::Default()->ReadFile(b).value());
  }
  // Fewer or more bytes than the shape's: an error, and no file.
  for (int count : {2, 4}) {
    ExportTensor wrong{"w", {2, 3}};
    wrong.produce = pieces(count);
    const std::string path = JoinPath(dir, "wrong.npy");
    const absl::Status st = WriteNpy(Env::Default(), path, wrong);
    CHECK(st.code() == absl::StatusCode::kInternal);
    CHECK_FALSE(Env::Default()->FileExists(path));
  }
}

}  // namespace
}  // namespace pstrain
