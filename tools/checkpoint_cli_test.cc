#include "tools/checkpoint_cli.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "common/storage/tensor_file.h"
#include "nlohmann/json.hpp"
#include "tools/local_ports.h"
#include "common/storage/tensor_export.h"

namespace pstrain {
namespace {

// One variable "w" [2, 2] = {-3, 1, 2, 4} on one shard, SGD (no slots).
std::string WriteCheckpoint(const std::string& dir, int64_t step) {
  static const float kW[] = {-3, 1, 2, 4};
  const std::string ckpt = JoinPath(dir, CheckpointDirName(step));
  ShardTensor t;
  t.variable = "w";
  t.shape = {2, 2};
  t.data = kW;
  t.elements = 4;
  int64_t bytes = 0;
  auto entries = WriteShard(Env::Default(), ckpt, 0, 1, {t}, &bytes);
  REQUIRE(entries.ok());
  CheckpointManifest m;
  m.set_step(step);
  m.set_num_shards(1);
  m.set_num_workers(1);
  m.set_optimizer("sgd");
  m.set_unix_time_ms(1700000000000);
  CheckpointVariable* v = m.add_variables();
  v->set_name("w");
  v->add_shape(2);
  v->add_shape(2);
  *m.add_tensors() = (*entries)[0];
  ShardFile* f = m.add_shards();
  f->set_file(ShardFileName(0, 1));
  f->set_bytes(bytes);
  REQUIRE(WriteManifest(Env::Default(), ckpt, m).ok());
  return ckpt;
}

struct Result {
  int code;
  std::string out, err;
};

Result Run(const std::vector<std::string>& argv) {
  std::ostringstream out, err;
  const int code = CheckpointCommand(argv, out, err);
  return {code, out.str(), err.str()};
}

TEST_CASE("checkpoint list shows each step, its state and the latest", "[checkpoint][cli]") {
  const std::string dir = testing::NewTempDir("ckcli");
  WriteCheckpoint(dir, 10);
  WriteCheckpoint(dir, 20);
  REQUIRE(Env::Default()->CreateDirs(JoinPath(dir, "ckpt-30")).ok());
  REQUIRE(CommitAndPrune(Env::Default(), dir, 20, 3).ok());
  Result r = Run({"list", dir});
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("10         2023-11-14 22:13:20") != std::string::npos);
  CHECK(r.out.find("complete    latest") != std::string::npos);  // step 20's line
  CHECK(r.out.find("30         -") != std::string::npos);
  CHECK(r.out.find("incomplete") != std::string::npos);
  CHECK(Run({"list", JoinPath(dir, "missing")}).code == 1);
  CHECK(Run({"list"}).code == 2);
  CHECK(Run({"restore", dir}).code == 2);
}

TEST_CASE("checkpoint verify exits 0 only for a good one and names each problem",
          "[checkpoint][cli]") {
  const std::string ckpt = WriteCheckpoint(testing::NewTempDir("ckcli"), 5);
  Result good = Run({"verify", ckpt});
  CHECK(good.code == 0);
  CHECK(good.out.find(": good (step 5, 1 tensors,") != std::string::npos);
  const std::string shard = JoinPath(ckpt, ShardFileName(0, 1));
  auto bytes = Env::Default()->ReadFile(shard);
  REQUIRE(bytes.ok());
  (*bytes)[bytes->size() - 2] ^= 0x01;
  REQUIRE(Env::Default()->WriteFile(shard, *bytes, false).ok());
  Result bad = Run({"verify", ckpt});
  INFO(bad.out);
  CHECK(bad.code == 1);
  CHECK(bad.out.find("shard-0-of-1: w partition 0: CRC32C mismatch") != std::string::npos);
}

TEST_CASE("checkpoint inspect --json gives each variable's statistics", "[checkpoint][cli]") {
  const std::string ckpt = WriteCheckpoint(testing::NewTempDir("ckcli"), 7);
  Result r = Run({"inspect", ckpt, "--json"});
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["step"] == 7);
  CHECK(j["optimizer"] == "sgd");
  REQUIRE(j["variables"].size() == 1);
  const nlohmann::json& w = j["variables"][0];
  CHECK(w["name"] == "w");
  CHECK(w["shape"] == std::vector<int64_t>{2, 2});
  CHECK(w["partitions"] == 1);
  CHECK(w["min"].get<double>() == -3.0);
  CHECK(w["max"].get<double>() == 4.0);
  CHECK(w["mean"].get<double>() == 1.0);
  CHECK(w["l2"].get<double>() == Approx(std::sqrt(30.0)).epsilon(1e-12));
  Result text = Run({"inspect", ckpt});
  CHECK(text.code == 0);
  CHECK(text.out.find("step 7") != std::string::npos);
  CHECK(Run({"inspect", JoinPath(ckpt, "nope")}).code == 1);
}

