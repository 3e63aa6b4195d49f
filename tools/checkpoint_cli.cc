#include "tools/checkpoint_cli.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/storage/checkpoint.h"
#include "common/client/chief_client.h"
#include "common/cluster/cluster_spec.h"
#include "common/storage/env.h"
#include "common/storage/tensor_file.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/operator.h"
#include "common/storage/tensor_export.h"

namespace pstrain {
namespace {

constexpr char kUsage[] =
    "usage: pstrain checkpoint list DIR\n"
    "       pstrain checkpoint verify CKPT\n"
    "       pstrain checkpoint inspect CKPT [--json]\n"
    "       pstrain checkpoint export CKPT --format=safetensors|npy --out=OUT\n"
    "       pstrain checkpoint restore CKPT --cluster_spec=F [--auth_secret_file=S]\n"
    "                                  [--timeout_s=600]\n"
    "DIR is a config's checkpoint.dir; CKPT one of its ckpt-<step> directories.\n"
    "export also takes a run's final model (OUTPUT_DIR/model_final.pst) as CKPT.\n"
    "restore rolls the running job of cluster spec F back to CKPT (a rollback:\n"
    "values, optimizer state, step and the workers' data cursors, onto however\n"
    "many servers run now); its checkpoints past CKPT's step are set aside.\n"
    "It signs its call with the cluster secret S: by default the spec's; a job\n"
    "pstrain launch started without one has OUTPUT_DIR/run.secret.\n"
    "export writes OUT/model.safetensors (every variable whole, named as in the\n"
    "model) or one OUT/<variable>.npy each ('/' in a name is a subdirectory);\n"
    "an embedding table T is T [rows, dim] float32 and T/ids [rows] uint64.\n";

// Where CKPT names a checkpoint.dir (ckpt-<step> directories and a pointer
// file, no manifest of its own) rather than one checkpoint: what to say.
std::string NotOneCheckpoint(Env* env, const std::string& path) {
  if (!env->IsDirectory(path) || env->FileExists(JoinPath(path, kManifestFile))) return "";
  absl::StatusOr<std::vector<CheckpointInfo>> all = ListCheckpoints(env, path);
  if (!env->FileExists(JoinPath(path, kPointerFile)) && (!all.ok() || all->empty())) return "";
  std::string latest;
  if (absl::StatusOr<int64_t> step = ReadPointer(env, path); step.ok()) {
    latest = absl::StrCat("; the latest is ", JoinPath(path, CheckpointDirName(*step)));
  }
  return absl::StrCat(path, " is a directory of checkpoints, not one: 'pstrain checkpoint list ",
                      path, "' lists them", latest);
}

int List(const std::string& dir, std::ostream& out, std::ostream& err) {
  Env* env = Env::Default();
  if (!env->IsDirectory(dir)) {
    err << "pstrain checkpoint list: no directory " << dir << "\n";
    return 1;
  }
  absl::StatusOr<std::vector<CheckpointInfo>> all = ListCheckpoints(env, dir);
  if (!all.ok()) {
    err << "pstrain checkpoint list: " << all.status().message() << "\n";
    return 1;
  }
  const absl::StatusOr<int64_t> latest = ReadPointer(env, dir);
  out << absl::StrFormat("%-10s %-20s %10s  %-10s\n", "step", "written (UTC)", "MiB", "state");
  for (const CheckpointInfo& c : *all) {
    const std::string when =
        c.complete ? absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(c.unix_time_ms),
                                      absl::UTCTimeZone())
                   : "-";
    const std::string rests =
        c.chain.empty()
            ? std::string()
            : absl::StrCat("  rows: deltas on ", absl::StrJoin(c.chain, ", ",
                                                               [](std::string* o, int64_t s) {
                                                                 o->append(CheckpointDirName(s));
                                                               }));
    out << absl::StrFormat("%-10d %-20s %10.2f  %-10s%s%s\n", c.step, when, c.bytes / 1048576.0,
                           c.complete ? "complete" : "incomplete",
                           latest.ok() && *latest == c.step ? "  latest" : "", rests);
  }
  if (all->empty()) out << "(no checkpoints in " << dir << ")\n";
  return 0;
}

// "export: 3/10 variables" redrawn in place on a terminal; nothing in a pipe.
class Progress {
 public:
  explicit Progress(std::string what) : what_(std::move(what)), tty_(::isatty(2) == 1) {}
  ~Progress() {
    if (tty_ && drawn_) std::fputs("\n", stderr);
  }
  void Update(const std::string& line) {
    if (!tty_) return;
    std::fprintf(stderr, "\r\033[K%s: %s", what_.c_str(), line.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }

 private:
  const std::string what_;
  const bool tty_;
  bool drawn_ = false;
};

int Verify(const std::string& ckpt, std::ostream& out) {
  Env* env = Env::Default();
  if (const std::string why = NotOneCheckpoint(env, ckpt); !why.empty()) {
    out << "pstrain checkpoint verify: " << why << "\n";
    return 1;
  }
  std::vector<std::string> problems;
  {
    Progress progress("verify");
    problems = VerifyCheckpoint(env, ckpt, [&progress](int64_t done, int64_t total) {
      progress.Update(absl::StrFormat("%.1f / %.1f MiB checked", done / 1048576.0,
                                      total / 1048576.0));
    });
  }
  if (!problems.empty()) {
    for (const std::string& p : problems) out << ckpt << ": " << p << "\n";
    return 1;
  }
  absl::StatusOr<CheckpointManifest> m = ReadManifest(env, ckpt);
  int64_t bytes = 0;
  for (const ShardFile& f : m->shards()) bytes += f.bytes();
  out << ckpt << ": good (step " << m->step() << ", " << m->tensors_size() << " tensors, " << bytes
      << " bytes)\n";
  return 0;
}

struct Stats {
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0;
  double sum_sq = 0;
  int64_t count = 0;
};

int Inspect(const std::string& ckpt, bool json, std::ostream& out, std::ostream& err) {
  if (const std::string why = NotOneCheckpoint(Env::Default(), ckpt); !why.empty()) {
    err << "pstrain checkpoint inspect: " << why << "\n";
    return 1;
  }
  // Its tables' rows are checked and counted a chunk at a time.
  absl::StatusOr<RestoredCheckpoint> c = LoadCheckpointForRestore(Env::Default(), ckpt);
  if (!c.ok()) {
    err << "pstrain checkpoint inspect: " << c.status().message() << "\n";
    return 1;
  }
  const CheckpointManifest& m = c->manifest;
  std::map<std::string, std::set<int>> partitions;
  for (const CheckpointTensor& t : m.tensors()) partitions[t.variable()].insert(t.partition());
  nlohmann::json j = {
      {"step", m.step()},
      {"config_fingerprint", absl::StrFormat("%016x", m.config_fingerprint())},
      {"shards", m.num_shards()},
      {"workers", m.num_workers()},
      {"optimizer", m.optimizer()},
      {"slots", std::vector<std::string>(m.slot_names().begin(), m.slot_names().end())},
      {"unix_time_ms", m.unix_time_ms()},
      {"chain", std::vector<int64_t>(m.chain().begin(), m.chain().end())},
  };
  j["cursors"] = nlohmann::json::array();
  for (const WorkerCursor& w : m.cursors()) {
    j["cursors"].push_back({{"worker", w.worker()}, {"epoch", w.epoch()},
                            {"position", w.position()}});
  }
  j["variables"] = nlohmann::json::array();
  for (const CheckpointVariable& v : m.variables()) {
    const RestoredVariable& rv = c->variables.at(v.name());
    Stats s;
    for (float x : rv.values) {
      s.min = std::min<double>(s.min, x);
      s.max = std::max<double>(s.max, x);
      s.sum += x;
      s.sum_sq += static_cast<double>(x) * x;
      ++s.count;
    }
    j["variables"].push_back({
        {"name", v.name()},
        {"shape", rv.shape},
        {"partitions", partitions[v.name()].size()},
        {"min", s.count > 0 ? s.min : 0.0},
        {"max", s.count > 0 ? s.max : 0.0},
        {"mean", s.count > 0 ? s.sum / s.count : 0.0},
        {"l2", std::sqrt(s.sum_sq)},
    });
  }
  j["tables"] = nlohmann::json::array();
  for (const CheckpointTable& t : m.tables()) {
    absl::StatusOr<int64_t> rows = CountTableRows(Env::Default(), ckpt, m, t.name());
    if (!rows.ok()) {
      err << "pstrain checkpoint inspect: " << rows.status().message() << "\n";
      return 1;
    }
    j["tables"].push_back({
        {"name", t.name()},
        {"dim", t.dim()},
        {"rows", *rows},
        {"optimizer", t.optimizer()},
        {"slots", std::vector<std::string>(t.slot_names().begin(), t.slot_names().end())},
    });
  }
  if (json) {
    out << j.dump(2) << "\n";
    return 0;
  }
  out << ckpt << ": step " << m.step() << ", config fingerprint " << j["config_fingerprint"].get<std::string>()
      << ", " << m.num_shards() << " shard(s), " << m.num_workers() << " worker(s)\n";
  out << "optimizer " << m.optimizer() << ", slots: "
      << (m.slot_names_size() == 0 ? "none" : absl::StrJoin(m.slot_names(), ", ")) << "\n";
  for (const WorkerCursor& w : m.cursors()) {
    out << "worker " << w.worker() << " data cursor: epoch " << w.epoch() << ", position "
        << w.position() << "\n";
  }
  out << absl::StrFormat("%-24s %-14s %5s %12s %12s %12s %12s\n", "variable", "shape", "parts",
                         "min", "max", "mean", "L2 norm");
  for (const nlohmann::json& v : j["variables"]) {
    std::vector<int64_t> shape = v["shape"].get<std::vector<int64_t>>();
    out << absl::StrFormat("%-24s %-14s %5d %12.6g %12.6g %12.6g %12.6g\n",
                           v["name"].get<std::string>(),
                           absl::StrCat("[", absl::StrJoin(shape, ","), "]"),
                           v["partitions"].get<int>(), v["min"].get<double>(),
                           v["max"].get<double>(), v["mean"].get<double>(),
                           v["l2"].get<double>());
  }
  for (const nlohmann::json& t : j["tables"]) {
    out << "embedding table " << t["name"].get<std::string>() << ": " << t["rows"].get<int64_t>()
        << " rows of width " << t["dim"].get<int>() << ", optimizer "
        << t["optimizer"].get<std::string>() << "\n";
  }
  if (m.chain_size() > 0) {
    out << "embedding rows: deltas on "
        << absl::StrJoin(m.chain(), ", ",
                         [](std::string* o, int64_t s) { o->append(CheckpointDirName(s)); })
        << " (beside it), replayed\n";
  }
  return 0;
}

// A variable's name as a relative path: components of letters, digits, '_',
// '-' and '.', none empty, "." or "..". The manifest is outside input.
bool SafeRelativePath(const std::string& name) {
  if (name.empty()) return false;
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
    for (char c : part) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' &&
          c != '.') {
        return false;
      }
    }
  }
  return true;
}

