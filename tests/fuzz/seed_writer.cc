// Writes the seed inputs of checkpoint_fuzzer and ps_request_fuzzer, which
// are binary (a manifest and a shard as the chief writes them; a push frame
// and row requests as workers send them), and a tensor file, into corpus/. Run once by hand
// when their formats change:
//   bazel run //tests/fuzz:seed_writer -- $PWD/tests/fuzz/corpus
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "common/base/tensor.h"
#include "common/storage/tensor_file.h"
#include "common/rpc/wire_frame.h"

namespace pstrain {
namespace {

void Write(const std::string& path, const std::string& bytes) {
  if (!Env::Default()->WriteFile(path, bytes, /*sync=*/false).ok()) {
    std::cerr << "cannot write " << path << "\n";
    std::exit(1);
  }
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

int Main(const std::string& corpus) {
  // A checkpoint of one 2x2 variable in one shard, as WriteShard lays it out.
  const std::string dir = JoinPath(corpus, "tmp-ckpt");
  std::vector<float> w = {1, 2, 3, 4};
  ShardTensor t;
  t.variable = "w";
  t.partition = 0;
  t.shape = {2, 2};
  t.data = w.data();
  t.elements = 4;
  int64_t bytes = 0;
  auto entries = WriteShard(Env::Default(), dir, 0, 1, {t}, &bytes);
  if (!entries.ok()) return 1;
  CheckpointManifest m;
  m.set_step(1);
  m.set_num_shards(1);
  ShardFile* shard = m.add_shards();
  shard->set_shard(0);
  shard->set_file(ShardFileName(0, 1));
  shard->set_bytes(bytes);
  for (const CheckpointTensor& e : *entries) *m.add_tensors() = e;
  CheckpointVariable* v = m.add_variables();
  v->set_name("w");
  v->add_shape(2);
  v->add_shape(2);
  const std::string manifest = m.SerializeAsString();
  const std::string shard_bytes = *Env::Default()->ReadFile(JoinPath(dir, ShardFileName(0, 1)));
  std::string input;
  input.push_back(static_cast<char>(manifest.size() & 0xff));
  input.push_back(static_cast<char>(manifest.size() >> 8));
  // The pointer file of the checkpoints' directory, its length first.
  const std::string pointer = "latest: ckpt-1\nkept: ckpt-1\n";
  Write(JoinPath(corpus, "checkpoint_fuzzer/one_shard"),
        input + manifest + static_cast<char>(pointer.size()) + pointer + shard_bytes);
  (void)DeleteRecursively(Env::Default(), dir);

  // A tensor file (a model_final.pst of two tensors).
  TensorMap model;
  model.emplace("w", Tensor({2, 2}, {1, 2, 3, 4}));
  model.emplace("b", Tensor({2}, {0.5f, -0.5f}));
  Write(JoinPath(corpus, "file_readers_fuzzer/model.pst"), EncodeTensorFile(model));

  // A push of the fuzzer's model, rows of its table, a pull.
  PushRequest push;
  push.set_incarnation(7);
  push.set_worker(0);
  push.set_step(0);
  NamedTensor* g = push.add_gradients();
  g->mutable_ref()->set_variable("w");
  ToProto({2, 2}, {0.5f, -0.5f, 1, 0}, g->mutable_tensor());
  Write(JoinPath(corpus, "ps_request_fuzzer/push"), std::string(1, 0) + Flatten(EncodePushFrame(push)));
  PushRowsRequest rows;
  rows.set_incarnation(7);
  rows.set_worker(1);
  rows.set_table("t");
  const uint64_t ids[2] = {5, 5};
  const float grads[4] = {1, 2, 3, 4};
  rows.set_num_ids(2);
  Write(JoinPath(corpus, "ps_request_fuzzer/push_rows"),
        std::string(1, 1) + Flatten(EncodeFrame(rows, {{ids, sizeof(ids), nullptr},
                                                        {grads, sizeof(grads), nullptr}})));
  rows.set_ids(std::string(reinterpret_cast<const char*>(ids), sizeof(ids)));
  PullRequest pull;
  pull.set_incarnation(7);
  pull.set_worker(0);
  Write(JoinPath(corpus, "ps_request_fuzzer/pull"), std::string(1, 2) + pull.SerializeAsString());
  PullRowsRequest pull_rows;
  pull_rows.set_incarnation(7);
  pull_rows.set_worker(0);
  pull_rows.set_table("t");
  pull_rows.set_ids(rows.ids());
  Write(JoinPath(corpus, "ps_request_fuzzer/pull_rows"),
        std::string(1, 3) + pull_rows.SerializeAsString());
  return 0;
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: seed_writer CORPUS_DIR\n";
    return 2;
  }
  return pstrain::Main(argv[1]);
}
