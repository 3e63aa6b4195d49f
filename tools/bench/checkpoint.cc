// The checkpoint suite of `pstrain bench` (CheckpointSuite, run by the
// harness, tools/bench/harness.cc; not in the default --suites): checkpoint
// write and restore speed in GB/s for a model of --checkpoint_mib on 2
// servers (two shards written at once, as two servers do, then the
// manifest), beside dd of the same bytes with conv=fsync to the same disk,
// interleaved. Restore is LoadCheckpoint: reads, CRC32C, reassembly (from the
// page cache when the machine has room for it; the table says so). Writes in
// --checkpoint_dir, else --out, else /tmp; at most 3 repetitions.

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/storage/checkpoint.h"
#include "common/storage/env.h"
#include "tools/bench/harness.h"

namespace pstrain::bench {
namespace {

// Writes the checkpoint `ckpt` as the servers do: each shard's file from a
// thread of its own, all at once, then the manifest (`manifest` gains the
// shards' tensors and files).
absl::Status WriteCheckpoint(Env* env, const std::string& ckpt,
                             const std::vector<std::vector<ShardTensor>>& tensors,
                             CheckpointManifest* manifest) {
  const int shards = static_cast<int>(tensors.size());
  std::vector<absl::StatusOr<std::vector<CheckpointTensor>>> written(shards);
  std::vector<int64_t> bytes(shards);
  std::vector<std::thread> writers;
  for (int s = 0; s < shards; ++s) {
    writers.emplace_back([&, s] {
      written[s] = WriteShard(env, ckpt, s, shards, tensors[s], &bytes[s]);
    });
  }
  for (std::thread& t : writers) t.join();
  for (int s = 0; s < shards; ++s) {
    RETURN_IF_ERROR(written[s].status());
    for (const CheckpointTensor& e : *written[s]) *manifest->add_tensors() = e;
    ShardFile* f = manifest->add_shards();
    f->set_shard(s);
    f->set_file(ShardFileName(s, shards));
    f->set_bytes(bytes[s]);
  }
  return WriteManifest(env, ckpt, *manifest);
}

}  // namespace

absl::Status CheckpointSuite(BenchContext* ctx) {
  const BenchOptions& o = ctx->options();
  Env* env = Env::Default();
  std::string base;
  ASSIGN_OR_RETURN(const std::string dir, ScratchDir(o, "ckpt", &base));
  const int64_t total = o.checkpoint_mib << 20;
  const int shards = 2;
  // Partitions of up to 16 MiB, as the placement splits a large model.
  const int64_t part_elements = (int64_t{16} << 20) / 4;
  std::vector<std::vector<float>> data(shards);
  std::vector<std::vector<ShardTensor>> tensors(shards);
  CheckpointManifest manifest;
  manifest.set_num_shards(shards);
  for (int s = 0; s < shards; ++s) {
    const int64_t elements = total / 4 / shards;
    data[s].resize(elements);
    std::mt19937 rng(s + 1);
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& x : data[s]) x = u(rng);
    const std::string var = absl::StrCat("var", s);
    CheckpointVariable* v = manifest.add_variables();
    v->set_name(var);
    v->add_shape(elements);
    for (int64_t at = 0, p = 0; at < elements; at += part_elements, ++p) {
      ShardTensor t;
      t.variable = var;
      t.partition = static_cast<int>(p);
      t.first_row = at;
      t.elements = std::min(part_elements, elements - at);
      t.shape = {t.elements};
      t.data = data[s].data() + at;
      tensors[s].push_back(t);
    }
  }
  const int reps = std::min(o.reps, 3);
  std::vector<double> write, restore, dd;
  for (int rep = 0; rep < reps; ++rep) {
    RETURN_IF_ERROR(ctx->CheckStop());
    // dd first, its file removed before the checkpoint is written.
    const std::string dd_file = JoinPath(dir, "dd.bin");
    SpawnOptions so;
    so.argv = {"/bin/dd", "if=/dev/zero", "of=" + dd_file, "bs=1M",
               absl::StrCat("count=", o.checkpoint_mib), "conv=fsync"};
    so.capture_output = true;
    absl::Time t0 = absl::Now();
    ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> proc, Subprocess::Spawn(so));
    std::optional<int> code = proc->Wait(absl::Seconds(600));
    if (!code.has_value() || *code != 0) return absl::InternalError("dd failed");
    dd.push_back(total / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
    RETURN_IF_ERROR(env->DeleteFile(dd_file));

    const std::string ckpt = JoinPath(dir, CheckpointDirName(rep + 1));
    manifest.set_step(rep + 1);
    manifest.clear_tensors();
    manifest.clear_shards();
    t0 = absl::Now();
    RETURN_IF_ERROR(WriteCheckpoint(env, ckpt, tensors, &manifest));
    write.push_back(total / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);

    t0 = absl::Now();
    ASSIGN_OR_RETURN(RestoredCheckpoint back, LoadCheckpoint(env, ckpt));
    restore.push_back(total / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9);
    for (int s = 0; s < shards; ++s) {
      const std::vector<float>& got = back.variables.at(absl::StrCat("var", s)).values;
      if (got.size() != data[s].size() ||
          std::memcmp(got.data(), data[s].data(), got.size() * 4) != 0) {
        return absl::DataLossError("checkpoint bench: restored values differ");
      }
    }
    RETURN_IF_ERROR(DeleteRecursively(env, ckpt));
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  const Stats sw = Summarize(write), sr = Summarize(restore), sd = Summarize(dd);
  std::cout << "\n== checkpoint: " << o.checkpoint_mib << " MiB model, " << shards
            << " shards written at once, GB/s (median [min-max] of " << reps << "), in " << base
            << " ==\n";
  std::cout << absl::StrFormat("%-34s %-26s %s\n", "write (fsync, rename, manifest)", Fmt(sw),
                               absl::StrFormat("%.2fx of dd", sw.median / sd.median));
  std::cout << absl::StrFormat("%-34s %-26s\n", "dd conv=fsync, same bytes, same disk", Fmt(sd));
  std::cout << absl::StrFormat("%-34s %-26s %s\n", "restore (read, CRC32C, reassemble)", Fmt(sr),
                               "page cache permitting")
            << std::flush;
  ctx->Add("checkpoint", "write", total, shards, 0, sw);
  ctx->Add("checkpoint", "dd_fsync", total, 1, 0, sd);
  ctx->Add("checkpoint", "restore", total, shards, 0, sr);
  return absl::OkStatus();
}

}  // namespace pstrain::bench