// What an export writes: the tensors (viewing memory the caller keeps), the
// safetensors metadata, and what the closing line says of them.
struct ExportSource {
  std::string what;  // "step 600", or the model file's path
  std::vector<ExportTensor> tensors;
  std::map<std::string, std::string> metadata = {{"format", "np"}};
  int variables = 0;
  int tables = 0;
  int64_t bytes = 0;
};

// A checkpoint's variables whole, and each embedding table as its rows
// [n, dim] and their ids [n].
absl::Status FromCheckpoint(const std::string& ckpt, const RestoredCheckpoint& c,
                            ExportSource* src) {
  const CheckpointManifest& m = c.manifest;
  src->what = absl::StrCat("step ", m.step());
  src->metadata["pstrain_step"] = absl::StrCat(m.step());
  src->metadata["pstrain_config_fingerprint"] = absl::StrFormat("%016x", m.config_fingerprint());
  src->metadata["pstrain_optimizer"] = m.optimizer();
  for (const CheckpointVariable& v : m.variables()) {
    if (!SafeRelativePath(v.name())) {
      return absl::InvalidArgumentError(absl::StrCat(
          ckpt, " names a variable \"", v.name(), "\" that is not a safe file name"));
    }
    const RestoredVariable& rv = c.variables.at(v.name());
    src->tensors.push_back({v.name(), rv.shape, rv.values.data()});
    src->bytes += static_cast<int64_t>(rv.values.size() * sizeof(float));
    ++src->variables;
  }
  // A table's rows are read a chunk at a time as they are written (it may
  // be larger than memory): counted first, then its values, then its ids,
  // each pass in the same order.
  for (const auto& [name, t] : c.tables) {
    if (!SafeRelativePath(name) || c.variables.count(name) + c.variables.count(name + "/ids")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table \"", name, "\" is not a safe file name or clashes with a variable"));
    }
    ASSIGN_OR_RETURN(const int64_t n, CountTableRows(Env::Default(), ckpt, m, name));
    ExportTensor values{name, {n, t.dim}};
    values.produce = TableColumn(Env::Default(), ckpt, &m, name, /*ids=*/false);
    ExportTensor ids{name + "/ids", {n}, nullptr, ExportDtype::kUint64};
    ids.produce = TableColumn(Env::Default(), ckpt, &m, name, /*ids=*/true);
    src->tensors.push_back(std::move(values));
    src->tensors.push_back(std::move(ids));
    src->bytes += n * (t.dim * static_cast<int64_t>(sizeof(float)) + 8);
    ++src->tables;
  }
  return absl::OkStatus();
}

