/* rpc_call.c - a server call's life cycle (rpc_server_impl.h): armed
 * request, accepted (admission: rpc_admission.c), message received, queued,
 * run by a worker or deferred, replied, finished; the event threads that
 * drive the completion queue and the workers that run handlers. */
#include "rpc_server_impl.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/support/alloc.h>

#include "clock.h"
#include "hash.h"
#include "log.h"

static ps_rpc_call *call_new(ps_rpc_server *s) {
    ps_rpc_call *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->s = s;
    pthread_mutex_init(&c->mu, NULL);
    atomic_init(&c->refs, 1);
    for (int i = 0; i < NTAGS; i++) c->tags[i] = (call_tag){c, i};
    c->who = -1;
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    return c;
}

void rpc_call_unref(ps_rpc_call *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->local) {
        if (c->send) grpc_byte_buffer_destroy(c->send);
        pthread_cond_destroy(&c->local_cv);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Does the application side still hold the call (so its grpc_call and
 * request must stay)? */
static int call_busy(const ps_rpc_call *c) {
    return c->queued || c->handler_running || c->sending || (c->deferred && !c->completed && !c->cancelled);
}

/* Called with c->mu held; unlocks it. Releases the gRPC side of the call
 * once no batch is outstanding and the application is done with it; the
 * struct itself lives on while the owner of a deferred call holds it. */
void rpc_call_unlock_maybe_finish(ps_rpc_call *c) {
    if (c->finished || c->batches > 0 || call_busy(c)) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    c->finished = 1;
    ps_rpc_server *s = c->s;
    c->s = NULL;
    if (c->recv) grpc_byte_buffer_destroy(c->recv);
    if (c->send) grpc_byte_buffer_destroy(c->send);
    c->recv = c->send = NULL;
    if (c->replied) grpc_slice_unref(c->status_details);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->call) grpc_call_unref(c->call);
    c->call = NULL;
    /* a stream that ended, unanswered, before its request message arrived */
    int reset = c->peer[0] && !c->got_message && !c->timed_out && (c->cancelled || c->close_cancelled);
    pthread_mutex_unlock(&c->mu);
    /* The server outlives every unfinished call (the event thread leaves
     * only at live == 0); s must not be touched after this unlock. */
    pthread_mutex_lock(&s->mu);
    s->live--;
    rpc_client_release_locked(s, c);
    if (c->watched) {
        if (c->wprev) c->wprev->wnext = c->wnext;
        else s->watch = c->wnext;
        if (c->wnext) c->wnext->wprev = c->wprev;
        c->watched = 0;
    }
    int cut = reset && rpc_note_reset_locked(s, c->peer);
    int hcut = reset && rpc_note_host_reset_locked(s, c->peer);
    if (c->conn_counted) rpc_conn_release_locked(s, c->peer);
    pthread_mutex_unlock(&s->mu);
    if (hcut) {
        char why[160];
        snprintf(why, sizeof why, "reset more than %d streams a second over all its connections before sending "
                 "their messages", s->opts.max_resets_per_s);
        rpc_cut_host(s, c->peer, why);
    }
    if (cut) {
        char why[120];
        snprintf(why, sizeof why, "reset more than %d streams in one second before sending their messages",
                 s->opts.max_resets_per_s);
        rpc_cut_connection(s, c->peer, why);
    }
    rpc_call_unref(c);
}

/* Arm one more generic request for a new call (unless stopping). */
void rpc_arm_request(ps_rpc_server *s) {
    if (atomic_load(&s->stopping)) return;
    pthread_mutex_lock(&s->mu);
    s->live++;
    pthread_mutex_unlock(&s->mu);
    ps_rpc_call *c = call_new(s);
    if (!c) {
        ps_log(PS_LOG_ERROR, "rpc: out of memory for a new call; one fewer request armed");
        pthread_mutex_lock(&s->mu);
        s->live--;
        pthread_mutex_unlock(&s->mu);
        return;
    }
    /* After shutdown has begun gRPC fails the request with an event, so a
     * race with ps_rpc_server_shutdown still ends in on_request. */
    grpc_call_error e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md,
                                                 s->cq, s->cq, &c->tags[TAG_REQUEST]);
    if (e != GRPC_CALL_OK) {
        ps_log(PS_LOG_ERROR, "rpc: grpc_server_request_call: %s", grpc_call_error_to_string(e));
        pthread_mutex_lock(&c->mu);
        rpc_call_unlock_maybe_finish(c);
    }
}