TEST_CASE("checkpoint export writes safetensors or npy, and refuses bad input", "[checkpoint][cli]") {
  const std::string dir = testing::NewTempDir("ckcli");
  const std::string ckpt = WriteCheckpoint(dir, 7);
  const std::string st = JoinPath(dir, "st");
  Result r = Run({"export", ckpt, "--format=safetensors", "--out=" + st});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("exported step 7: 1 variable(s), 0 embedding table(s), 16 bytes") != std::string::npos);
  auto bytes = Env::Default()->ReadFile(JoinPath(st, "model.safetensors"));
  REQUIRE(bytes.ok());
  const float want[] = {-3, 1, 2, 4};
  CHECK(std::memcmp(bytes->data() + bytes->size() - sizeof(want), want, sizeof(want)) == 0);
  CHECK(bytes->find("\"pstrain_step\":\"7\"") != std::string::npos);

  const std::string npy = JoinPath(dir, "npy");
  REQUIRE(Run({"export", ckpt, "--format=npy", "--out=" + npy}).code == 0);
  auto w = Env::Default()->ReadFile(JoinPath(npy, "w.npy"));
  REQUIRE(w.ok());
  CHECK(w->size() == NpyHeader({2, 2}).size() + sizeof(want));
  CHECK(w->find("'shape': (2, 2)") != std::string::npos);

  CHECK(Run({"export", ckpt, "--format=csv", "--out=" + npy}).code == 2);
  CHECK(Run({"export", ckpt, "--format=npy"}).code == 2);
  CHECK(Run({"export", ckpt, "--out=" + npy}).code == 2);
  CHECK(Run({"inspect", ckpt, "--out=" + npy}).code == 2);
  CHECK(Run({"export", ckpt, "--format=npy", "--out=" + npy, "--bogus"}).code == 2);
  // A damaged checkpoint exports nothing.
  const std::string shard = JoinPath(ckpt, ShardFileName(0, 1));
  auto sb = Env::Default()->ReadFile(shard);
  REQUIRE(sb.ok());
  (*sb)[sb->size() - 1] ^= 0x20;
  REQUIRE(Env::Default()->WriteFile(shard, *sb, false).ok());
  const std::string none = JoinPath(dir, "none");
  Result bad = Run({"export", ckpt, "--format=npy", "--out=" + none});
  CHECK(bad.code == 1);
  CHECK(bad.err.find("CRC32C mismatch") != std::string::npos);
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(none, "w.npy")));
}

TEST_CASE("checkpoint export refuses a variable name that is not a safe path", "[checkpoint][cli]") {
  for (const std::string name : {"../evil", "a//b", "/abs", "a/./b", "sp ace"}) {
    INFO(name);
    const std::string dir = testing::NewTempDir("ckcli");
    const std::string ckpt = WriteCheckpoint(dir, 3);
    auto m = ReadManifest(Env::Default(), ckpt);
    REQUIRE(m.ok());
    m->mutable_variables(0)->set_name(name);
    m->mutable_tensors(0)->set_variable(name);
    REQUIRE(WriteManifest(Env::Default(), ckpt, *m).ok());
    Result r = Run({"export", ckpt, "--format=npy", "--out=" + JoinPath(dir, "out")});
    CHECK(r.code == 1);
    CHECK(r.err.find("not a safe file name") != std::string::npos);
  }
}