// A run's final model (model_final.pst: its dense variables, no tables).
absl::Status FromModelFile(const std::string& path, const TensorMap& model, ExportSource* src) {
  src->what = path;
  src->metadata["pstrain_source"] = path.substr(path.rfind('/') + 1);
  for (const auto& [name, t] : model) {
    if (!SafeRelativePath(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " names a variable \"", name, "\" that is not a safe file name"));
    }
    src->tensors.push_back({name, t.shape(), t.data()});
    src->bytes += t.num_elements() * static_cast<int64_t>(sizeof(float));
    ++src->variables;
  }
  return absl::OkStatus();
}

// Writes `src` as OUT/model.safetensors or one OUT/<name>.npy each.
absl::Status WriteExport(const ExportSource& src, const std::string& format,
                         const std::string& out_dir, Progress* progress, std::string* where) {
  Env* env = Env::Default();
  std::set<std::string> names;
  for (const ExportTensor& t : src.tensors) {
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("two tensors would be named \"", t.name, "\""));
    }
  }
  RETURN_IF_ERROR(env->CreateDirs(out_dir));
  // Nothing is written through a symlink beneath out_dir (an entry planted
  // there would send a file elsewhere); out_dir itself is the caller's. A
  // temporary left there (a hard link, say) is removed, never truncated.
  auto writable = [env, &out_dir](const std::string& path) -> absl::Status {
    RETURN_IF_ERROR(CheckWritableBelow(out_dir, path));
    (void)env->DeleteFile(path + ".tmp");
    return absl::OkStatus();
  };
  if (format == "safetensors") {
    progress->Update(absl::StrCat("writing ", src.tensors.size(), " tensors"));
    *where = JoinPath(out_dir, "model.safetensors");
    RETURN_IF_ERROR(writable(*where));
    return WriteSafetensors(env, *where, src.tensors, src.metadata);
  }
  *where = out_dir;
  for (size_t i = 0; i < src.tensors.size(); ++i) {
    progress->Update(absl::StrCat(i + 1, "/", src.tensors.size(), " variables"));
    const std::string path = JoinPath(out_dir, src.tensors[i].name + ".npy");
    RETURN_IF_ERROR(writable(path));
    RETURN_IF_ERROR(env->CreateDirs(Dirname(path)));
    RETURN_IF_ERROR(WriteNpy(env, path, src.tensors[i]));
  }
  return absl::OkStatus();
}

