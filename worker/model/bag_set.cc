#include "worker/model/bag_set.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/base/embedding_ids.h"
#include "common/base/status_macros.h"
#include "common/cluster/feature_schema.h"

namespace pstrain {
namespace {

// The bags of `fields` (some of the example's fields, in order) of a batch
// whose examples hold `per_example` ids, field f's from slot_start[f].
SparseBatch FieldsBatch(const uint64_t* ids, int batch, int per_example,
                        const std::vector<int>& slots, const std::vector<int>& slot_start,
                        const std::vector<int>& fields) {
  SparseBatch s;
  s.batch = batch;
  s.fields = static_cast<int>(fields.size());
  s.offsets.reserve(static_cast<size_t>(batch) * fields.size() + 1);
  s.offsets.push_back(0);
  for (int b = 0; b < batch; ++b) {
    const uint64_t* example = ids + static_cast<size_t>(b) * per_example;
    for (int f : fields) {
      const uint64_t* at = example + slot_start[f];
      for (int j = 0; j < slots[f]; ++j) {
        if (at[j] != kNoId) s.ids.push_back(at[j]);
      }
      s.offsets.push_back(static_cast<int64_t>(s.ids.size()));
    }
  }
  return s;
}

}  // namespace

std::vector<BagTable> BagTablesOf(const TrainingConfig& config) {
  const ClickThroughConfig& ct = config.model().click_through();
  const std::vector<std::string> names = FieldTables(config.data().schema(), ct.table());
  std::vector<BagTable> tables;
  for (size_t f = 0; f < names.size(); ++f) {
    auto it = std::find_if(tables.begin(), tables.end(),
                           [&](const BagTable& t) { return t.name == names[f]; });
    if (it == tables.end()) {
      BagTable t;
      t.name = names[f];
      for (const EmbeddingTableConfig& c : config.embedding_tables()) {
        if (c.name() == t.name) t.dim = c.dim();
      }
      tables.push_back(std::move(t));
      it = tables.end() - 1;
    }
    it->fields.push_back(static_cast<int>(f));
  }
  return tables;
}

BagSet::BagSet(std::vector<BagTable> tables, std::vector<int> slots, int dense_dim,
               Combiner combiner, Backend* device)
    : slots_(std::move(slots)), device_(device) {
  for (int n : slots_) {
    slot_start_.push_back(per_example_);
    per_example_ += n;
  }
  int column = 0;
  for (BagTable& t : tables) {
    Part p;
    p.dense = parts_.empty() ? dense_dim : 0;
    p.column = column;
    p.width = p.dense + static_cast<int>(t.fields.size()) * t.dim;
    column += p.width;
    p.table = std::move(t);
    const int fields = static_cast<int>(p.table.fields.size());
    if (device_ == nullptr) {
      p.host.emplace(p.dense, fields, p.table.dim, combiner);
    } else {
      p.device = std::make_unique<DeviceEmbeddingBags>(device_, p.dense, fields, p.table.dim,
                                                       combiner);
      p.device_block = DeviceArray<float>(device_);
    }
    parts_.push_back(std::move(p));
  }
  output_dim_ = column;
}

std::unique_ptr<BagSet> BagSet::ForConfig(const TrainingConfig& config, int dense_dim,
                                          Backend* device) {
  return std::make_unique<BagSet>(
      BagTablesOf(config), FieldIdSlots(config.data().schema()), dense_dim,
      config.model().click_through().mean_bags() ? Combiner::kMean : Combiner::kSum, device);
}

BagSet::~BagSet() = default;

void BagSet::Index(const uint64_t* ids, int batch) {
  batch_ = batch;
  for (Part& p : parts_) {
    p.sparse = one_block() ? SparseBatch::FromSlots(ids, batch, slots_)
                           : FieldsBatch(ids, batch, per_example_, slots_, slot_start_,
                                         p.table.fields);
    p.unique = UniqueRows::Of(p.sparse.ids);
    p.rows.resize(p.unique.ids.size() * p.table.dim);
    p.grads.resize(p.rows.size());
  }
}

void BagSet::Forward(const float* dense, float* x) {
  if (one_block()) {
    Part& p = parts_[0];
    p.host->Forward(p.sparse, p.unique, p.rows.data(), dense, x);
    return;
  }
  for (Part& p : parts_) {
    p.block.resize(static_cast<size_t>(batch_) * p.width);
    p.host->Forward(p.sparse, p.unique, p.rows.data(), dense, p.block.data());
    for (int b = 0; b < batch_; ++b) {
      std::memcpy(x + static_cast<size_t>(b) * output_dim_ + p.column,
                  p.block.data() + static_cast<size_t>(b) * p.width, sizeof(float) * p.width);
    }
  }
}

void BagSet::Backward(const float* dx) {
  if (one_block()) {
    Part& p = parts_[0];
    p.host->Backward(p.sparse, p.unique, dx, p.grads.data());
    return;
  }
  for (Part& p : parts_) {
    p.block.resize(static_cast<size_t>(batch_) * p.width);
    for (int b = 0; b < batch_; ++b) {
      std::memcpy(p.block.data() + static_cast<size_t>(b) * p.width,
                  dx + static_cast<size_t>(b) * output_dim_ + p.column, sizeof(float) * p.width);
    }
    p.host->Backward(p.sparse, p.unique, p.block.data(), p.grads.data());
  }
}

absl::Status BagSet::DeviceForward(const float* dense, float* x) {
  if (one_block()) {
    Part& p = parts_[0];
    return p.device->Forward(p.sparse, p.unique, p.rows.data(), dense, x);
  }
  for (Part& p : parts_) {
    RETURN_IF_ERROR(p.device_block.Reserve(static_cast<size_t>(batch_) * p.width));
    RETURN_IF_ERROR(
        p.device->Forward(p.sparse, p.unique, p.rows.data(), dense, p.device_block.data()));
    RETURN_IF_ERROR(device_->CopyMatrix(p.device_block.data(), p.width, x + p.column, output_dim_,
                                        batch_, p.width));
  }
  return absl::OkStatus();
}

absl::Status BagSet::DeviceBackward(const float* dx) {
  if (one_block()) return parts_[0].device->Backward(dx);
  for (Part& p : parts_) {
    // The block's buffer is free again: its bags were copied into the
    // input before the model's forward pass, in the stream's order.
    RETURN_IF_ERROR(device_->CopyMatrix(dx + p.column, output_dim_, p.device_block.data(),
                                        p.width, batch_, p.width));
    RETURN_IF_ERROR(p.device->Backward(p.device_block.data()));
  }
  return absl::OkStatus();
}

void BagSet::TakeDeviceGradients() {
  for (Part& p : parts_) {
    const float* g = p.device->host_row_gradients();
    std::copy(g, g + p.grads.size(), p.grads.begin());
  }
}

double BagSet::SquaredGradientNorm() const {
  double sum = 0;
  for (const Part& p : parts_) {
    for (float g : p.grads) sum += double{g} * g;
  }
  return sum;
}

std::vector<PsClient::TableRows> TableRowsOf(BagSet* bags, bool gradients) {
  std::vector<PsClient::TableRows> rows;
  for (size_t t = 0; t < bags->tables(); ++t) {
    rows.push_back({bags->table(t).name, bags->table(t).dim, bags->ids(t),
                    gradients ? bags->row_grads(t) : bags->rows(t)});
  }
  return rows;
}

void BagSet::ScaleGradients(float scale) {
  for (Part& p : parts_) {
    for (float& g : p.grads) g *= scale;
  }
}

}  // namespace pstrain
