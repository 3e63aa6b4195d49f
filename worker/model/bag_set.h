// A click-through model's bags over all its tables: each categorical field
// is a bag of rows of its table (data.schema.columns[].table, else the
// model's), and the model's input is [dense | the bags of table 0's fields |
// table 1's | ...], the tables in the order of their first field, each
// table's fields in the schema's order (one table: the fields in order, as
// EmbeddingBags lays them).
//
// Per step: Index splits the batch's ids by table (each table's bags and
// its unique ids, whose rows the caller pulls into rows(t)); Forward bags
// them into the model's input; Backward turns the model's input gradient
// into each table's row gradients (pushed from row_grads(t)). On the host
// this is EmbeddingBags per table; on a device DeviceEmbeddingBags per
// table, and, with several tables, each table's block of columns assembled
// apart and copied into (and its gradient out of) the input by
// Backend::CopyMatrix. One table writes straight into the input, as before
// tables could be several. Bit for bit the same numbers either way.
//
// A BagSet belongs to one thread at a time.
#ifndef PSTRAIN_WORKER_MODEL_BAG_SET_H_
#define PSTRAIN_WORKER_MODEL_BAG_SET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/client/ps_client.h"
#include "proto/config.pb.h"
#include "worker/model/backend.h"
#include "worker/model/embedding_bag.h"

namespace pstrain {

// A table and the categorical fields (indices, in the schema's order) whose
// bags it fills.
struct BagTable {
  std::string name;
  int dim = 0;
  std::vector<int> fields;
};

// The tables of a validated click-through config, in input order.
std::vector<BagTable> BagTablesOf(const TrainingConfig& config);

class BagSet {
 public:
  // `slots`: per categorical field, the ids an example holds (FieldIdSlots);
  // `device`: the backend whose memory the model's input is in, or null for
  // the host path.
  BagSet(std::vector<BagTable> tables, std::vector<int> slots, int dense_dim, Combiner combiner,
         Backend* device);
  // For a validated click-through config.
  static std::unique_ptr<BagSet> ForConfig(const TrainingConfig& config, int dense_dim,
                                           Backend* device);
  ~BagSet();

  int output_dim() const { return output_dim_; }
  // The ids an example holds (every field's slots).
  int ids_per_example() const { return per_example_; }
  size_t tables() const { return parts_.size(); }
  const BagTable& table(size_t t) const { return parts_[t].table; }

  // The step's batch: `ids` as the readers give them (the slots of every
  // field, an example after another). Sizes rows(t) and row_grads(t).
  void Index(const uint64_t* ids, int batch);
  // Table t's distinct ids of the batch, in order of first appearance.
  const std::vector<uint64_t>& ids(size_t t) const { return parts_[t].unique.ids; }
  // [ids(t).size(), dim]: the rows, as pulled, and their gradients.
  float* rows(size_t t) { return parts_[t].rows.data(); }
  float* row_grads(size_t t) { return parts_[t].grads.data(); }

  // The host path: x and dx are [batch, output_dim()] in host memory.
  void Forward(const float* dense, float* x);
  void Backward(const float* dx);

  // The device path: x and dx in the backend's memory. DeviceBackward
  // enqueues the gradients' download; once the backend has synchronised
  // (the model's FinishStep), TakeDeviceGradients moves them into
  // row_grads(t).
  absl::Status DeviceForward(const float* dense, float* x);
  absl::Status DeviceBackward(const float* dx);
  void TakeDeviceGradients();

  // Over every table's row gradients.
  double SquaredGradientNorm() const;
  void ScaleGradients(float scale);

 private:
  struct Part {
    BagTable table;
    int dense = 0;   // dense features at the start of its block (table 0 only)
    int column = 0;  // its block's first column in the model's input
    int width = 0;   // dense + fields * dim
    SparseBatch sparse;
    UniqueRows unique;
    std::vector<float> rows, grads, block;
    std::optional<EmbeddingBags> host;
    std::unique_ptr<DeviceEmbeddingBags> device;
    DeviceArray<float> device_block;
  };
  bool one_block() const { return parts_.size() == 1; }

  const std::vector<int> slots_;
  std::vector<int> slot_start_;  // per field, its first place in an example's ids
  int per_example_ = 0;
  int output_dim_ = 0;
  int batch_ = 0;
  Backend* const device_;
  std::vector<Part> parts_;
};

// The batch's rows of every table as PsClient's pulls fill them
// (gradients false) or its pushes send them (true), after Index.
std::vector<PsClient::TableRows> TableRowsOf(BagSet* bags, bool gradients);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_MODEL_BAG_SET_H_