int Export(const std::string& ckpt, const std::string& format, const std::string& out_dir,
           std::ostream& out, std::ostream& err) {
  Env* env = Env::Default();
  if (format != "safetensors" && format != "npy") {
    err << "pstrain checkpoint export: --format must be safetensors or npy, not \"" << format
        << "\"\n";
    return 2;
  }
  if (out_dir.empty()) {
    err << "pstrain checkpoint export: --out=DIR is required\n";
    return 2;
  }
  if (const std::string why = NotOneCheckpoint(env, ckpt); !why.empty()) {
    err << "pstrain checkpoint export: " << why << "\n";
    return 1;
  }
  Progress progress("export");
  progress.Update(absl::StrCat("reading and verifying ", ckpt));
  // What the tensors view: one of the two, alive until they are written.
  absl::StatusOr<RestoredCheckpoint> checkpoint = absl::NotFoundError("");
  absl::StatusOr<TensorMap> model_file = absl::NotFoundError("");
  ExportSource src;
  absl::Status st;
  if (!env->IsDirectory(ckpt) && env->FileExists(ckpt)) {
    // The file named on the command line is the caller's choice: a symlink
    // there is followed (ReadTensorFile refuses one that is not a regular
    // file, or leads out of its directory, below it).
    const std::string resolved = RealPath(ckpt);
    model_file = ReadTensorFile(env, resolved.empty() ? ckpt : resolved);
    st = model_file.ok() ? FromModelFile(ckpt, *model_file, &src) : model_file.status();
  } else {
    checkpoint = LoadCheckpointForRestore(env, ckpt, [&progress](int64_t done, int64_t total) {
      progress.Update(absl::StrFormat("%.1f / %.1f MiB read and verified", done / 1048576.0,
                                      total / 1048576.0));
    });
    st = checkpoint.ok() ? FromCheckpoint(ckpt, *checkpoint, &src) : checkpoint.status();
  }
  std::string where;
  if (st.ok()) st = WriteExport(src, format, out_dir, &progress, &where);
  if (!st.ok()) {
    err << "pstrain checkpoint export: " << st.message() << "\n";
    return 1;
  }
  out << "exported " << src.what << ": " << src.variables << " variable(s), " << src.tables
      << " embedding table(s), " << src.bytes << " bytes, to " << where << "\n";
  return 0;
}

