// What `pstrain launch` prints when a run has finished, from the chief's
// summary.json: the held-out figures (AUC and log loss first for a
// click-through model, whose accuracy says little at a low click rate),
// the speed, where the final model is and how to export it, and where a
// worker's step went.
#ifndef PSTRAIN_TOOLS_RUN_REPORT_H_
#define PSTRAIN_TOOLS_RUN_REPORT_H_

#include <string>

#include "nlohmann/json.hpp"

namespace pstrain {

// The closing lines ("pstrain launch: finished: ..."), each ending in '\n';
// empty when `summary` holds no evaluation.
std::string FinishedLines(const nlohmann::json& summary, const std::string& output_dir);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_RUN_REPORT_H_