TEST_CASE("checkpoint verify, inspect and export of a directory of checkpoints point to list",
          "[checkpoint][cli]") {
  const std::string dir = testing::NewTempDir("ckcli");
  WriteCheckpoint(dir, 10);
  WriteCheckpoint(dir, 20);
  REQUIRE(CommitAndPrune(Env::Default(), dir, 20, 3).ok());
  const std::string want = "is a directory of checkpoints, not one: 'pstrain checkpoint list ";
  Result verify = Run({"verify", dir});
  INFO(verify.out);
  CHECK(verify.code == 1);
  CHECK(verify.out.find(want) != std::string::npos);
  CHECK(verify.out.find("the latest is " + JoinPath(dir, "ckpt-20")) != std::string::npos);
  Result inspect = Run({"inspect", dir});
  CHECK(inspect.code == 1);
  CHECK(inspect.err.find(want) != std::string::npos);
  Result exported = Run({"export", dir, "--format=npy", "--out=" + JoinPath(dir, "out")});
  CHECK(exported.code == 1);
  CHECK(exported.err.find(want) != std::string::npos);
  // An empty directory is neither: it is told it has no manifest.
  const std::string empty = JoinPath(dir, "empty");
  REQUIRE(Env::Default()->CreateDirs(empty).ok());
  Result nothing = Run({"verify", empty});
  CHECK(nothing.code == 1);
  CHECK(nothing.out.find(want) == std::string::npos);
}

TEST_CASE("checkpoint export reads a run's final model (model_final.pst)", "[checkpoint][cli]") {
  const std::string dir = testing::NewTempDir("ckcli");
  const std::string model = JoinPath(dir, "model_final.pst");
  TensorMap tensors;
  tensors.emplace("dense0/kernel", Tensor({2, 2}, {-3, 1, 2, 4}));
  tensors.emplace("dense0/bias", Tensor({2}, {0.5f, -0.5f}));
  REQUIRE(WriteTensorFile(Env::Default(), model, tensors).ok());
  const std::string st = JoinPath(dir, "st");
  Result r = Run({"export", model, "--format=safetensors", "--out=" + st});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("exported " + model + ": 2 variable(s), 0 embedding table(s), 24 bytes") !=
        std::string::npos);
  auto bytes = Env::Default()->ReadFile(JoinPath(st, "model.safetensors"));
  REQUIRE(bytes.ok());
  CHECK(bytes->find("\"dense0/kernel\":{") != std::string::npos);
  CHECK(bytes->find("\"shape\":[2,2]") != std::string::npos);
  CHECK(bytes->find("\"pstrain_source\":\"model_final.pst\"") != std::string::npos);
  const std::string npy = JoinPath(dir, "npy");
  REQUIRE(Run({"export", model, "--format=npy", "--out=" + npy}).code == 0);
  auto kernel = Env::Default()->ReadFile(JoinPath(npy, "dense0/kernel.npy"));
  REQUIRE(kernel.ok());
  const float want[] = {-3, 1, 2, 4};
  CHECK(std::memcmp(kernel->data() + kernel->size() - sizeof(want), want, sizeof(want)) == 0);
  // A damaged model file exports nothing.
  auto mb = Env::Default()->ReadFile(model);
  REQUIRE(mb.ok());
  REQUIRE(Env::Default()->WriteFile(model, mb->substr(0, mb->size() / 2), false).ok());
  const std::string none = JoinPath(dir, "none");
  Result bad = Run({"export", model, "--format=npy", "--out=" + none});
  CHECK(bad.code == 1);
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(none, "dense0/kernel.npy")));
}

TEST_CASE("checkpoint restore with no job running says so, naming the chief's address",
          "[checkpoint][cli]") {
  const std::string dir = testing::NewTempDir("ckcli");
  const std::string ckpt = WriteCheckpoint(dir, 4);
  const std::vector<int> ports = PickFreePorts(3);
  REQUIRE(ports.size() == 3);
  const std::string chief = absl::StrCat("127.0.0.1:", ports[0]);
  const std::string spec = JoinPath(dir, "spec.json");
  REQUIRE(Env::Default()
              ->WriteFile(spec,
                          absl::StrCat("{\"chief\": [\"", chief, "\"], \"ps\": [\"127.0.0.1:",
                                       ports[1], "\"], \"worker\": [\"127.0.0.1:", ports[2],
                                       "\"]}"),
                          false)
              .ok());
  Result r = Run({"restore", ckpt, "--cluster_spec=" + spec, "--timeout_s=5"});
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK(r.err.find("no chief answers at " + chief) != std::string::npos);
  CHECK(r.err.find("is the job running?") != std::string::npos);
}