static void start_batch_locked(ps_rpc_call *c, const grpc_op *ops, size_t n, int tag, const char *what) {
    c->batches++;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->tags[tag], NULL);
    if (e != GRPC_CALL_OK) {
        c->batches--;
        c->cancelled = 1;
        ps_log(PS_LOG_ERROR, "rpc: start_batch (%s): %s", what, grpc_call_error_to_string(e));
    }
}

/* With c->mu held: c's one RECV_CLOSE_ON_SERVER op (its own batch, the
 * reply's or the refusal's) into *op, zeroed first; marks it started. */
static void close_op_locked(ps_rpc_call *c, grpc_op *op) {
    memset(op, 0, sizeof *op);
    op->op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op->data.recv_close_on_server.cancelled = &c->close_cancelled;
    c->close_started = 1;
}

/* With c->mu held, no other batch of c being started: start its
 * RECV_CLOSE_ON_SERVER batch (tag CLOSE) unless already started. */
static void start_close_locked(ps_rpc_call *c) {
    if (c->close_started || c->cancelled || c->finished) return;
    grpc_op op;
    close_op_locked(c, &op);
    start_batch_locked(c, &op, 1, TAG_CLOSE, "close");
}

/* With c->mu held: a sent call's phases go to its method's accumulator. */
static void prof_fold_locked(ps_rpc_call *c) {
    ps_rpc_server *s = c->s;
    if (s && s->prof && c->t_recv && c->t_reply)  /* a call that ran: its phases */
        ps_prof_acc_add(&s->prof[c->m - s->methods], &c->prof, c->t_reply - c->t_accept);
}

/* With c->mu held: the trailing metadata of a reply with status code -
 * psd's admission hint (PS_RPC_RETRY_AFTER_KEY) on a RESOURCE_EXHAUSTED
 * whose refusal set one (rpc_admit, ps_rpc_call_retry_after); the count
 * (0 or 1), the entry in *md. */
static size_t trailing_locked(ps_rpc_call *c, grpc_status_code code, grpc_metadata **md) {
    *md = NULL;
    if (code != GRPC_STATUS_RESOURCE_EXHAUSTED || c->retry_after_ms <= 0) return 0;
    int n = snprintf(c->retry_val, sizeof c->retry_val, "%d", c->retry_after_ms);
    c->retry_md.key = grpc_slice_from_static_string(PS_RPC_RETRY_AFTER_KEY);
    c->retry_md.value = grpc_slice_from_static_buffer(c->retry_val, (size_t)n);
    *md = &c->retry_md;
    return 1;
}

/* With c->mu held: the ops of the call's one send batch into ops (4
 * entries): initial metadata (with the reply, not with the receive: a call
 * reset before its message costs psd no write), resp when not NULL, the
 * status with details and its trailing metadata, and the close when it did
 * not start at accept (late close: the call ends in this batch's one
 * completion). Marks the call replied and its send clock started; returns
 * how many ops. */
static size_t send_ops_locked(ps_rpc_call *c, grpc_byte_buffer *resp, grpc_status_code code, const char *details,
                              grpc_op *ops) {
    c->status_details = grpc_slice_from_copied_string(details);
    c->replied = 1;
    memset(ops, 0, 4 * sizeof *ops);
    size_t n = 0;
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].data.send_initial_metadata.count = 0;
    n++;
    if (resp) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = resp;
        n++;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.trailing_metadata_count =
        trailing_locked(c, code, &ops[n].data.send_status_from_server.trailing_metadata);
    ops[n].data.send_status_from_server.status = code;
    ops[n].data.send_status_from_server.status_details = &c->status_details;
    n++;
    if (!c->close_started) {
        close_op_locked(c, &ops[n++]);
        c->close_in_reply = 1;
    }
    if (c->counted) __atomic_store_n(&c->send_since, ps_mono_ms(), __ATOMIC_RELAXED);
    return n;
}

/* With c->mu held: hand the reply to gRPC. Takes resp. Returns 1 if sent,
 * 0 if the call was cancelled (resp destroyed). c->mu is released while
 * gRPC takes the batch (it writes what it can from this thread, and the
 * completions it posts wake an event thread that would otherwise wait
 * for c->mu right away: two context switches a call); c->sending keeps
 * the call from finishing meanwhile, and no other batch of the call can
 * start then (the receive and close batches started at accept, the reply
 * is the call's only send batch). Held again on return. */