// Asks the chief of the running job to roll back to `ckpt`, checked here
// first; the chief reads it itself (the path is made absolute for it).
int Restore(const std::string& ckpt, const std::string& cluster_spec,
            const std::string& secret_file, int64_t timeout_s, std::ostream& out,
            std::ostream& err) {
  if (cluster_spec.empty()) {
    err << "pstrain checkpoint restore: --cluster_spec=F names the running job\n";
    return 2;
  }
  if (timeout_s <= 0 || timeout_s > 86400) {
    err << "pstrain checkpoint restore: --timeout_s must be 1..86400\n";
    return 2;
  }
  const std::string path = RealPath(ckpt);
  if (path.empty()) {
    err << "pstrain checkpoint restore: " << ckpt << ": " << std::strerror(errno) << "\n";
    return 1;
  }
  std::vector<std::string> problems;
  {
    Progress progress("verify");
    problems = VerifyCheckpoint(Env::Default(), path, [&progress](int64_t done, int64_t total) {
      progress.Update(absl::StrFormat("%.1f / %.1f MiB checked", done / 1048576.0,
                                      total / 1048576.0));
    });
  }
  if (!problems.empty()) {
    for (const std::string& p : problems) err << ckpt << ": " << p << "\n";
    err << "pstrain checkpoint restore: " << ckpt << " is not a good checkpoint; nothing changed\n";
    return 1;
  }
  absl::StatusOr<ClusterSpec> cluster = ClusterSpec::FromFile(cluster_spec);
  if (!cluster.ok()) {
    err << "pstrain checkpoint restore: " << cluster.status().message() << "\n";
    return 2;
  }
  if (absl::Status st = ActAsOperator(*cluster, secret_file); !st.ok()) {
    err << "pstrain checkpoint restore: " << st.message() << "\n";
    return 2;
  }
  const std::string chief_address = cluster->address(kChiefJob, 0);
  GrpcChiefClient chief(chief_address, absl::Seconds(10));
  int64_t step = 0;
  const absl::Time start = absl::Now();
  absl::Status st = chief.Restore(path, absl::Seconds(timeout_s), &step);
  // UNAVAILABLE is also a running chief's "not now" (a restore under way,
  // an evaluation, the run ending): the job is said to be absent only when
  // its chief does not answer a status call either.
  ChiefStatusResponse status;
  if (absl::IsUnavailable(st) && !chief.GetStatus(&status).ok()) {
    err << "pstrain checkpoint restore: no chief answers at " << chief_address << " (chief:0 of "
        << cluster_spec << "): is the job running? To start a job from " << ckpt
        << ", pstrain launch takes --resume (its latest) or --init_from=CKPT. (" << st.message() << ")\n";
    return 1;
  }
  if (!st.ok()) {
    err << "pstrain checkpoint restore: " << st.message() << "\n";
    return 1;
  }
  out << "rolled the job back to step " << step << " from " << path << " in "
      << absl::StrFormat("%.2f", absl::ToDoubleSeconds(absl::Now() - start)) << " s\n";
  return 0;
}

}  // namespace

