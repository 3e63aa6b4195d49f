#include "ps_server/server_model.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/bfloat16.h"
#include "common/base/embedding_ids.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/base/tensor.h"
#include "common/cluster/config.h"

namespace pstrain {
namespace {

// use_count() alone is a relaxed load: a pull answered, or a checkpoint
// shard written, on another thread drops its reference with a release, and
// seeing the count fall without an acquire leaves that thread's last reads
// of the buffer unordered with the writes that follow (ThreadSanitizer found
// a checkpoint writer's CRC racing with an async push into a reused buffer).
// The acquire fence after the load orders them, as the standard defines it;
// TSan does not model fences, so the copy, whose increment is an
// acquire-release operation on the count (libstdc++), does the same where
// TSan sees it.
template <typename T>
bool OnlyReferenceImpl(const std::shared_ptr<T>& buffer) {
  if (buffer.use_count() != 1) return false;
  std::atomic_thread_fence(std::memory_order_acquire);
  std::shared_ptr<T> probe = buffer;
  return probe.use_count() == 2;
}

// Adds the config's embedding tables to `model` (its workers set).
// `log`: says where each table with a budget keeps its rows (once an
// Initialize, not for each of its parts).
absl::Status AddTables(const TrainingConfig& config, int64_t global_batch,
                       const TierSettings& tier, bool log, ServerModel* model) {
  // Each table with a budget has files of its own: a model being replaced
  // may still hold its tables' files.
  static std::atomic<uint64_t> tables_made{0};
  for (const EmbeddingTableConfig& tc : config.embedding_tables()) {
    auto table = std::make_unique<ServerModel::Table>();
    const OptimizerConfig& oc = tc.has_optimizer() ? tc.optimizer() : config.optimizer();
    ASSIGN_OR_RETURN(table->optimizer, CreateOptimizer(oc));
    table->optimizer_kind = OptimizerKindName(oc);
    ASSIGN_OR_RETURN(table->learning_rate,
                     LearningRate::Create(oc, global_batch, config.max_steps()));
    table->clip_value = oc.clip_value();
    EmbeddingTable::Options options;
    options.name = tc.name();
    options.dim = tc.dim();
    options.num_rows = tc.num_rows();
    options.init_scale = tc.init_scale();
    options.seed = TableSeed(config.seed(), tc.name());
    options.expire_after_steps = tc.expire_after_steps();
    options.admit_after = tc.admit_after();
    if (tc.memory_budget_bytes() > 0) {
      const int64_t row_bytes = EmbeddingTable::RowBytes(
          tc.dim(), static_cast<int>(table->optimizer->slot_names().size()));
      options.memory_rows = std::max<int64_t>(1, tc.memory_budget_bytes() / row_bytes);
      options.tier_prefix =
          JoinPath(tier.dir.empty() ? TempDirectory() : tier.dir,
                   absl::StrCat("pstrain-", ::getpid(), "-", tc.name(), ".", tables_made++));
      options.env = tier.env;
      if (log) {
        LOG_INFO("table {}: at most {} rows ({} bytes with their optimizer slots) in memory on "
                 "this server, the rest in a disk tier in {}",
                 tc.name(), options.memory_rows, options.memory_rows * row_bytes,
                 Dirname(options.tier_prefix));
      }
    }
    ASSIGN_OR_RETURN(table->rows, EmbeddingTable::Create(options, table->optimizer.get()));
    table->staged_ids.resize(model->sync ? model->num_workers : 0);
    table->staged_grads.resize(model->sync ? model->num_workers : 0);
    model->tables.emplace(tc.name(), std::move(table));
  }
  return absl::OkStatus();
}

}  // namespace

std::string PartitionKeyString(const PartitionKey& key) {
  return absl::StrCat(key.first, "/part", key.second);
}

bool OnlyReference(const std::shared_ptr<std::vector<float>>& buffer) {
  return OnlyReferenceImpl(buffer);
}

bool OnlyReference(const std::shared_ptr<std::vector<uint16_t>>& buffer) {
  return OnlyReferenceImpl(buffer);
}

PartitionState::Buffer PartitionState::TakeSpareLocked() {
  Buffer b;
  for (size_t i = 0; i < spares.size() && b == nullptr; ++i) {
    // Pulls and checkpoint snapshots hold the other references; they take
    // them under mu.
    if (OnlyReference(spares[i])) {
      b = std::move(spares[i]);
      spares.erase(spares.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  if (b == nullptr) b = std::make_shared<std::vector<float>>(size);
  // It is about to be overwritten (or has a freed one's address): a
  // bfloat16 rounding cached for that address no longer describes it.
  if (bf16_of == b.get()) bf16_of = nullptr;
  return b;
}

void PartitionState::PublishLocked(Buffer next_version) {
  spares.push_back(std::move(current));
  current = std::move(next_version);
}

std::shared_ptr<const std::vector<uint16_t>> PartitionState::Bfloat16Of(
    const std::shared_ptr<const std::vector<float>>& values) {
  std::shared_ptr<std::vector<uint16_t>> out;
  {
    absl::MutexLock lock(&mu);
    if (bf16 != nullptr && bf16_of == values.get()) return bf16;
    for (size_t i = 0; i < bf16_spares.size() && out == nullptr; ++i) {
      if (OnlyReference(bf16_spares[i])) {
        out = std::move(bf16_spares[i]);
        bf16_spares.erase(bf16_spares.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
  }
  // Converted outside the lock; two pulls of a new version may both convert,
  // and one result is kept.
  if (out == nullptr) out = std::make_shared<std::vector<uint16_t>>(size);
  FloatsToBfloat16(values->data(), size, out->data());
  absl::MutexLock lock(&mu);
  if (current.get() == values.get()) {
    if (bf16 != nullptr) bf16_spares.push_back(std::move(bf16));
    bf16 = out;
    bf16_of = values.get();
  }
  return out;
}

absl::StatusOr<std::shared_ptr<ServerModel>> NewServerModel(const InitializeRequest& request,
                                                            const TierSettings& tier) {
  TrainingConfig config = request.config();
  RETURN_IF_ERROR(ValidateAndFillDefaults(&config, "(from Initialize)"));
  if (request.incarnation() == 0) {
    return absl::InvalidArgumentError("Initialize: incarnation must be non-zero");
  }
  if (request.num_workers() <= 0 || request.num_workers() > 100000) {
    return absl::InvalidArgumentError("Initialize: num_workers must be 1..100000");
  }
  int replicas = request.num_workers();
  if (config.has_sync() && config.sync().replicas_to_aggregate() > 0) {
    replicas = config.sync().replicas_to_aggregate();
    if (replicas > request.num_workers()) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize: replicas_to_aggregate ", replicas,
                                                     " exceeds the ", request.num_workers(),
                                                     " workers"));
    }
  }
  if (request.start_step() < 0)
    return absl::InvalidArgumentError("Initialize: negative start_step");
  const int num_parts = std::max(1, request.num_parts());
  if (request.num_parts() < 0 || request.num_parts() > (1 << 20) || request.part() < 0 ||
      request.part() >= num_parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("Initialize: part ", request.part(), " of ", request.num_parts()));
  }
  auto model = std::make_shared<ServerModel>();
  ASSIGN_OR_RETURN(model->optimizer, CreateOptimizer(config.optimizer()));
  model->sync = IsSyncMode(config);
  model->num_workers = request.num_workers();
  model->replicas_to_aggregate = replicas;
  if (config.has_sync()) {
    model->min_replicas =
        config.sync().min_replicas() > 0 ? config.sync().min_replicas() : replicas;
    if (model->min_replicas > replicas) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize: min_replicas ",
                                                     model->min_replicas, " exceeds the ", replicas,
                                                     " gradients a step aggregates"));
    }
    model->step_deadline = absl::Milliseconds(config.sync().step_deadline_ms());
  }
  model->held_push_ttl = absl::Milliseconds(config.rpc().step_timeout_ms()) +
                         absl::Milliseconds(config.rpc().rpc_timeout_ms());
  model->staleness_bound = config.has_async() ? config.async().staleness_bound() : 0;
  model->staleness_scaled_lr =
      config.has_async() && config.async().staleness_scaled_learning_rate();
  model->max_steps = config.max_steps();
  // One update's examples, for the linear scaling rule.
  const int64_t global_batch =
      static_cast<int64_t>(config.data().batch_size()) * (model->sync ? replicas : 1);
  ASSIGN_OR_RETURN(model->learning_rate,
                   LearningRate::Create(config.optimizer(), global_batch, config.max_steps()));
  model->clip_value = config.optimizer().clip_value();
  model->max_gradient_norm = config.optimizer().max_gradient_norm();
  model->max_relative_gradient_norm = config.optimizer().max_relative_gradient_norm();
  if (!config.checkpoint().dir().empty()) {
    model->checkpoint_dir = config.checkpoint().dir();
    model->checkpoint_every = config.checkpoint().every_steps();
    model->checkpoint_full_every = config.checkpoint().full_every();
    if (request.num_servers() < 1 || request.server_index() < 0 ||
        request.server_index() >= request.num_servers()) {
      return absl::InvalidArgumentError(absl::StrCat("Initialize: server ", request.server_index(),
                                                     " of ", request.num_servers()));
    }
  }
  if (request.num_servers() >= 1 && request.server_index() >= 0 &&
      request.server_index() < request.num_servers()) {
    model->shard = request.server_index();
    model->num_shards = request.num_servers();
  }
  RETURN_IF_ERROR(AddTables(config, global_batch, tier, request.part() == 0, model.get()));
  return model;
}