static int reply_locked(ps_rpc_call *c, grpc_byte_buffer *resp, grpc_status_code code,
                        const char *details) {
    PS_ASSERT(!c->replied);
    if ((code != GRPC_STATUS_OK || c->cancelled || c->finished) && resp) { /* never sent, never leaked */
        grpc_byte_buffer_destroy(resp);
        resp = NULL;
    }
    if (c->cancelled || c->finished) return 0;
    if (code == GRPC_STATUS_OK && !resp) resp = grpc_raw_byte_buffer_create(NULL, 0);
    if (resp) atomic_fetch_add(&c->s->bytes_sent, grpc_byte_buffer_length(resp));
    int prof = c->s->prof != NULL;
    c->send = resp;
    grpc_op ops[4];
    size_t n = send_ops_locked(c, resp, code, details, ops);
    c->batches++;
    c->sending = 1;
    grpc_call *call = c->call;
    pthread_mutex_unlock(&c->mu);
    int64_t t_send = prof ? ps_prof_now() : 0;
    grpc_call_error e = grpc_call_start_batch(call, ops, n, &c->tags[TAG_SEND], NULL);
    int64_t t_sent = prof ? ps_prof_now() : 0;
    pthread_mutex_lock(&c->mu);
    c->sending = 0;
    if (e != GRPC_CALL_OK) {
        c->batches--;
        c->cancelled = 1;
        ps_log(PS_LOG_ERROR, "rpc: start_batch (reply): %s", grpc_call_error_to_string(e));
    } else if (prof) {
        c->t_reply = t_sent;
        c->prof.ns[PS_PHASE_SEND] = t_sent - t_send;
        if (c->send_done) prof_fold_locked(c);  /* on_send came first */
    }
    return 1;
}

/* Refuse an accepted call without reading its message. */
static void call_refuse(ps_rpc_call *c, grpc_status_code code, const char *details) {
    pthread_mutex_lock(&c->mu);
    c->status_details = grpc_slice_from_copied_string(details);
    c->replied = 1;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = 0;
    ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[1].data.send_status_from_server.trailing_metadata_count =
        trailing_locked(c, code, &ops[1].data.send_status_from_server.trailing_metadata);
    ops[1].data.send_status_from_server.status = code;
    ops[1].data.send_status_from_server.status_details = &c->status_details;
    close_op_locked(c, &ops[2]);
    start_batch_locked(c, ops, 3, TAG_SEND, "refuse");
    rpc_call_unlock_maybe_finish(c);
}

/* With c->mu held (scan_timeouts): end call c, whose request message has
 * not arrived, with code and details and, for a RESOURCE_EXHAUSTED, psd's
 * hint retry_after_ms (PS_RPC_RETRY_AFTER_KEY) - a status sent as an
 * ordinary reply rather than grpc_call_cancel_with_status, which takes no
 * trailing metadata. Its receive may still be pending: gRPC ends the
 * stream (trailers, then RST_STREAM NO_ERROR to a client still sending)
 * and fails the receive, or completes it if the message got in first -
 * on_recv then drops it unread (c->replied), so a call answered so never
 * runs and the client may send it again as it is. A client that does not
 * take even the trailers is cancelled after server.send_timeout_s
 * (send_since, as any reply). 0 if the call was already done, or the
 * batch could not start (the caller cancels it then). */
int rpc_call_end_unread_locked(ps_rpc_call *c, grpc_status_code code, const char *details, int retry_after_ms) {
    if (c->replied || c->cancelled || c->finished || !c->call) return 0;
    c->retry_after_ms = retry_after_ms;
    grpc_op ops[4];
    size_t n = send_ops_locked(c, NULL, code, details, ops);
    start_batch_locked(c, ops, n, TAG_SEND, "end unread");
    return !c->cancelled;  /* not started: the caller cancels it */
}

