/* pstrain's C API: a worker whose model is computed by the caller (a
 * PyTorch script, through the Python package `pstrain`, which loads
 * libpstrain.so with ctypes), over worker/session.h. Plain C, so that any
 * CPython (or any language with a C FFI) loads it without a build of its
 * own, as ps-lite's and TensorFlow's C APIs.
 *
 * Every call that can fail returns 0 on success or an error code (those of
 * absl::StatusCode / gRPC: 3 INVALID_ARGUMENT, 4 DEADLINE_EXCEEDED, 9
 * FAILED_PRECONDITION, 14 UNAVAILABLE, 16 UNAUTHENTICATED, ...) and, when
 * `error` is not NULL, sets *error to a message naming what was wrong, to
 * be released with pstrain_free. Buffers are the caller's: float32, C
 * order, each variable's whole tensor; the session keeps no pointer past
 * the call (but pstrain_push_ready's, until the step's push).
 *
 * A session belongs to one thread at a time; one session per process. A
 * NULL session is refused (INVALID_ARGUMENT) by the calls that return a
 * code; the accessors take a session pstrain_open returned.
 */
#ifndef PSTRAIN_WORKER_C_API_H_
#define PSTRAIN_WORKER_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PSTRAIN_C_API_VERSION 3

typedef struct pstrain_session pstrain_session;

/* PSTRAIN_C_API_VERSION of the library loaded. */
int pstrain_api_version(void);

/* Opens a worker session: argv[0..argc) are the worker binary's flags
 * ("--cluster_spec=FILE", "--task=N", "--config=FILE", credentials, ...;
 * without --cluster_spec the task comes from TF_CONFIG), registers with the
 * chief and returns the session, or NULL with *error set. */
pstrain_session* pstrain_open(int argc, const char* const* argv, int* code, char** error);
/* Sends the final report to the chief (this worker finished its training)
 * and releases the session. A report that fails (the chief already gone) is
 * logged, as the C++ worker does, not an error. */
int pstrain_close(pstrain_session* s, char** error);
/* Releases the session without the final report: the caller failed or is
 * ending early. The chief does not count this worker as done (as a C++
 * worker that fails); under pstrain launch --restart=on-failure the
 * process is restarted and rejoins. */
void pstrain_abandon(pstrain_session* s);
void pstrain_free(void* p);

int pstrain_worker(const pstrain_session* s);
int pstrain_num_workers(const pstrain_session* s);
int pstrain_sync(const pstrain_session* s);
int64_t pstrain_start_step(const pstrain_session* s);
/* 1 and *epoch, *position set when the data goes on from a cursor (a
 * resumed run, a restarted process), else 0. */
int pstrain_start_cursor(const pstrain_session* s, int64_t* epoch, int64_t* position);
int64_t pstrain_local_steps(const pstrain_session* s);
/* Rollbacks of the job this session followed (a lost server's: a pull or
 * push that failed on it waited for the rollback and went on from its step;
 * pstrain_start_cursor is then where the data goes on). */
int pstrain_rollbacks(const pstrain_session* s);
/* The per-worker batch of the config's data section. */
int pstrain_batch_size(const pstrain_session* s);
int64_t pstrain_max_steps(const pstrain_session* s);
/* The run's seed (the config's). */
uint64_t pstrain_seed(const pstrain_session* s);

int pstrain_num_variables(const pstrain_session* s);
/* Variable v's name (valid while the session is), its rank and shape. */
const char* pstrain_variable_name(const pstrain_session* s, int v);
int pstrain_variable_rank(const pstrain_session* s, int v);
int64_t pstrain_variable_dim(const pstrain_session* s, int v, int d);

/* Reads every variable v into dst[v]. *finished = 1: the servers reached
 * max_steps (nothing read). *step: the version read. */
int pstrain_pull(pstrain_session* s, float* const* dst, int n, int* finished, int64_t* step,
                 char** error);
/* Pushes src[v], variable v's gradient, for the step last pulled, with the
 * step's mean loss, its examples and where the data stands after its batch
 * (epoch, position). *end = 1: training is over. */
int pstrain_push(pstrain_session* s, const float* const* src, int n, float loss, int64_t examples,
                 int64_t cursor_epoch, int64_t cursor_position, double compute_seconds, int* end,
                 char** error);

/* Variables vars[0..n) of the step last pulled have their final gradients
 * in src[0..n) (the backward pass is past them): their calls leave now, as
 * the C++ worker pushes layer by layer. Unlike the other calls' buffers,
 * these must stay unchanged until the step's pstrain_push returns, which
 * sends the rest. Does nothing where pstrain_push_streams is 0. A step's
 * rows go before its first pstrain_push_ready. */
int pstrain_push_ready(pstrain_session* s, const int* vars, const float* const* src, int n,
                       char** error);
/* 1 where pstrain_push_ready sends gradients early (sync mode; not with
 * rpc.sequential or optimizer.clip_global_norm, which needs the whole
 * gradient first), else 0. */
int pstrain_push_streams(const pstrain_session* s);

/* An embedding table's width, or -1 (and *error) for an unknown table. */
int pstrain_table_dim(const pstrain_session* s, const char* table, char** error);
/* Rows of `table` for ids[0..n) into out (n x dim floats), and their
 * gradients pushed (sync: before the step's pstrain_push). 10 ABORTED: the
 * job rolled back under the call, which followed it; the step is dropped
 * (its push would be refused): pull again. */
int pstrain_pull_rows(pstrain_session* s, const char* table, const uint64_t* ids, int64_t n,
                      float* out, char** error);
int pstrain_push_rows(pstrain_session* s, const char* table, const uint64_t* ids, int64_t n,
                      const float* grads, char** error);

/* An evaluation the caller ran: metrics names[i] = values[i] (i < n; names
 * of letters, digits and underscores, values finite), at version `step`
 * (< 0: the one the last pull read), on `examples` examples. Sent to the chief at
 * once: its log, /metrics, TensorBoard (eval/NAME) and summary.json. */
int pstrain_report_eval(pstrain_session* s, const char* const* names, const double* values, int n,
                        int64_t step, int64_t examples, char** error);

#ifdef __cplusplus
}
#endif

#endif /* PSTRAIN_WORKER_C_API_H_ */
