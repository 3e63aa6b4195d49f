// Process-wide logging through spdlog: one line per event, each carrying the
// task ("ps:1", "worker:0", "chief:0", "pstrain") so interleaved logs stay readable.
// InitLogging is called once from main() before any other thread starts; the
// logger itself is thread-safe.
#ifndef PSTRAIN_COMMON_LOGGING_H_
#define PSTRAIN_COMMON_LOGGING_H_

#include <string>

#include "spdlog/spdlog.h"

namespace pstrain {

// Installs a stderr logger whose lines read
// "2026-11-22 10:00:00.123 ps:1 I message". `level` is spdlog's name
// ("debug", "info", "warn", ...); an unknown name means "info".
void InitLogging(const std::string& task, const std::string& level = "info");

}  // namespace pstrain

#define LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)

#endif  // PSTRAIN_COMMON_LOGGING_H_