/* Event thread: a requested call arrived (metadata only). */
static void on_request(ps_rpc_call *c, int success) {
    ps_rpc_server *s = c->s;
    if (!success) { /* server shutting down */
        pthread_mutex_lock(&c->mu);
        rpc_call_unlock_maybe_finish(c);
        return;
    }
    if (s->prof) c->t_accept = ps_prof_now();
    c->accepted_ms = ps_mono_ms();
    rpc_arm_request(s);  /* the next call needs no worker to be free */

    char details[PS_RPC_DETAILS_MAX];
    details[0] = '\0';
    char method[160], peer[160];
    rpc_escape_slice(method, sizeof method, c->details.method);
    char *rawpeer = grpc_call_get_peer(c->call);
    snprintf(c->peer, sizeof c->peer, "%s", rawpeer ? rawpeer : "");
    c->key = ps_hash_str(c->peer) | 1;   /* the connection, never 0 */
    pthread_mutex_lock(&s->mu);
    int cut = rpc_conn_add_locked(s, c->peer);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&c->mu);
    c->conn_counted = 1;
    pthread_mutex_unlock(&c->mu);
    if (cut) rpc_cut_connection(s, c->peer, "holds far more calls than its concurrent stream limit allows "
                            "(server.max_streams_per_connection)");
    rpc_escape_str(peer, sizeof peer, rawpeer);
    pthread_mutex_lock(&s->mu);
    int off = rpc_host_cut_locked(s, c->peer);
    pthread_mutex_unlock(&s->mu);
    grpc_status_code code = GRPC_STATUS_UNAVAILABLE;
    if (off)  /* its connections are closed at the next rpc_scan_connections */
        snprintf(details, sizeof details, "this host is cut off for a while: it reset more than %d streams a "
                 "second over its connections, or sent a header block that never ends", s->opts.max_resets_per_s);
    else
        code = rpc_admit(c, rawpeer, method, peer, details, sizeof details);
    gpr_free(rawpeer);
    if (code != GRPC_STATUS_OK) {
        call_refuse(c, code, details);
        return;
    }
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&c->recv_since, ps_mono_ms(), __ATOMIC_RELAXED);
    if (!s->late_close) start_close_locked(c);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv;
    if (!c->cancelled) start_batch_locked(c, &op, 1, TAG_RECV, "recv");
    rpc_call_unlock_maybe_finish(c);
}

/* With s->mu held: the idle worker of class cls to hand a call of
 * connection key to (rpc_worker): the one whose last call was key's, else
 * the one idle longest (the others are likelier some other connection's,
 * about to be asked again); NULL if none is idle. */
static rpc_worker *idle_worker_locked(ps_rpc_server *s, int cls, uint64_t key) {
    rpc_worker *best = NULL;
    for (int i = 0; i < s->nworkers; i++) {
        rpc_worker *w = &s->workers[i];
        if (w->cls != cls) continue;
        if (w->last_key == key && !w->handoff && (w->idle || __atomic_load_n(&w->finishing, __ATOMIC_RELAXED)))
            return w;
        if (!w->idle) continue;
        if (!best || w->idle_seq < best->idle_seq) best = w;
    }
    return best;
}

static void enqueue(ps_rpc_server *s, ps_rpc_call *c) {
    pthread_mutex_lock(&s->mu);
    rpc_client_unstall_locked(s, c);  /* its message is in */
    rpc_conn_progress_locked(s, c->peer);
    rpc_worker *w = s->affinity ? idle_worker_locked(s, c->cls, c->key) : NULL;
    if (!w && !c->close_started) {
        /* it will wait for a worker: first learn when its client goes
         * away (its close batch; no worker can see the call yet), then
         * look again for an idle worker */
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_lock(&c->mu);
        start_close_locked(c);
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_lock(&s->mu);
        w = s->affinity ? idle_worker_locked(s, c->cls, c->key) : NULL;
    }
    if (w) {
        w->idle = 0;
        __atomic_store_n(&w->handoff, c, __ATOMIC_RELEASE);  /* a polling worker reads it unlocked */
        int wake = w->sleeping;
        pthread_mutex_unlock(&s->mu);
        if (wake) pthread_cond_signal(&w->cv);
        return;
    }
    work_queue *q = &s->q[c->cls];
    c->next = NULL;
    if (q->tail) q->tail->next = c;
    else q->head = c;
    q->tail = c;
    pthread_mutex_unlock(&s->mu);
    /* after the unlock: a worker woken under s->mu would wait for it at
     * once. With affinity no worker of the class is idle (it would have
     * been handed the call): the first to finish takes it. */
    if (!s->affinity) pthread_cond_signal(&q->cv);
}

/* Event thread: the request message arrived (or the call died first). */
static void on_recv(ps_rpc_call *c, int success) {
    pthread_mutex_lock(&c->mu);
    c->batches--;
    __atomic_store_n(&c->recv_since, 0, __ATOMIC_RELAXED);
    if (success && !c->cancelled && !c->replied) {  /* replied: ended unread (rpc_call_end_unread_locked) */
        c->got_message = 1;
        c->queued = 1;
        ps_rpc_server *s = c->s;
        if (s->prof && c->t_accept) {
            c->t_recv = ps_prof_now();
            c->prof.ns[PS_PHASE_RECV] = c->t_recv - c->t_accept;
        }
        if (c->recv) atomic_fetch_add(&s->bytes_received, grpc_byte_buffer_length(c->recv));
        pthread_mutex_unlock(&c->mu);
        enqueue(s, c);
        return;
    }
    c->cancelled = 1;  /* the close batch reports the end of the call */
    rpc_call_unlock_maybe_finish(c);
}

