// libFuzzer target: reading a checkpoint whose manifest (its CRC made right,
// so the fuzzer reaches the checks behind it) and shard files say anything
// never crashes, and never loads one that does not verify.
//
// Input: 2 bytes of manifest length L, L bytes of a serialized
// CheckpointManifest, then the bytes of every shard file it names.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t len = std::min<size_t>(size - 2, data[0] | (data[1] << 8));
  pstrain::CheckpointManifest manifest;
  if (!manifest.ParseFromArray(data + 2, static_cast<int>(len))) return 0;
  const std::string shard(reinterpret_cast<const char*>(data + 2 + len), size - 2 - len);
  if (manifest.num_shards() > 8) return 0;  // files on disk: keep each run small

  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    return absl::StrCat(tmp ? tmp : "/tmp", "/pstrain-ckpt-fuzz-", ::getpid(), "/ckpt-1");
  }();
  pstrain::Env* env = pstrain::Env::Default();
  (void)pstrain::DeleteRecursively(env, dir);
  if (!env->CreateDirs(dir).ok()) std::abort();
  if (!pstrain::WriteManifest(env, dir, manifest).ok()) return 0;
  for (int s = 0; s < manifest.num_shards() && s >= 0; ++s) {
    (void)env->WriteFile(pstrain::JoinPath(dir, pstrain::ShardFileName(s, manifest.num_shards())),
                         shard, /*sync=*/false);
  }
  const bool verifies = pstrain::VerifyCheckpoint(env, dir).empty();
  absl::StatusOr<pstrain::RestoredCheckpoint> loaded = pstrain::LoadCheckpoint(env, dir);
  if (loaded.ok() && !verifies) std::abort();  // loaded what verify refuses
  return 0;
}