// Hostile checkpoints (issue 49): each is refused at once with a message
// naming the file, and nothing is written outside the output directory.
TEST_CASE("checkpoint commands refuse a manifest or shard that is a FIFO, a device or a symlink "
          "out of its directory",
          "[checkpoint][cli][hostile]") {
  const std::string dir = testing::NewTempDir("ckcli");
  // A manifest that is a FIFO: opening it for reading would wait for a
  // writer forever.
  const std::string fifo_ckpt = WriteCheckpoint(dir, 1);
  const std::string manifest = JoinPath(fifo_ckpt, kManifestFile);
  REQUIRE(::unlink(manifest.c_str()) == 0);
  REQUIRE(::mkfifo(manifest.c_str(), 0600) == 0);
  for (const std::string cmd : {"verify", "inspect"}) {
    Result r = Run({cmd, fifo_ckpt});
    INFO(cmd << ": " << r.out << r.err);
    CHECK(r.code == 1);
    CHECK((r.out + r.err).find(manifest + ": a FIFO, not a regular file; refused") !=
          std::string::npos);
  }
  Result exported = Run({"export", fifo_ckpt, "--format=npy", "--out=" + JoinPath(dir, "o1")});
  CHECK(exported.code == 1);
  CHECK(exported.err.find("a FIFO, not a regular file") != std::string::npos);

  // A manifest that is a symlink to /dev/zero (endless) or out of the
  // checkpoint's directory.
  const std::string zero_ckpt = WriteCheckpoint(dir, 2);
  const std::string zero_manifest = JoinPath(zero_ckpt, kManifestFile);
  REQUIRE(::unlink(zero_manifest.c_str()) == 0);
  REQUIRE(::symlink("/dev/zero", zero_manifest.c_str()) == 0);
  Result zero = Run({"inspect", zero_ckpt});
  CHECK(zero.code == 1);
  CHECK(zero.err.find(zero_manifest + ": a symlink out of its directory; refused") !=
        std::string::npos);
  const std::string other = WriteCheckpoint(dir, 3);
  const std::string out_manifest = JoinPath(other, kManifestFile);
  REQUIRE(::unlink(out_manifest.c_str()) == 0);
  REQUIRE(::symlink(JoinPath(WriteCheckpoint(testing::NewTempDir("ckcli"), 3), kManifestFile).c_str(),
                    out_manifest.c_str()) == 0);
  CHECK(Run({"verify", other}).out.find("a symlink out of its directory") != std::string::npos);

  // A shard that is a FIFO: verify names it, export reads nothing.
  const std::string shard_ckpt = WriteCheckpoint(dir, 4);
  const std::string shard = JoinPath(shard_ckpt, ShardFileName(0, 1));
  REQUIRE(::unlink(shard.c_str()) == 0);
  REQUIRE(::mkfifo(shard.c_str(), 0600) == 0);
  Result bad_shard = Run({"verify", shard_ckpt});
  CHECK(bad_shard.code == 1);
  CHECK(bad_shard.out.find("shard-0-of-1: " + shard + ": a FIFO, not a regular file; refused") !=
        std::string::npos);
  CHECK(Run({"export", shard_ckpt, "--format=npy", "--out=" + JoinPath(dir, "o2")}).code == 1);

  // A pointer file that is a FIFO.
  const std::string pointer_dir = testing::NewTempDir("ckcli");
  WriteCheckpoint(pointer_dir, 5);
  const std::string pointer = JoinPath(pointer_dir, kPointerFile);
  REQUIRE(::mkfifo(pointer.c_str(), 0600) == 0);
  CHECK(absl::IsFailedPrecondition(ReadPointer(Env::Default(), pointer_dir).status()));
  CHECK(Run({"list", pointer_dir}).code == 0);  // lists, without a "latest"
}