/* With c->mu held: should on_cancel run now? Takes a reference if so. */
static int cancel_due_locked(ps_rpc_call *c) {
    if (!c->deferred || c->completed || !c->cancelled || c->handler_running || c->cancel_fired ||
        !c->on_cancel)
        return 0;
    c->cancel_fired = 1;
    atomic_fetch_add(&c->refs, 1);
    return 1;
}

static void fire_cancel(ps_rpc_call *c) {
    c->on_cancel(c->cancel_arg, c);
    rpc_call_unref(c);
}

/* Event thread: the call ended (reply sent, or cancelled). */
static void on_close(ps_rpc_call *c, int success) {
    pthread_mutex_lock(&c->mu);
    c->batches--;
    if (!success || c->close_cancelled || !c->replied) c->cancelled = 1;
    int fire = cancel_due_locked(c);
    rpc_call_unlock_maybe_finish(c);
    if (fire) fire_cancel(c);
}

static void on_send(ps_rpc_call *c, int success) {
    /* a failed send shows up as cancelled on the close batch, which may be
     * this one (late close) */
    pthread_mutex_lock(&c->mu);
    c->batches--;
    if (c->close_in_reply && (!success || c->close_cancelled)) c->cancelled = 1;
    if (c->sending) c->send_done = 1;  /* reply_locked folds the phases in */
    else prof_fold_locked(c);
    __atomic_store_n(&c->send_since, 0, __ATOMIC_RELAXED);
    rpc_call_unlock_maybe_finish(c);
}

static void call_event(call_tag *t, int success) {
    switch (t->kind) {
    case TAG_REQUEST: on_request(t->c, success); return;
    case TAG_RECV: on_recv(t->c, success); return;
    case TAG_CLOSE: on_close(t->c, success); return;
    case TAG_SEND: on_send(t->c, success); return;
    }
    PS_ASSERT(!"unknown call tag");
}

/* Worker: run the handler of a received call (or answer for it). */
static void run_call(rpc_worker *w, ps_rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    c->queued = 0;
    if (c->cancelled) {  /* the client went away while the call waited */
        rpc_call_unlock_maybe_finish(c);
        return;
    }
    c->handler_running = 1;
    ps_rpc_server *s = c->s;
    pthread_mutex_unlock(&c->mu);
    int64_t t_handler = 0;
    if (s->prof && c->t_recv) {   /* the deeper layers add to c->prof while it runs */
        t_handler = ps_prof_now();
        c->prof.ns[PS_PHASE_QUEUE] = t_handler - c->t_recv;
        ps_prof_bind(&c->prof);
    }

    grpc_status_code code = GRPC_STATUS_OK;
    char details[PS_RPC_DETAILS_MAX];
    details[0] = '\0';
    grpc_byte_buffer *resp = NULL;
    char *method = grpc_slice_to_c_string(c->details.method);
    gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
    gpr_timespec deadline = gpr_convert_clock_type(c->details.deadline, GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(deadline, now) <= 0) {
        code = GRPC_STATUS_DEADLINE_EXCEEDED;
        snprintf(details, sizeof details, "%s: deadline passed before the handler ran", method);
    } else {
        char *peer = grpc_call_get_peer(c->call);
        ps_rpc_call_info info = {method, peer ? peer : "", deadline,
                                 c->who >= 0 ? s->tokens[c->who].name : "", c, c->m->id, c->client};
        c->m->fn(s->user, &info, c->recv, &resp, &code, details, sizeof details);
        details[sizeof details - 1] = '\0';
        gpr_free(peer);
    }
    /* what is left is the reply: the connection's next call may be handed
     * to this worker now (rpc_worker) */
    __atomic_store_n(&w->finishing, 1, __ATOMIC_RELAXED);

    if (t_handler) ps_prof_bind(NULL);
    pthread_mutex_lock(&c->mu);
    if (t_handler) {   /* the handler's own time: its whole time less what the layers timed */
        const int64_t *ns = c->prof.ns;
        c->prof.ns[PS_PHASE_HANDLER] = ps_prof_now() - t_handler - ns[PS_PHASE_DECODE] - ns[PS_PHASE_CTX] -
                                       ns[PS_PHASE_LOCK] - ns[PS_PHASE_COMPUTE] - ns[PS_PHASE_ENCODE];
    }
    c->handler_running = 0;
    int fire = 0;
    if (c->deferred) {
        if (resp) grpc_byte_buffer_destroy(resp);
        fire = cancel_due_locked(c);
    } else {
        if (code != GRPC_STATUS_OK && PS_LOG_DEBUG >= ps_log_get_level()) {
            char esc[PS_RPC_DETAILS_MAX];  /* details may quote what the client sent */
            rpc_escape_str(esc, sizeof esc, details);
            ps_log(PS_LOG_DEBUG, "rpc: %s -> %s: %s", method, ps_grpc_code_name(code), esc);
        }
        reply_locked(c, resp, code, details);
    }
    gpr_free(method);
    rpc_call_unlock_maybe_finish(c);
    if (fire) fire_cancel(c);
}

