#include "worker/data/idx_reader.h"

#include "absl/strings/str_cat.h"
#include "worker/data/idx.h"
#include "common/base/status_macros.h"

namespace pstrain {

absl::StatusOr<Dataset> LoadIdxDataset(Env* env, const std::string& images_path,
                                       const std::string& labels_path, int input_dim,
                                       int num_labels, bool normalize) {
  ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(env, images_path));
  ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(env, labels_path));
  if (images.dims.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": expected images of rank >= 2"));
  }
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": expected labels of rank 1"));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, " has ", images.dims[0],
                                                   " images but ", labels_path, " has ",
                                                   labels.dims[0], " labels"));
  }
  int64_t dim = 1;
  for (size_t i = 1; i < images.dims.size(); ++i) dim *= images.dims[i];
  if (dim != input_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        images_path, ": images have ", dim, " values each, the model's input_dim is ", input_dim));
  }
  Dataset d;
  d.size = images.dims[0];
  d.dim = input_dim;
  d.x.resize(images.data.size());
  const float scale = normalize ? 1.0f / 255.0f : 1.0f;
  for (size_t i = 0; i < images.data.size(); ++i) d.x[i] = images.data[i] * scale;
  d.y.resize(d.size);
  for (int64_t i = 0; i < d.size; ++i) {
    if (labels.data[i] >= num_labels) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", int{labels.data[i]},
                                                     " at index ", i, " >= the model's ",
                                                     num_labels, " labels"));
    }
    d.y[i] = labels.data[i];
  }
  return d;
}

}  // namespace pstrain