int CheckpointCommand(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  std::vector<std::string> args;
  bool json = false;
  std::string format, out_dir, cluster_spec, secret_file;
  int64_t timeout_s = 600;
  bool export_flags = false, restore_flags = false;
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      out << kUsage;
      return 0;
    }
    if (a == "--json") {
      json = true;
    } else if (absl::StartsWith(a, "--format=")) {
      format = a.substr(9);
      export_flags = true;
    } else if (absl::StartsWith(a, "--out=")) {
      out_dir = a.substr(6);
      export_flags = true;
    } else if (absl::StartsWith(a, "--cluster_spec=")) {
      cluster_spec = a.substr(15);
      restore_flags = true;
    } else if (absl::StartsWith(a, "--auth_secret_file=")) {
      secret_file = a.substr(19);
      restore_flags = true;
    } else if (absl::StartsWith(a, "--timeout_s=")) {
      if (!absl::SimpleAtoi(a.substr(12), &timeout_s)) {
        err << "pstrain checkpoint: --timeout_s takes seconds\n";
        return 2;
      }
      restore_flags = true;
    } else if (absl::StartsWith(a, "--")) {
      err << "pstrain checkpoint: unknown flag " << a << "\n" << kUsage;
      return 2;
    } else {
      args.push_back(a);
    }
  }
  if (args.size() == 2 && args[0] == "export" && !json) {
    return Export(args[1], format, out_dir, out, err);
  }
  if (args.size() == 2 && args[0] == "restore" && !json && !export_flags) {
    return Restore(args[1], cluster_spec, secret_file, timeout_s, out, err);
  }
  if (export_flags || restore_flags) {
    err << kUsage;
    return 2;
  }
  if (args.size() == 2 && args[0] == "list") return List(args[1], out, err);
  if (args.size() == 2 && args[0] == "verify" && !json) return Verify(args[1], out);
  if (args.size() == 2 && args[0] == "inspect") return Inspect(args[1], json, out, err);
  err << kUsage;
  return 2;
}

}  // namespace pstrain
