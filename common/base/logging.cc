#include "common/base/logging.h"

#include <memory>

#include "spdlog/sinks/stdout_sinks.h"

namespace pstrain {

void InitLogging(const std::string& task, const std::string& level) {
  // A second call (a process's second worker session) sets the same logger up again.
  auto logger = spdlog::get("pstrain");
  if (logger == nullptr) logger = spdlog::stderr_logger_mt("pstrain");
  // %L is the one-letter level; the task is fixed per process.
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e " + task + " %L %v");
  spdlog::level::level_enum lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") lvl = spdlog::level::info;
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
}

}  // namespace pstrain