static ps_rpc_call *queue_pop_locked(work_queue *q) {
    ps_rpc_call *c = q->head;
    if (c) {
        q->head = c->next;
        if (!q->head) q->tail = NULL;
    }
    return c;
}

/* With s->mu held: a call handed to w, else the FIFO's first. */
static ps_rpc_call *worker_take_locked(rpc_worker *w) {
    ps_rpc_call *c = w->handoff;
    if (c) w->handoff = NULL;
    else c = queue_pop_locked(&w->s->q[w->cls]);
    if (c) w->last_key = c->key;
    return c;
}

void rpc_poll_adapt(int *poll_us, int max, double slept_us) {
    if (slept_us <= max) {  /* a longer poll (up to max) would have caught this call */
        int grown = *poll_us < PS_RPC_POLL_MIN_US ? PS_RPC_POLL_MIN_US : 2 * *poll_us;
        *poll_us = grown < max ? grown : max;
    } else if ((*poll_us /= 2) < PS_RPC_POLL_MIN_US) {
        *poll_us = 0;
    }
}

/* With s->mu held (released while waiting): w's next call with affinity
 * (rpc_worker), NULL when stopping and nothing is left. */
static ps_rpc_call *worker_next_locked(rpc_worker *w) {
    ps_rpc_server *s = w->s;
    __atomic_store_n(&w->finishing, 0, __ATOMIC_RELAXED);   /* read by enqueue without the worker */
    ps_rpc_call *c = worker_take_locked(w);
    if (c) return c;
    /* idle: nothing handed over and the FIFO empty (an enqueue hands a call
     * to an idle worker rather than queuing it) */
    w->idle = 1;
    w->idle_seq = ++s->idle_seq;
    const int max = s->opts.idle_poll_us;
    double t0 = max > 0 ? ps_mono_s() : 0;
    if (w->poll_us > 0) {  /* an enqueue sees w idle, not sleeping: hands over, signals nothing */
        pthread_mutex_unlock(&s->mu);
        double until = t0 + w->poll_us * 1e-6;
        while (!__atomic_load_n(&w->handoff, __ATOMIC_ACQUIRE) && !__atomic_load_n(&s->workers_stop, __ATOMIC_RELAXED) &&
               ps_mono_s() < until)
            sched_yield();
        pthread_mutex_lock(&s->mu);
        s->poll_s += ps_mono_s() - t0;
        if ((c = worker_take_locked(w))) {
            s->polls_hit++;
            w->idle = 0;
            return c;
        }
        s->polls_missed++;
    }
    while (!(c = worker_take_locked(w)) && !s->workers_stop) {
        w->sleeping = 1;
        pthread_cond_wait(&w->cv, &s->mu);
        w->sleeping = 0;
    }
    if (max > 0 && c) rpc_poll_adapt(&w->poll_us, max, (ps_mono_s() - t0) * 1e6);
    w->idle = 0;
    return c;
}

void *rpc_worker_main(void *arg) {
    rpc_worker *w = arg;
    ps_rpc_server *s = w->s;
    /* named for top -H, perf and /proc/PID/task/TID/comm (bench/psd_threads.sh) */
    static const char *const names[NCLASSES] = {"psd-worker", "psd-reserved", "psd-reader"};
    pthread_setname_np(pthread_self(), names[w->cls]);
    work_queue *q = &s->q[w->cls];
    for (;;) {
        pthread_mutex_lock(&s->mu);
        ps_rpc_call *c;
        if (s->affinity) {
            c = worker_next_locked(w);
        } else {
            while (!q->head && !s->workers_stop) pthread_cond_wait(&q->cv, &s->mu);
            c = queue_pop_locked(q);
        }
        pthread_mutex_unlock(&s->mu);
        if (!c) break;  /* stopping and nothing left */
        run_call(w, c);
    }
    return NULL;
}