absl::StatusOr<std::unique_ptr<PartitionState>> NewPartition(const NamedTensor& nt,
                                                             const ServerModel& model) {
  PartitionKey key{nt.ref().variable(), nt.ref().partition()};
  absl::StatusOr<Tensor> t = FromProto(nt.tensor());
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Initialize: ", PartitionKeyString(key), ": ", t.status().message()));
  }
  if (key.first.empty() || key.second < 0) {
    return absl::InvalidArgumentError("Initialize: empty variable name or negative partition");
  }
  if (!AllFinite(t->span())) {
    return absl::InvalidArgumentError(
        absl::StrCat("Initialize: ", PartitionKeyString(key), " not finite"));
  }
  auto p = std::make_unique<PartitionState>();
  p->key = key;
  p->shape = t->shape();
  p->size = t->num_elements();
  {
    absl::MutexLock lock(&p->apply_mu);
    model.optimizer->InitSlots(p->size, &p->slots);
    // From a checkpoint: its slots and update count.
    if (nt.slots_size() > 0) {
      if (nt.slots_size() != static_cast<int>(p->slots.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("Initialize: ", PartitionKeyString(key), ": ", nt.slots_size(),
                         " slots, the optimizer has ", p->slots.size()));
      }
      for (int s = 0; s < nt.slots_size(); ++s) {
        absl::StatusOr<Tensor> slot = FromProto(nt.slots(s));
        if (!slot.ok() || slot->num_elements() != p->size || !AllFinite(slot->span())) {
          return absl::InvalidArgumentError(absl::StrCat("Initialize: ", PartitionKeyString(key),
                                                         ": slot ", s, " is not ", p->size,
                                                         " finite values"));
        }
        p->slots[s] = std::move(slot->values());
      }
    }
    if (nt.updates() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Initialize: ", PartitionKeyString(key), ": negative updates"));
    }
    p->updates = nt.updates();
  }
  {
    absl::MutexLock lock(&p->mu);
    p->current = std::make_shared<std::vector<float>>(std::move(t->values()));
  }
  p->staging.resize(model.sync ? model.num_workers : 0);
  return p;
}

}  // namespace pstrain
