// libFuzzer target: a whole checkpoint directory whose manifest (its CRC
// made right, so the fuzzer reaches the checks behind it), shard files (and
// an earlier checkpoint's, which its rows may rest on) and pointer file say
// anything: reading it never crashes or hangs, verify and a
// load agree (one loads exactly what the other passes), and a resume
// (LoadLatestGoodCheckpoint, LatestGoodCheckpoint) takes the checkpoint
// exactly when it verifies.
//
// Input: 2 bytes of manifest length L, L bytes of a serialized
// CheckpointManifest, 1 byte of pointer length P, P bytes of the pointer
// file's text, then the bytes of the shard files it names: shard s gets the
// rest of the input rotated by s bytes, so that shards differ.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const size_t len = std::min<size_t>(size - 2, data[0] | (data[1] << 8));
  pstrain::CheckpointManifest manifest;
  if (!manifest.ParseFromArray(data + 2, static_cast<int>(len))) return 0;
  size_t at = 2 + len;
  std::string pointer;
  if (at < size) {
    const size_t plen = std::min<size_t>(size - at - 1, data[at]);
    pointer.assign(reinterpret_cast<const char*>(data + at + 1), plen);
    at += 1 + plen;
  }
  const std::string rest(reinterpret_cast<const char*>(data + at), size - at);
  if (manifest.num_shards() > 8) return 0;  // files on disk: keep each run small

  static const std::string root = [] {
    const char* tmp = std::getenv("TMPDIR");
    return absl::StrCat(tmp ? tmp : "/tmp", "/pstrain-ckpt-fuzz-", ::getpid());
  }();
  const std::string dir = pstrain::JoinPath(root, "ckpt-1");
  pstrain::Env* env = pstrain::Env::Default();
  (void)pstrain::DeleteRecursively(env, root);
  if (!env->CreateDirs(dir).ok()) std::abort();
  if (!pstrain::WriteManifest(env, dir, manifest).ok()) return 0;
  // ckpt-0 beside it holds shard files and no manifest: what the links of
  // an incremental chain (CheckpointRows.checkpoint "ckpt-0") read.
  const std::string before = pstrain::JoinPath(root, "ckpt-0");
  if (!env->CreateDirs(before).ok()) std::abort();
  for (int s = 0; s < manifest.num_shards() && s >= 0; ++s) {
    for (int k = 0; k < 2; ++k) {
      std::string shard = rest;
      if (!shard.empty()) {
        std::rotate(shard.begin(), shard.begin() + (s + k) % shard.size(), shard.end());
      }
      (void)env->WriteFile(
          pstrain::JoinPath(k == 0 ? dir : before, pstrain::ShardFileName(s, manifest.num_shards())),
          shard, /*sync=*/false);
    }
  }
  if (!pointer.empty()) {
    (void)env->WriteFile(pstrain::JoinPath(root, pstrain::kPointerFile), pointer, false);
  }
  const bool verifies = pstrain::VerifyCheckpoint(env, dir).empty();
  absl::StatusOr<pstrain::RestoredCheckpoint> loaded = pstrain::LoadCheckpoint(env, dir);
  if (loaded.ok() != verifies) std::abort();  // verify and a load disagree
  (void)pstrain::ReadPointer(env, root);
  (void)pstrain::ListCheckpoints(env, root);
  // What a resume loads: the newest checkpoint that verifies, loaded whole
  // (never a failed load of one that verified, never one that does not).
  std::vector<std::string> skipped;
  absl::StatusOr<std::string> latest = pstrain::LatestGoodCheckpoint(env, root, &skipped);
  std::string resumed_path;
  absl::StatusOr<pstrain::RestoredCheckpoint> resumed =
      pstrain::LoadLatestGoodCheckpoint(env, root, nullptr, &resumed_path);
  // ckpt-1 is the directory's only complete checkpoint: both take it
  // exactly when it verifies.
  if (latest.ok() != verifies || resumed.ok() != verifies) std::abort();
  if (resumed.ok() && (resumed_path != dir || *latest != dir)) std::abort();
  return 0;
}
