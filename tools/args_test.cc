#include "tools/args.h"

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

const Args::FlagSpec kFlags = {{"out", {"", "dir"}}, {"n", {"5", "count"}},
                               {"verbose", {"false", "more"}}};

TEST_CASE("flags parse in both spellings with defaults", "[args]") {
  auto a = Args::Parse({"--out=/x", "--n", "7", "--verbose"}, kFlags);
  REQUIRE(a.ok());
  CHECK(a->Get("out") == "/x");
  CHECK(*a->GetInt("n") == 7);
  CHECK(a->GetBool("verbose"));
  auto d = Args::Parse({}, kFlags);
  REQUIRE(d.ok());
  CHECK(*d->GetInt("n") == 5);
  CHECK_FALSE(d->GetBool("verbose"));
}

TEST_CASE("unknown flags, missing values and bad numbers are errors", "[args]") {
  CHECK_FALSE(Args::Parse({"--nope=1"}, kFlags).ok());
  CHECK_FALSE(Args::Parse({"--out"}, kFlags).ok());
  CHECK_FALSE(Args::Parse({"stray"}, kFlags).ok());
  auto a = Args::Parse({"--n=abc"}, kFlags);
  REQUIRE(a.ok());
  CHECK_FALSE(a->GetInt("n").ok());
}

}  // namespace
}  // namespace pstrain