/* One event thread polls the completion queue; the others stand by. Two
 * threads polling at once hand gRPC's poller role to each other at every
 * wakeup and contend for its pollset lock: about 11 more context switches
 * per batch of 3 calls with 2 trainers (docs/performance.md). But one
 * thread alone cannot keep up with a flood: a rapid reset's reads create
 * streams inside gRPC faster than one thread also handling their events
 * arms requests and counts the resets (tests/it_hostile.sh). So a standby
 * thread looks every PS_RPC_STANDBY_CHECK_MS (or when the polling thread,
 * busy without a pause for PS_RPC_STANDBY_AFTER_MS, wakes it) whether
 * events are waiting, without blocking; it handles events as long as it
 * finds some, and polls (blocking) while the polling thread is busy
 * outside gRPC, e.g. in a slow callback. Waiting events are what it cannot
 * see otherwise: the polling thread deep in gRPC's reading of a flood. */
#define PS_RPC_STANDBY_AFTER_MS 5
#define PS_RPC_STANDBY_CHECK_MS 20

static int event_loop_done(ps_rpc_server *s) {
    if (!atomic_load(&s->stopping)) return 0;
    pthread_mutex_lock(&s->mu);
    int done = s->live == 0;
    pthread_mutex_unlock(&s->mu);
    return done;
}

/* Has the polling thread been busy long enough for a standby to join? */
static int event_backlog(ps_rpc_server *s, long long now) {
    long long since = atomic_load(&s->event_busy_since);
    return since && now - since >= PS_RPC_STANDBY_AFTER_MS;
}

static void event_scans(ps_rpc_server *s, long long now) {
    long long due = atomic_load(&s->next_scan);
    if (now >= due && atomic_compare_exchange_strong(&s->next_scan, &due, now + 200))
        rpc_scan_timeouts(s);  /* one event thread at a time */
    due = atomic_load(&s->next_conn_scan);
    if (now >= due && atomic_compare_exchange_strong(&s->next_conn_scan, &due, now + PS_RPC_CONN_SCAN_MS))
        rpc_scan_connections(s);
}

/* The next event of s->cq, waiting up to wait_ms (0: only one already
 * waiting or ready on a socket); GRPC_QUEUE_TIMEOUT if none came. */
static grpc_event cq_next(ps_rpc_server *s, int wait_ms) {
    gpr_timespec dl = wait_ms > 0 ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                 gpr_time_from_millis(wait_ms, GPR_TIMESPAN))
                                  : gpr_inf_past(GPR_CLOCK_MONOTONIC);
    return grpc_completion_queue_next(s->cq, dl, NULL);
}

/* A standby thread (see above). */
static void standby_loop(ps_rpc_server *s) {
    while (!event_loop_done(s)) {
        pthread_mutex_lock(&s->standby_mu);
        if (!event_backlog(s, ps_mono_ms()) && !atomic_load(&s->stopping)) {
            struct timespec ts = ps_mono_deadline_ms(PS_RPC_STANDBY_CHECK_MS);
            pthread_cond_timedwait(&s->standby_cv, &s->standby_mu, &ts);
        }
        pthread_mutex_unlock(&s->standby_mu);
        for (;;) {
            long long now = ps_mono_ms();
            event_scans(s, now);
            if (event_loop_done(s)) return;
            grpc_event ev = cq_next(s, 0);
            if (ev.type == GRPC_QUEUE_TIMEOUT) {
                /* nothing waiting: back to standby, unless the polling thread
                 * is busy outside gRPC (or shutdown wants every call drained) */
                if (!event_backlog(s, now) && !atomic_load(&s->stopping)) break;
                ev = cq_next(s, 10);
                if (ev.type == GRPC_QUEUE_TIMEOUT) continue;
            }
            PS_ASSERT(ev.type == GRPC_OP_COMPLETE);
            call_event(ev.tag, ev.success);
        }
    }
}

/* Serve events until stopping and no call or request is left, i.e. no live
 * call can start a batch on s->cq any more. */
