#include "common/storage/safetensors_reader.h"

#include <sys/stat.h>

#include <cstring>
#include <fstream>

#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"
#include "nlohmann/json.hpp"

namespace pstrain {
namespace {

// A .safetensors file of `header` (dumped as it is) and `data`.
std::string Write(const std::string& dir, const std::string& name, const std::string& header,
                  const std::string& data) {
  std::string bytes(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  bytes += header + data;
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string Floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.begin(), s.size());
  return s;
}

constexpr int64_t kMax = int64_t{1} << 30;

TEST_CASE("a file written as Hugging Face's safetensors writes it reads back in data order") {
  const std::string dir = testing::NewTempDir("safetensors");
  // Keys in the JSON object sorted by name, data in another order: the
  // order of the data is the variables' order.
  nlohmann::json h;
  h["b.weight"] = {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}};
  h["a.bias"] = {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {16, 20}}};
  h["__metadata__"] = {{"format", "pt"}};
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string path = Write(dir, "m.safetensors", header, Floats({1, 2, 3, 4, 5}));
  std::vector<std::string> names;
  auto t = ReadSafetensors(Env::Default(), path, kMax, &names);
  REQUIRE(t.ok());
  REQUIRE(names == std::vector<std::string>{"b.weight", "a.bias"});
  CHECK((*t)[0].shape() == std::vector<int64_t>{2, 2});
  CHECK((*t)[0].values() == std::vector<float>{1, 2, 3, 4});
  CHECK((*t)[1].values() == std::vector<float>{5});
  auto index = ReadSafetensorsIndex(Env::Default(), path, kMax);
  REQUIRE(index.ok());
  CHECK(index->metadata.at("format") == "pt");
}

TEST_CASE("hostile or foreign safetensors files are refused naming what is wrong") {
  const std::string dir = testing::NewTempDir("safetensors_bad");
  auto refused = [&](const std::string& header, const std::string& data) {
    const std::string path = Write(dir, "x.safetensors", header, data);
    auto t = ReadSafetensors(Env::Default(), path, kMax, nullptr);
    REQUIRE_FALSE(t.ok());
    CHECK(absl::IsInvalidArgument(t.status()));
    return std::string(t.status().message());
  };
  const std::string four = Floats({1, 2, 3, 4});
  CHECK_THAT(refused(R"({"w":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})", four.substr(0, 8)),
             Catch::Contains("\"w\" is \"F16\""));
  CHECK_THAT(refused(R"({"w":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", four.substr(0, 4)),
             Catch::Contains("rank 0"));
  CHECK_THAT(refused(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", ""),
             Catch::Contains("not a positive count"));
  CHECK_THAT(refused(R"({"w":{"dtype":"F32","shape":[-3],"data_offsets":[0,4]}})", four),
             Catch::Contains("not a positive count"));
  CHECK_THAT(refused(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", four),
             Catch::Contains("do not hold 3 float32"));
  // Two tensors on the same bytes, and one past the file's end.
  CHECK_THAT(refused(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                     R"("b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                     four),
             Catch::Contains("overlapping"));
  CHECK_THAT(refused(R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", four),
             Catch::Contains("the file at"));
  // A dimension nested a million deep (quoting it would recurse through
  // every level), and a dtype of a megabyte (quoted to 64 bytes).
  CHECK_THAT(refused(R"({"w":{"dtype":"F32","shape":[)" + std::string(1 << 20, '[') +
                         std::string(1 << 20, ']') + R"(],"data_offsets":[0,4]}})",
                     four.substr(0, 4)),
             Catch::Contains("not a positive count (array)"));
  const std::string long_dtype =
      refused(R"({"w":{"dtype":")" + std::string(1 << 20, 'x') + R"(","shape":[1],)"
              R"("data_offsets":[0,4]}})",
              four.substr(0, 4));
  CHECK(long_dtype.size() < 400);
  CHECK_THAT(refused("[1,2]", ""), Catch::Contains("not a JSON object"));
  CHECK_THAT(refused("{\"w\":", ""), Catch::Contains("not a JSON object"));
  CHECK_THAT(refused("{}", ""), Catch::Contains("no tensors"));
  CHECK_THAT(refused(R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776],)"
                     R"("data_offsets":[0,4]}})",
                     four.substr(0, 4)),
             Catch::Contains("too many elements"));
  // A header length past the file.
  {
    std::string bytes(8, '\0');
    bytes[0] = 100;
    const std::string path = dir + "/short.safetensors";
    std::ofstream(path, std::ios::binary) << bytes << "{}";
    auto t = ReadSafetensors(Env::Default(), path, kMax, nullptr);
    REQUIRE_FALSE(t.ok());
    CHECK_THAT(std::string(t.status().message()), Catch::Contains("a header of 100 bytes"));
  }
  // A FIFO is refused before it is opened (a read would wait forever).
  const std::string fifo = dir + "/fifo.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto t = ReadSafetensors(Env::Default(), fifo, kMax, nullptr);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(std::string(t.status().message()), Catch::Contains("fifo.safetensors"));
  // Over the size allowed.
  const std::string big = Write(dir, "big.safetensors",
                                R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", four);
  CHECK_FALSE(ReadSafetensors(Env::Default(), big, 40, nullptr).ok());
}

}  // namespace
}  // namespace pstrain