TEST_CASE("checkpoint export writes nothing through a symlink beneath its output directory",
          "[checkpoint][cli][hostile]") {
  const std::string dir = testing::NewTempDir("ckcli");
  const std::string ckpt = WriteCheckpoint(dir, 7);
  const std::string elsewhere = testing::NewTempDir("ckcli");
  // out/w.npy.tmp (the temporary the file is written to) planted as a
  // symlink to a file elsewhere: writing it would create that file.
  const std::string out = JoinPath(dir, "out");
  REQUIRE(Env::Default()->CreateDirs(out).ok());
  REQUIRE(::symlink(JoinPath(elsewhere, "victim").c_str(),
                    JoinPath(out, "w.npy.tmp").c_str()) == 0);
  Result r = Run({"export", ckpt, "--format=npy", "--out=" + out});
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK(r.err.find(JoinPath(out, "w.npy.tmp") + " is a symlink: nothing is written through one "
                                                "beneath " + out) != std::string::npos);
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(elsewhere, "victim")));
  // A hard link planted as the temporary is removed, not truncated.
  const std::string kept = JoinPath(elsewhere, "kept");
  REQUIRE(Env::Default()->WriteFile(kept, "keep me", false).ok());
  const std::string out4 = JoinPath(dir, "out4");
  REQUIRE(Env::Default()->CreateDirs(out4).ok());
  REQUIRE(::link(kept.c_str(), JoinPath(out4, "w.npy.tmp").c_str()) == 0);
  CHECK(Run({"export", ckpt, "--format=npy", "--out=" + out4}).code == 0);
  CHECK(Env::Default()->ReadFile(kept).value_or("") == "keep me");
  // The file itself planted as a symlink is refused as well.
  const std::string out5 = JoinPath(dir, "out5");
  REQUIRE(Env::Default()->CreateDirs(out5).ok());
  REQUIRE(::symlink(kept.c_str(), JoinPath(out5, "w.npy").c_str()) == 0);
  CHECK(Run({"export", ckpt, "--format=npy", "--out=" + out5}).code == 1);
  CHECK(Env::Default()->ReadFile(kept).value_or("") == "keep me");
  // Its temporary, and a directory on the way, are refused too.
  const std::string out2 = JoinPath(dir, "out2");
  REQUIRE(Env::Default()->CreateDirs(out2).ok());
  REQUIRE(::symlink(JoinPath(elsewhere, "tmp").c_str(),
                    JoinPath(out2, "model.safetensors.tmp").c_str()) == 0);
  CHECK(Run({"export", ckpt, "--format=safetensors", "--out=" + out2}).code == 1);
  CHECK_FALSE(Env::Default()->FileExists(JoinPath(elsewhere, "tmp")));
  CHECK(CheckWritableBelow("/a/out", "/a/out/d/x.npy").ok());
  CHECK_FALSE(CheckWritableBelow("/a/out", "/a/outside/x.npy").ok());
  CHECK_FALSE(CheckWritableBelow("/a/out", "/a/out").ok());
  const std::string out3 = JoinPath(dir, "out3");
  REQUIRE(Env::Default()->CreateDirs(out3).ok());
  REQUIRE(::symlink(elsewhere.c_str(), JoinPath(out3, "dense0").c_str()) == 0);
  CHECK(absl::IsFailedPrecondition(CheckWritableBelow(out3, JoinPath(out3, "dense0/kernel.npy"))));
  // The output directory itself may be a symlink: it is the caller's.
  const std::string linked = JoinPath(dir, "linked");
  REQUIRE(::symlink(elsewhere.c_str(), linked.c_str()) == 0);
  CHECK(Run({"export", ckpt, "--format=npy", "--out=" + linked}).code == 0);
  CHECK(Env::Default()->FileExists(JoinPath(elsewhere, "w.npy")));
}

TEST_CASE("verify and inspect agree on a variable with zero rows: damage, for both",
          "[checkpoint][cli][hostile]") {
  const std::string ckpt = WriteCheckpoint(testing::NewTempDir("ckcli"), 8);
  auto m = ReadManifest(Env::Default(), ckpt);
  REQUIRE(m.ok());
  m->mutable_variables(0)->set_shape(0, 0);  // w [0, 2]
  m->mutable_tensors(0)->set_shape(0, 0);
  m->mutable_tensors(0)->set_length(0);
  REQUIRE(WriteManifest(Env::Default(), ckpt, *m).ok());
  Result verify = Run({"verify", ckpt});
  INFO(verify.out);
  CHECK(verify.code == 1);
  CHECK(verify.out.find("w: a zero dimension (no elements)") != std::string::npos);
  Result inspect = Run({"inspect", ckpt});
  CHECK(inspect.code == 1);
  CHECK(inspect.err.find("w: a zero dimension (no elements)") != std::string::npos);
}

}  // namespace
}  // namespace pstrain