void rpc_event_loop(ps_rpc_server *s, int standby) {
    if (standby) {
        standby_loop(s);
        return;
    }
    int woke = 0;   /* standby woken in this busy spell */
    for (;;) {
        long long now = ps_mono_ms();
        event_scans(s, now);
        if (event_loop_done(s)) break;
        /* an event already queued (or ready on a socket) means no pause */
        grpc_event ev = cq_next(s, 0);
        if (ev.type == GRPC_QUEUE_TIMEOUT) {
            atomic_store(&s->event_busy_since, 0);
            woke = 0;
            ev = cq_next(s, 100);
            if (ev.type == GRPC_QUEUE_TIMEOUT) continue;
            atomic_store(&s->event_busy_since, ps_mono_ms());
        } else if (!woke && event_backlog(s, now)) {
            woke = 1;
            pthread_mutex_lock(&s->standby_mu);
            pthread_cond_broadcast(&s->standby_cv);
            pthread_mutex_unlock(&s->standby_mu);
        }
        PS_ASSERT(ev.type == GRPC_OP_COMPLETE); /* queue shut down only after this loop */
        call_event(ev.tag, ev.success);
    }
    atomic_store(&s->event_busy_since, 0);
}

void *rpc_watch_main(void *arg) {
    ps_rpc_server *s = arg;
    pthread_setname_np(pthread_self(), "psd-watch");
    while (!atomic_load(&s->watch_stop)) {
        struct timespec ts = {0, PS_RPC_CONN_SCAN_MS / 5 * 1000000L};
        nanosleep(&ts, NULL);
        long long now = ps_mono_ms(), due = atomic_load(&s->next_conn_scan);
        if (now >= due && atomic_compare_exchange_strong(&s->next_conn_scan, &due, now + PS_RPC_CONN_SCAN_MS))
            rpc_scan_connections(s);
    }
    return NULL;
}

void *rpc_event_main(void *arg) {
    ps_rpc_server *s = arg;
    pthread_setname_np(pthread_self(), "psd-event");
    rpc_event_loop(s, atomic_fetch_add(&s->event_roles, 1) > 0);
    return NULL;
}

ps_rpc_call *ps_rpc_call_defer(const ps_rpc_call_info *info, ps_rpc_cancel_fn on_cancel,
                               void *cancel_arg) {
    ps_rpc_call *c = info ? info->call : NULL;
    if (!c) return NULL;
    if (c->local) return rpc_local_defer(c, on_cancel, cancel_arg);
    pthread_mutex_lock(&c->mu);
    PS_ASSERT(c->handler_running && !c->deferred); /* from the handler, once */
    c->deferred = 1;
    start_close_locked(c);  /* on_cancel needs to know when the call ends */
    if (c->s && c->s->prof) c->t_defer = ps_prof_now();
    c->on_cancel = on_cancel;
    c->cancel_arg = cancel_arg;
    atomic_fetch_add(&c->refs, 1);  /* the owner's, released by ps_rpc_call_complete */
    pthread_mutex_unlock(&c->mu);
    return c;
}

int ps_rpc_call_complete(ps_rpc_call *c, grpc_byte_buffer *response, grpc_status_code code,
                         const char *details) {
    if (!c) {
        if (response) grpc_byte_buffer_destroy(response);
        return 0;
    }
    if (c->local) return rpc_local_complete(c, response, code, details);
    pthread_mutex_lock(&c->mu);
    PS_ASSERT(c->deferred && !c->completed); /* exactly once per deferred call */
    c->completed = 1;
    if (c->t_defer && c->s && c->s->prof) c->prof.ns[PS_PHASE_HELD] = ps_prof_now() - c->t_defer;
    int sent = reply_locked(c, response, code, details ? details : "");
    if (!sent && !c->finished && code != GRPC_STATUS_OK)
        ps_log(PS_LOG_DEBUG, "rpc: deferred reply dropped: call already cancelled");
    rpc_call_unlock_maybe_finish(c);
    rpc_call_unref(c);
    return sent;
}

void ps_rpc_call_retry_after(ps_rpc_call *c, int ms) {
    if (!c || ms <= 0) return;
    pthread_mutex_lock(&c->mu);
    c->retry_after_ms = ms;
    pthread_mutex_unlock(&c->mu);
}

int ps_rpc_call_cancelled(ps_rpc_call *c) {
    if (!c) return 1;
    pthread_mutex_lock(&c->mu);
    int r = c->cancelled;
    pthread_mutex_unlock(&c->mu);
    return r;
}

