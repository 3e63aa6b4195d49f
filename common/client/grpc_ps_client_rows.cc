// GrpcPsClient's calls of embedding rows: pulls and pushes of one table or
// several in one round trip, and the chief's loads from a checkpoint.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/client/grpc_ps_client.h"
#include "common/client/ps_requests.h"
#include "common/rpc/fan_out.h"
#include "common/rpc/rpc.h"
#include "common/rpc/wire_frame.h"

namespace pstrain {
namespace {

const char kPullRowsMethod[] = "/pstrain.PsService/PullRows";
const char kPushRowsMethod[] = "/pstrain.PsService/PushRows";

}  // namespace

absl::Status GrpcPsClient::PullRows(const std::string& table, int dim,
                                    absl::Span<const uint64_t> ids, int64_t min_version,
                                    absl::Duration wait, float* out, int64_t* version) {
  return PullTablesAt({TableRows{table, dim, ids, out}}, min_version, wait, version);
}

absl::Status GrpcPsClient::PullTables(absl::Span<const TableRows> tables, int64_t min_version,
                                      absl::Duration wait) {
  return PullTablesAt(tables, min_version, wait, nullptr);
}

absl::Status GrpcPsClient::PullTablesAt(absl::Span<const TableRows> tables, int64_t min_version,
                                        absl::Duration wait, int64_t* version) {
  // One call per table and server that holds some of its ids, all in flight
  // together. Requests as plain messages; replies as frames whose rows are
  // copied from gRPC's slices straight to their places in the tables' rows.
  struct Call {
    size_t table;
    int server;
  };
  std::vector<std::vector<std::vector<uint32_t>>> by(tables.size());
  std::vector<Call> calls;
  for (size_t t = 0; t < tables.size(); ++t) {
    by[t] = RowsByServer(tables[t].ids, num_servers());
    for (int s : ServersWithRows(by[t])) calls.push_back({t, s});
  }
  std::vector<grpc::ByteBuffer> requests(calls.size()), responses(calls.size());
  std::vector<int> servers;
  for (size_t c = 0; c < calls.size(); ++c) {
    const TableRows& t = tables[calls[c].table];
    PullRowsRequest r;
    r.set_incarnation(incarnation_);
    r.set_worker(worker_);
    r.set_table(t.table);
    r.set_ids(IdBytes(t.ids, by[calls[c].table][calls[c].server]));
    r.set_min_version(min_version);
    r.set_timeout_ms(absl::ToInt64Milliseconds(wait));
    requests[c] = SerializeMessage(r);
    servers.push_back(calls[c].server);
  }
  const std::vector<grpc::GenericStub*> stubs = NextStubs(servers);
  auto name = [&](size_t c) {
    return absl::StrCat("PullRows ", tables[calls[c].table].table, " from ",
                        ServerName(calls[c].server));
  };
  // Not made again when refused: a row lookup counts toward a row's
  // admission and creates rows, so it is not a pure read.
  RETURN_IF_ERROR(CallAll(
      static_cast<int>(calls.size()), wait + rpc_timeout_, /*wait_for_ready=*/false,
      [&](int c) { return name(c); },
      [&](int c, grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
        stubs[c]->UnaryCall(ctx, kPullRowsMethod, grpc::StubOptions(), &requests[c],
                            &responses[c], std::move(done));
      }));
  int64_t oldest = -1;
  for (size_t c = 0; c < calls.size(); ++c) {
    const TableRows& t = tables[calls[c].table];
    const std::vector<uint32_t>& positions = by[calls[c].table][calls[c].server];
    const int64_t row_bytes = int64_t{t.dim} * 4;
    PullRowsResponse header;
    IncomingFrame frame;
    absl::Status decoded = DecodeFrame(responses[c], &header, &frame);
    if (!decoded.ok()) {
      return absl::DataLossError(absl::StrCat(name(c), ": a bad reply: ", decoded.message()));
    }
    if (header.dim() != t.dim ||
        frame.payload.size() != static_cast<int64_t>(positions.size()) * row_bytes) {
      return absl::DataLossError(absl::StrCat(name(c), ": ", frame.payload.size(),
                                              " bytes of rows of width ", header.dim(), " for ",
                                              positions.size(), " ids of width ", t.dim));
    }
    int64_t offset = 0;
    for (uint32_t i : positions) {
      frame.payload.CopyTo(offset, row_bytes, t.rows + static_cast<size_t>(i) * t.dim);
      offset += row_bytes;
    }
    if (oldest < 0 || header.version() < oldest) oldest = header.version();
  }
  for (const TableRows& t : tables) {
    counters_.pull_payload_bytes += static_cast<int64_t>(t.ids.size()) * t.dim * 4;
    counters_.pull_copied_bytes += static_cast<int64_t>(t.ids.size()) * t.dim * 4;
  }
  if (version != nullptr) *version = oldest;
  return absl::OkStatus();
}

absl::Status GrpcPsClient::PushRows(const std::string& table, int dim,
                                    absl::Span<const uint64_t> ids, const float* grads,
                                    const std::vector<int64_t>& steps,
                                    std::vector<PushOutcome>* outcomes) {
  std::vector<std::vector<PushOutcome>> per_table;
  // (A push only reads its rows.)
  RETURN_IF_ERROR(PushTables({TableRows{table, dim, ids, const_cast<float*>(grads)}}, steps,
                             &per_table));
  *outcomes = std::move(per_table[0]);
  return absl::OkStatus();
}

absl::Status GrpcPsClient::PushTables(absl::Span<const TableRows> tables,
                                      const std::vector<int64_t>& steps,
                                      std::vector<std::vector<PushOutcome>>* outcomes) {
  if (static_cast<int>(steps.size()) != num_servers()) {
    return absl::InvalidArgumentError("PushRows: one step per server expected");
  }
  struct Call {
    size_t table;
    int server;
  };
  std::vector<Call> calls;
  std::vector<grpc::ByteBuffer> requests, responses;
  std::vector<int> servers;
  for (size_t t = 0; t < tables.size(); ++t) {
    const TableRows& rows = tables[t];
    const std::vector<std::vector<uint32_t>> by = RowsByServer(rows.ids, num_servers());
    // Each server's ids and gradients gathered once into one buffer, which
    // the frame sends as it is (the buffer lives until gRPC releases it).
    const size_t row_bytes = static_cast<size_t>(rows.dim) * sizeof(float);
    for (int s : ServersWithRows(by)) {
      const std::vector<uint32_t>& positions = by[s];
      PushRowsRequest header;
      header.set_incarnation(incarnation_);
      header.set_worker(worker_);
      header.set_step(steps[s]);
      header.set_session(session_);
      header.set_table(rows.table);
      header.set_num_ids(static_cast<int64_t>(positions.size()));
      const size_t size = positions.size() * (sizeof(uint64_t) + row_bytes);
      std::shared_ptr<char[]> bytes(new char[size]);  // written whole below, not zeroed first
      char* id_dst = bytes.get();
      char* grad_dst = id_dst + positions.size() * sizeof(uint64_t);
      for (uint32_t i : positions) {
        std::memcpy(id_dst, &rows.ids[i], sizeof(uint64_t));  // little-endian hosts
        std::memcpy(grad_dst, rows.rows + static_cast<size_t>(i) * rows.dim, row_bytes);
        id_dst += sizeof(uint64_t);
        grad_dst += row_bytes;
      }
      std::vector<OutgoingPayload> payload;
      const char* data = bytes.get();
      payload.push_back({data, static_cast<int64_t>(size),
                         [keep = std::move(bytes)]() mutable { keep.reset(); }});
      requests.push_back(EncodeFrame(header, std::move(payload)));
      calls.push_back({t, s});
      servers.push_back(s);
    }
  }
  responses.resize(calls.size());
  const std::vector<grpc::GenericStub*> stubs = NextStubs(servers);
  auto name = [&](size_t c) {
    return absl::StrCat("PushRows ", tables[calls[c].table].table, " to ",
                        ServerName(calls[c].server));
  };
  RETURN_IF_ERROR(CallAll(
      static_cast<int>(calls.size()), push_timeout_, /*wait_for_ready=*/false,
      [&](int c) { return name(c); },
      [&](int c, grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
        stubs[c]->UnaryCall(ctx, kPushRowsMethod, grpc::StubOptions(), &requests[c],
                            &responses[c], std::move(done));
      }));
  std::vector<PushRowsResponse> replies(calls.size());
  for (size_t c = 0; c < calls.size(); ++c) {
    if (absl::Status st = ParseMessage(responses[c], &replies[c]); !st.ok()) {
      return absl::DataLossError(absl::StrCat(name(c), ": a bad reply: ", st.message()));
    }
  }
  outcomes->assign(tables.size(),
                   std::vector<PushOutcome>(num_servers(), PUSH_OUTCOME_UNSPECIFIED));
  for (size_t c = 0; c < calls.size(); ++c) {
    (*outcomes)[calls[c].table][calls[c].server] = replies[c].outcome();
  }
  for (const TableRows& t : tables) {
    counters_.push_payload_bytes += static_cast<int64_t>(t.ids.size()) * t.dim * 4;
    counters_.push_copied_bytes += static_cast<int64_t>(t.ids.size()) * t.dim * 4;
  }
  return absl::OkStatus();
}

absl::Status GrpcPsClient::LoadRows(const std::string& table, int dim, absl::Span<const uint64_t> ids,
                                const float* values, const std::vector<const float*>& slots,
                                absl::Span<const int64_t> updates,
                                absl::Span<const int64_t> touched) {
  for (const auto& [s, req] : LoadRowsRequests(incarnation_, num_servers(), table, dim, ids,
                                               values, slots, updates, touched)) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, rpc_timeout_);
    LoadRowsResponse resp;
    RETURN_IF_ERROR(FromGrpcStatus(stubs_[s]->LoadRows(&ctx, req, &resp),
                                   absl::StrCat("LoadRows ", table, " to ", ServerName(s))));
  }
  return absl::OkStatus();
}

}  // namespace pstrain
