"""Retry budget, backoff and context ids, as trainer/retry.c (docs/protocol.md).

A Budget holds one retry budget (trainer.retry_max_s): it starts at the
first failure after reset(), and no wait goes past it. The trainer resets
it for every unit of work (a psd.context, or all attempts of one batch), so
the budget is per batch, not per call. Waits start at
trainer.retry_backoff_s, double up to trainer.retry_backoff_max_s, and are
jittered to a uniform fraction in [0.5, 1) so that trainers that failed
together do not come back together.

Context ids: a random high half per client, a counter in the low half, so
a re-run never reuses an id psd may remember, and psd's dropout masks
(seeded by the low half, the rank and seq) repeat for a given --seed.
"""
import logging
import os
import random
import threading
import time

log = logging.getLogger("psd")

MIN_WAIT_S = 1e-3   # a remainder of the budget below this is spent
MAX_LOST = 3        # PS_RETRY_MAX_LOST: runs again of a lost batch before that is an error
MAX_LATE = 4        # PS_RETRY_MAX_LATE: runs again of a batch dropped from its sync round in a row


class Budget:
    def __init__(self, max_s, backoff_s, backoff_max_s, who="psd", seed=None, sleep=time.sleep, now=time.monotonic,
                 stats=None):
        self.max_s, self.backoff_s, self.backoff_max_s = max_s, backoff_s, backoff_max_s
        self.who = who
        self.rng = random.Random(seed)
        self.sleep, self.now = sleep, now
        self.total = 0        # retries over the budget's life (for summaries)
        self.stats = stats    # an object whose .retries counts them too (the client)
        self.reset()

    def reset(self):
        """A fresh budget: a new unit of work."""
        self.failed = False
        self.t_first = 0.0
        self.tries = 0
        self.next = self.backoff_s

    def wait(self, what, err, min_s=0.0, busy=False):
        """After a failure of `what` (err): if the budget allows, log it,
        sleep the next backoff - at least min_s (psd's admission hint), cut
        to what is left - and return True; else log the give-up (busy: psd
        kept refusing for its admission limits) and return False."""
        now = self.now()
        if not self.failed:
            self.failed, self.t_first = True, now
        used = now - self.t_first
        if self.max_s <= 0 or used >= self.max_s - MIN_WAIT_S:
            if self.max_s > 0 and busy:
                log.error("%s: %s: giving up after %d retries in %.1f s (trainer.retry_max_s = %g); psd kept refusing "
                          "it for its admission limits (last error: %s). Run fewer trainers or threads per host (or "
                          "token), smaller batches, or raise psd's server.max_calls_per_client or "
                          "server.max_context_bytes; steps it acknowledged are kept", self.who, what, self.tries, used,
                          self.max_s, err or "none")
            elif self.max_s > 0:
                log.error("%s: %s: giving up after %d retries in %.1f s (trainer.retry_max_s = %g); psd did not come "
                          "back (last error: %s). Restart this trainer once psd serves again; steps it acknowledged "
                          "are kept", self.who, what, self.tries, used, self.max_s, err or "none")
            return False
        d = max(self.next * (0.5 + 0.5 * self.rng.random()), min_s)
        if used + d > self.max_s:
            d = self.max_s - used
        self.tries += 1
        self.total += 1
        if self.stats is not None:
            self.stats.retries += 1
        log.warning("%s: %s: %s; retry %d in %.2f s (%.1f of %g s retry budget used)", self.who, what,
                    err or "failed", self.tries, d, used, self.max_s)
        self.sleep(d)
        self.next = min(self.next * 2, self.backoff_max_s)
        return True


class ContextIds:
    """Context ids: random high 32 bits, a counter in the low 32 (never 0)."""

    def __init__(self, base=None):
        if base is None:
            base = int.from_bytes(os.urandom(8), "little")
        self.base = base & ~0xFFFFFFFF & 0xFFFFFFFFFFFFFFFF
        self.n = 0
        self.lock = threading.Lock()

    def next(self):
        with self.lock:
            self.n = (self.n + 1) & 0xFFFFFFFF
            if self.n == 0:
                self.n = 1
            return self.base | self.n
