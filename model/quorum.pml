/*
 * quorum.pml: a model of fencelock's quorum mode, for the spin model checker.
 *
 * One lock key on N independent Redis masters (no replication between them). A client takes the
 * lock on a majority of them (Redlock) and gets a fencing token from them that never goes back.
 * model/README.md states the protocol this model checks, the runs and what they found; this
 * header says what is modelled and how.
 *
 * THE PROTOCOL (one attempt of one client; Q = N/2 + 1)
 *
 *   Phase 1, acquire: send acquire(owner, P) to every node; owner is fresh for every attempt,
 *     P is a proposal the client picks (any number).
 *     acquire on a node: if the lock key is free: if P is above every token the node stored
 *     (the fence exists and P > fence, or there is no fence and P >= clock), take it
 *     (fence := P) and reply {1, P, accepted}; else mint a token (fence := max(fence + 1,
 *     clock)) and reply {1, token, not accepted}; either way set the lock key to owner with the
 *     lease. If the lock key holds owner, re-arm the lease and reply {1, fence, accepted iff
 *     fence = P}; else reply {0}.
 *   Decide: with >= Q grants in hand and the validity not yet over: if >= Q of the grants
 *     counted accepted P, report the grant with token P at once (the fast path: no phase 2);
 *     else T := the largest token of the grants (P for an accepted one) and phase 2. Without
 *     Q grants, give up.
 *   Phase 2, write-back: send confirm(owner, T) to every node that granted.
 *     confirm on a node: if the lock key holds owner, raise the fence to T if it is below
 *     (fence := max(fence, T)), re-arm the lease (never shortening it), reply 1; else reply 0.
 *   Report: with >= Q confirms in hand and the validity not yet over, the lock is held with
 *     token T until the deadline t0 + lease - drift (t0: when phase 1 was sent); else give up.
 *   Renew: send extend(owner) to every node (send time s). extend: if the lock key holds owner,
 *     re-arm the lease (never shortening it), reply 1; else 0. With >= Q replies 1, the deadline
 *     becomes max(deadline, s + lease - drift); otherwise it stays.
 *   Release (and giving up): send release(owner) to every node. release: if the lock key holds
 *     owner, delete it (the fence stays).
 *   A reply counts only for the phase (and renewal round) whose request it answers.
 *
 * A CLIENT (state table; "send X" sends X to every node that is up, "granting" to those whose
 * phase-1 reply granted)
 *
 *   state     event                                     action                      next
 *   IDLE      attempts left                             t0 := now, pick P, send     P1
 *                                                       acquire(P)
 *   P1        >= Q grants, >= Q of them accepted P,     report the grant, token P   HOLD
 *             and now < t0 + L - DRIFT
 *   P1        >= Q grants, < Q of them accepted P,      T := max token, send        P2
 *             and now < t0 + L - DRIFT                  confirm(T) to granting
 *   P1        gives up (any time: timeout, no quorum)   send release                IDLE
 *   P2        >= Q confirms and now < t0 + L - DRIFT    report the grant, token T   HOLD
 *   P2        gives up (any time)                       send release                IDLE
 *   HOLD      renewals left and now < deadline          s := now, send extend       RENEWING
 *   HOLD      done (any time, also once lost)           send release                IDLE
 *   RENEWING  >= Q extends                              deadline := max(deadline,   HOLD
 *                                                         s + L - DRIFT)
 *   RENEWING  round fails (any time)                    (deadline unchanged)        HOLD
 *   RENEWING  done (any time)                           send release                IDLE
 *
 *   The client holds the lock (believes it may act as the holder) while it is in HOLD or
 *   RENEWING and now < deadline. Each IDLE -> P1 starts a new attempt with a new owner id;
 *   a client has A attempts in all (a grant released and taken again counts as two).
 *
 * WHAT IS MODELLED
 *
 *   - Nodes: the lock key (owner or 0, and how long until its lease may run out), the fence
 *     counter, the clock (as floor, below), up or crashed. Every script runs atomically on its node (d_step), as Redis runs
 *     scripts one at a time.
 *   - Network: a request sent to a node is pending until the node runs it, which may be at any
 *     later time or never; the pending requests of one client on one node run in any order
 *     (several connections, no FIFO promised). A request that never runs is a lost request; a
 *     node that runs nothing for a while is a frozen node, and what it runs after its phase is
 *     over is a late grant, confirm or extend. Each reply is lost or not. A reply is matched to
 *     its request: one that arrives after its phase (or renewal round) is over is ignored, the
 *     same as lost; one that arrives late within its phase is one the client did not wait for.
 *     Release: the request is sent when an attempt ends; the model lets the lock key of an
 *     attempt that is over be deleted at any later time (release run, late) or never (lost), on
 *     a node that is up. In untimed runs that is the same as the lease running out.
 *   - Crashes: a node crashes (CRASHES in a run): its pending requests are lost and it runs
 *     nothing until it restarts. It restarts empty: no lock key, no fence counter. The tokens
 *     it then mints come from its clock (the clock floor of mint in grant.lua).
 *     The restart rule (assumed; EAGER_RESTART shows it is needed): a node restarts only
 *       (a) once its clock is past every token it stored before the crash (its fence, and
 *           tokens written back to it, which may come from a node whose clock is ahead); the
 *           model gives it exactly that: floor := the largest value its fence had, and the
 *           next token is above floor; and
 *       (b) once every lease it held would have run out (Redlock's delayed restart; needed for
 *           mutual exclusion only).
 *     Under this rule a crash changes nothing a client or a token can observe that delays,
 *     lost requests and leases running out do not already give: max(fence, floor), from which
 *     every token is minted and above which a proposal is accepted, is what the fence would
 *     have been (a node whose clock ran ahead of its fence accepts fewer proposals after the
 *     restart, no more). This is why the larger runs leave crashes out. A fence counter that expires after idle (lapse_at in grant.lua) is the
 *     same event, gone only once the clock is past it, so it is not modelled on its own.
 *   - Tokens: mint gives max(fence + 1, clock), and only their order matters: tokens are small
 *     numbers, and a node's clock reads floor + 1 (0 until a restart or a bump), so mint is
 *     max(fence, floor) + 1. Runs with LEAD start with node 0 (the nodes are symmetric: any
 *     node) as the others, or one token ahead (fence 1: a node that granted before, or whose
 *     clock is ahead), or with fence 1 and its clock at 3 (a node that granted before and whose
 *     clock has since moved on: it accepts P = 2 though it would mint 3). BUMPS lets a node's
 *     clock move on at any time so that it mints one more than it would have (its fence
 *     stays), BUMPS times in a run. Tokens are checked with no clock assumption other than
 *     restart rule (a).
 *   - Proposals: a client picks P in 0 .. PMAX at the start of each attempt, every value a
 *     run of its own (so below, equal to and above the fences and clocks of the moment; P = 0
 *     is below every clock, as a client whose estimate is far behind, and is never accepted:
 *     the protocol without proposals). PMAX bounds the search, and is set per run
 *     (model/check).
 *   - Time (TIMED runs only): a discrete tick; every duration is kept as ticks left, so runs
 *     are unbounded in time. A lease set or re-armed now lasts at least L - D ticks of true
 *     time and then runs out at any time (a slow node clock may keep it longer); D bounds how
 *     much shorter than L a lease can be in the eyes of a client, node clock and client clock
 *     errors together (rate drift over one lease). The client counts its validity and its
 *     deadline as L - DRIFT ticks from the send time. The clock assumption is D <= DRIFT.
 *     Without TIMED a lease may run out at any time and a client has no clock (it reports
 *     whenever it has its quorum): the run with no clock assumption at all.
 *
 * WHAT IS ABSTRACTED AWAY
 *
 *   The queue and waiters keys (quorum mode has no handoff), pub/sub wake-ups, retry delays
 *   (a client starts its next attempt whenever it likes), the values of the lease and of the
 *   minimum validity (report needs one tick of validity left), the time a script takes (none),
 *   owner ids other than "equal or not", token values other than their order, renewals in
 *   untimed runs (they cannot change a token), and resending a request within one phase.
 *   NOTOKENS runs (mutual exclusion only) do not keep fences at all, and there a client that
 *   has its majority of grants may take the fast path or phase 2 as it likes.
 *
 * PROPERTIES (assert, checked when a client reports a grant or renews)
 *
 *   P1 tokens, every run: the token of a reported grant differs from every other reported
 *      token, and is larger than every token reported before its attempt started.
 *   P2 tokens in report order, TIMED runs: a reported token is larger than every token
 *      reported before it.
 *   ME mutual exclusion, TIMED runs: no two clients hold the lock at the same tick.
 *
 * CONFIGURATION (-D on the spin command line; model/check lists the runs)
 *
 *   N nodes (3 or 5), C clients, A attempts per client (1 or 2), PMAX (proposals 0 .. PMAX,
 *   at most 6; default 4), LEAD, BUMPS, CRASHES, TIMED with L, D, DRIFT and RENEW (renewal
 *   rounds per grant), NOTOKENS.
 *   Broken variants that must fail: ACCEPT_ANY (a node with a fence accepts any proposal,
 *   without P > fence), FAST_ON_ONE (the fast path with a majority of grants of which one, not
 *   Q, accepted P), ACCEPT_NO_CLOCK (a node with no fence accepts any proposal, without
 *   P >= clock), NO_WRITEBACK (confirm does not raise the fence),
 *   NO_CONFIRM_CHECK (confirm does not check that the lock key is still ours), EAGER_RESTART
 *   (a node restarts empty at once: its clock behind its tokens, its leases not run out),
 *   NO_VALIDITY (the client does not check the validity and counts the lease from the
 *   report), REUSE_OWNER (one owner id for all the attempts of a client).
 *   REACH=n asserts that fewer than n grants are reported: it must fail, to show that runs
 *   with n grants exist and the properties are not true for want of grants. REACH_RENEW
 *   asserts that no renewal holds the lock longer: it must fail too, and so must REACH_FAST=n,
 *   which asserts that fewer than n grants are reported by the fast path.
 *
 *   The printf lines say what happens in a trail (spin -t); the verifier does not run them.
 */

#ifndef N
#define N 3
#endif
#ifndef C
#define C 2
#endif
#ifndef A
#define A 1
#endif
#ifndef BUMPS
#define BUMPS 0
#endif
#ifndef CRASHES
#define CRASHES 0
#endif
#ifdef NOTOKENS
#undef PMAX
#define PMAX 0
#endif
#ifndef PMAX
#define PMAX 4
#endif
#ifdef TIMED
#ifndef L
#define L 3
#endif
#ifndef D
#define D 1
#endif
#ifndef DRIFT
#define DRIFT 1
#endif
#ifndef RENEW
#define RENEW 1
#endif
#endif

#define Q (N / 2 + 1)

/* Requests: one bit per kind and attempt in pend[c * N + k], the requests of client c that node
 * k has not run yet (A <= 2: six bits). Release is not a pending request: see RELEASED. */
#define ACQ 0
#define CNF 1
#define EXT 2
#define BIT(kind, a) (1 << ((kind) * A + (a)))

/* Owner id of attempt a of client c; 0 is no owner. */
#ifdef REUSE_OWNER
#define OWNER(c, a) ((c) + 1)
#else
#define OWNER(c, a) ((c) * A + (a) + 1)
#endif

/* Client states. */
#define IDLE 0
#define P1 1
#define P2 2
#define HOLD 3
#define RENEWING 4

/* Nodes. */
byte lock[N];          /* owner id holding the lock key, 0: free */
byte fence[N];         /* fence counter, 0: absent */
byte floor[N];         /* the clock is past floor: it reads floor + 1 in token units (raised by a
                        * restart, rule (a), and by BUMPS) */
bool down[N];          /* crashed, not yet restarted */
byte crashes = CRASHES;
byte bumps = BUMPS;    /* counter bumps left (see node) */
#ifdef TIMED
byte ke[N];            /* ticks until the lease of lock[k] may run out (0: it may now) */
#endif

/* Network. */
byte pend[C * N];      /* requests of client c that node k has not run: BIT(kind, attempt) */
byte okb[C];           /* nodes whose reply of the current phase of client c said yes, one bit
                        * each: granted (P1), confirmed (P2), extended (RENEWING) */
byte accb[C];          /* P1: nodes whose grant was counted and accepted the proposal */
byte gmax[C];          /* P1: the largest token granted so far */

/* Clients. */
byte st[C];            /* IDLE, P1, P2, HOLD, RENEWING */
byte att[C];           /* the current attempt, 0 .. A - 1; A: no attempt left */
byte prop[C * A];      /* the proposal P of attempt a of client c (acquire carries it) */
byte tok[C * A];       /* T of attempt a of client c, once decided (confirm carries it) */
#ifdef TIMED
byte cdl[C];           /* ticks until the deadline: validity left in P1 and P2, and the lock
                        * is held in HOLD and RENEWING while cdl > 0 */
byte rnd[C];           /* RENEWING: ticks until send time + L - DRIFT of the round */
byte ren[C];           /* renewal rounds left for the current grant */
#endif

/* Ghost state for the properties. */
int seen;              /* tokens of the grants reported so far, one bit each */
byte maxrep;           /* largest token reported so far */
byte low[C];           /* maxrep when the current attempt of client c started */
#ifdef REACH
byte nrep;             /* number of grants reported */
#endif
#ifdef REACH_FAST
byte nfast;            /* number of grants reported by the fast path */
#endif

#define MAX(x, y) ((x) > (y) -> (x) : (y))

/* The number of bits set among the low five of x (N <= 5). */
#define NB(x) (((x) & 1) + (((x) >> 1) & 1) + (((x) >> 2) & 1) + (((x) >> 3) & 1) + (((x) >> 4) & 1))

/* Dead requests. A confirm or extend of attempt a of client c pending on node k can only do
 * something if the lock key there is that attempt's, now or once its acquire runs. When neither
 * can be any more it is dropped (and an extend is not sent), so that states differing in such
 * requests only are one. Not with NO_CONFIRM_CHECK or REUSE_OWNER, where they still act. */
#if defined(NO_CONFIRM_CHECK) || defined(REUSE_OWNER)
#define LIVE(c, a, k) true
#define KEY_GONE(k) skip
#else
#define LIVE(c, a, k) (lock[k] == OWNER(c, a) || (pend[(c) * N + (k)] & BIT(ACQ, a)))
/* lock[k] is about to lose its owner */
#define KEY_GONE(k) \
  pend[((lock[k] - 1) / A) * N + (k)] = \
    pend[((lock[k] - 1) / A) * N + (k)] & ~(BIT(CNF, (lock[k] - 1) % A) | BIT(EXT, (lock[k] - 1) % A))
#endif

/* Sends a request of the current attempt of client c to every node that is up (a node that is
 * down refuses the connection: the request is lost). */
inline send_all(c, kind) {
  k = 0;
  do
  :: k < N ->
     if
     :: !down[k] && (kind != EXT || LIVE(c, att[c], k)) ->
        pend[c * N + k] = pend[c * N + k] | BIT(kind, att[c])
     :: else -> skip
     fi;
     k++
  :: else -> break
  od;
  k = 0
}

/* Counts the bits of okb[c] into n. */
inline count_ok(c, n) {
  n = 0; k = 0;
  do
  :: k < N -> n = n + ((okb[c] >> k) & 1); k++
  :: else -> break
  od;
  k = 0
}

/* Whether a confirm of attempt a of client c waits to run on some node. */
#if N == 3
#define CNF_PENDING(c, a) ((pend[c * N] | pend[c * N + 1] | pend[c * N + 2]) & BIT(CNF, a))
#elif N == 5
#define CNF_PENDING(c, a) ((pend[c * N] | pend[c * N + 1] | pend[c * N + 2] | pend[c * N + 3] | \
                            pend[c * N + 4]) & BIT(CNF, a))
#endif

/* Whether an acquire of attempt a of client c waits to run on some node. */
#if N == 3
#define ACQ_PENDING(c, a) ((pend[c * N] | pend[c * N + 1] | pend[c * N + 2]) & BIT(ACQ, a))
#elif N == 5
#define ACQ_PENDING(c, a) ((pend[c * N] | pend[c * N + 1] | pend[c * N + 2] | pend[c * N + 3] | \
                            pend[c * N + 4]) & BIT(ACQ, a))
#endif

/* Once nothing needs P of attempt a of client c any more (phase 1 is over and no acquire of
 * the attempt waits to run), forget it (0), so that states that differ in it only are one. */
#define FORGET_PROP(c, a) \
  if \
  :: (att[c] != a || st[c] != P1) && !ACQ_PENDING(c, a) -> prop[c * A + a] = 0 \
  :: else -> skip \
  fi

/* Once nothing needs T of attempt a of client c any more, forget it (0), so that states that
 * differ in it only are one. */
#define FORGET_TOK(c, a) \
  if \
  :: (att[c] != a || st[c] != P2) && !CNF_PENDING(c, a) -> tok[c * A + a] = 0 \
  :: else -> skip \
  fi

/* Gives up the current attempt (or the grant): the release it sends is RELEASED (node). */
inline give_up(c) {
  printf("client %d attempt %d: ends (release)\n", c, att[c]);
  okb[c] = 0;
  accb[c] = 0;
  gmax[c] = 0;
#ifdef TIMED
  cdl[c] = 0; rnd[c] = 0; ren[c] = 0;
#endif
  st[c] = IDLE;
  FORGET_TOK(c, att[c]);
  FORGET_PROP(c, att[c]);
  att[c]++
}

#ifdef TIMED
/* Re-arms the lease of lock[k], never shortening it. */
#define REARM(k) ke[k] = MAX(ke[k], L - D)
#ifdef NO_VALIDITY
#define VALID(c) true
#else
#define VALID(c) (cdl[c] > 0)
#endif
#define HOLDS(c) ((st[c] == HOLD || st[c] == RENEWING) && cdl[c] > 0)
#define EXPIRED(k) (ke[k] == 0)
#else
#define EXPIRED(k) true
#define REARM(k) skip
#define VALID(c) true
#endif

/* Mutual exclusion: called whenever a client starts to hold the lock or holds it longer (time
 * passing only ends holds). */
inline check_me() {
#ifdef TIMED
  n = 0; i = 0;
  do
  :: i < C -> if :: HOLDS(i) -> n++ :: else -> skip fi; i++
  :: else -> break
  od;
  assert(n <= 1);
  n = 0; i = 0
#else
  skip
#endif
}

/* The clients are alike, so a run in which client c + 1 starts before client c is the mirror
 * of one in which c starts first: only the latter are explored (symmetry reduction). */
#define STARTED_BEFORE(c) (c == 0 || att[c - 1] > 0 || st[c - 1] != IDLE)

/* Starts attempt att[c] of client c with proposal v: IDLE -> P1, send acquire(owner, v). */
inline start(c, v) {
  prop[c * A + att[c]] = v;
  okb[c] = 0;
  accb[c] = 0;
  low[c] = maxrep;
#ifdef TIMED
  cdl[c] = L - DRIFT;
#endif
  st[c] = P1;
  printf("client %d attempt %d: acquire, P = %d\n", c, att[c], v);
  send_all(c, ACQ)
}

/* Reports the grant of the current attempt of client c with token i (from P1 by the fast path,
 * from P2 after the write-back), checking the properties. */
inline report(c, fast) {
  /* P1: distinct from every reported token, above every token reported before the attempt
   * started. */
  printf("client %d attempt %d: REPORTED, token %d (fast path: %d)\n", c, att[c], i, fast);
#ifndef NOTOKENS
  assert(i > low[c]);
  assert(i < 32 && (seen & (1 << i)) == 0);
#ifdef TIMED
  /* P2: above every token reported before. */
  assert(i > maxrep);
#endif
  seen = seen | (1 << i);
  maxrep = MAX(maxrep, i);
#endif
#ifdef TIMED
#ifdef NO_VALIDITY
  cdl[c] = L - DRIFT;
#endif
  ren[c] = RENEW;
#endif
#ifdef REACH
  nrep++;
  assert(nrep < REACH);
#endif
#ifdef REACH_FAST
  nfast = nfast + fast;
  assert(nfast < REACH_FAST);
#endif
#ifdef TIMED
  okb[c] = 0;
  accb[c] = 0;
  gmax[c] = 0;
  st[c] = HOLD;
  FORGET_TOK(c, att[c]);
  FORGET_PROP(c, att[c]);
  check_me()
#else
  /* untimed, holding changes nothing more: no clock, no renewal, and a release is the same as
   * the lease running out, which may happen at any time */
  give_up(c)
#endif
}

/* The fast path: a majority of grants is counted, and enough of them accepted the proposal. In
 * NOTOKENS runs there are no fences to accept against: the client may take either path. */
#ifdef NOTOKENS
#define FAST(c) true
#define SLOW(c) true
#elif defined(FAST_ON_ONE)
#define FAST(c) (NB(accb[c]) >= 1)
#define SLOW(c) (!FAST(c))
#else
#define FAST(c) (NB(accb[c]) >= Q)
#define SLOW(c) (!FAST(c))
#endif

/* IDLE -> P1 with proposal v, one alternative per value (d_step runs its choices
 * deterministically, so the choice of P is one step per value). */
#define START(v) \
  :: d_step { st[c] == IDLE && att[c] < A && STARTED_BEFORE(c) -> start(c, v) }

/* A client: the state table of the header. */
proctype client(byte c)
{
  byte k, n, i;
end:
  do
  /* IDLE -> P1: start an attempt, with a proposal P in 0 .. PMAX. */
  START(0)
#if PMAX >= 1
  START(1)
#endif
#if PMAX >= 2
  START(2)
#endif
#if PMAX >= 3
  START(3)
#endif
#if PMAX >= 4
  START(4)
#endif
#if PMAX >= 5
  START(5)
#endif
#if PMAX >= 6
  START(6)
#endif
  /* P1 -> HOLD, the fast path: a majority granted in time, and Q of the grants counted accepted
   * P: the grant is reported with token P, no write-back. */
  :: d_step {
       st[c] == P1 && VALID(c) && NB(okb[c]) >= Q && FAST(c) ->
       i = prop[c * A + att[c]];
       report(c, 1);
       i = 0
     }
  /* P1 -> P2: a majority granted in time, fewer than Q accepted P: T := max token (an
   * accepted grant's token is P), confirm on the granting nodes. */
  :: d_step {
       st[c] == P1 && VALID(c) && NB(okb[c]) >= Q && SLOW(c) ->
       tok[c * A + att[c]] = gmax[c];
       gmax[c] = 0;
       do
       :: k < N ->
          if
          :: (okb[c] & (1 << k)) && !down[k] ->
             pend[c * N + k] = pend[c * N + k] | BIT(CNF, att[c])
          :: else -> skip
          fi;
          k++
       :: else -> break
       od;
       k = 0;
       okb[c] = 0;
       accb[c] = 0;
       st[c] = P2;
       printf("client %d attempt %d: T = %d, confirm\n", c, att[c], tok[c * A + att[c]]);
       FORGET_PROP(c, att[c])
     }
  /* P1 or P2 -> IDLE: give up (timeout, no quorum, or just slow). */
  :: d_step { (st[c] == P1 || st[c] == P2) -> give_up(c) }
  /* P2 -> HOLD: a majority confirmed in time: the grant is reported with token T. */
  :: d_step {
       st[c] == P2 && VALID(c) && NB(okb[c]) >= Q ->
       i = tok[c * A + att[c]];
       report(c, 0);
       i = 0
     }
#ifdef TIMED
  /* HOLD -> RENEWING: send extend everywhere. */
  :: d_step {
       st[c] == HOLD && ren[c] > 0 && cdl[c] > 0 ->
       ren[c]--;
       rnd[c] = L - DRIFT;
       okb[c] = 0;
       st[c] = RENEWING;
       send_all(c, EXT)
     }
  /* RENEWING -> HOLD: a majority extended: the deadline moves to s + L - DRIFT. */
  :: d_step {
       st[c] == RENEWING ->
       count_ok(c, n);
       if
       :: n >= Q ->
#ifdef REACH_RENEW
          assert(rnd[c] <= cdl[c]);   /* must fail: a renewal that holds the lock longer */
#endif
          cdl[c] = MAX(cdl[c], rnd[c]); rnd[c] = 0; okb[c] = 0; st[c] = HOLD; check_me()
       :: else -> skip
       fi;
       n = 0
     }
  /* RENEWING -> HOLD: the round failed (replies missing when the client stops waiting). */
  :: d_step { st[c] == RENEWING -> rnd[c] = 0; okb[c] = 0; st[c] = HOLD }
#endif
  /* HOLD or RENEWING -> IDLE: done (or the lock was lost): release. */
  :: d_step { (st[c] == HOLD || st[c] == RENEWING) -> give_up(c) }
  od
}

/* The scripts. Each runs as one step (d_step) on node k, for attempt a of client c; keep says
 * whether its reply reaches the client (if the client still waits for it). */

#define PENDING(kind, a) (a < A && !down[k] && (pend[c * N + k] & BIT(kind, a)))
#define TAKE(kind, a) pend[c * N + k] = pend[c * N + k] & ~BIT(kind, a)

/* Mints a token on node k: max(fence + 1, clock), the clock reading floor + 1 (after a restart
 * the clock is past every token the node stored before; BUMPS move it ahead). */
inline mint(k, t) {
#ifdef NOTOKENS
  t = 1
#else
  t = MAX(fence[k], floor[k]) + 1;
  fence[k] = t
#endif
}

/* Whether node k accepts proposal p: p is above every token it ever stored. With a fence, p
 * above it (the clock is not looked at: the fence is above every token stored, and may be
 * behind the clock); with none (fresh, restarted empty), p at or above the clock, floor + 1,
 * which by restart rule (a) is above every token stored before the restart. P = 0 is below
 * every clock: never accepted (a client whose estimate is far behind). */
#if defined(NOTOKENS)
#define ACCEPTS(k, p) false
#elif defined(ACCEPT_ANY)
/* broken: no check of p against the fence */
#define ACCEPTS(k, p) ((fence[k] > 0 && p > 0) || (fence[k] == 0 && p > floor[k]))
#elif defined(ACCEPT_NO_CLOCK)
/* broken: with no fence, p is taken whatever the clock */
#define ACCEPTS(k, p) ((fence[k] > 0 && p > fence[k]) || (fence[k] == 0 && p > 0))
#else
#define ACCEPTS(k, p) ((fence[k] > 0 && p > fence[k]) || (fence[k] == 0 && p > floor[k]))
#endif

/* The token of a grant on node k for proposal p: p if the node accepts it (the fence becomes
 * p), else minted. acc: whether it is p. */
inline take_or_mint(k, p, t, acc) {
  if
  :: ACCEPTS(k, p) -> fence[k] = p; t = p; acc = 1
  :: else -> mint(k, t); acc = 0
  fi
}

/* acquire.lua, quorum form, with the proposal p of the attempt. */
inline acquire(a, keep) {
  TAKE(ACQ, a);
  p = prop[c * A + a];
  if
  :: lock[k] == 0 ->
     take_or_mint(k, p, t, acc);
     lock[k] = OWNER(c, a);
#ifdef TIMED
     ke[k] = L - D
#endif
  :: lock[k] == OWNER(c, a) ->
     /* ours already: only with REUSE_OWNER (a late grant of an earlier attempt); a request run
      * twice (resent) is not modelled */
     REARM(k);
     if
     :: fence[k] > 0 -> t = fence[k]; acc = (fence[k] == p)
     :: else -> take_or_mint(k, p, t, acc)
     fi
  :: else ->
     t = 0;
#if !defined(NO_CONFIRM_CHECK) && !defined(REUSE_OWNER)
     TAKE(EXT, a);   /* dead: the key will not be ours */
#endif
  fi;
  printf("node %d: acquire of client %d attempt %d, P = %d: token %d, accepted %d, reply kept %d, fence %d\n",
         k, c, a, p, t, acc, keep, fence[k]);
  if
  :: keep && t > 0 && st[c] == P1 && att[c] == a ->
     okb[c] = okb[c] | (1 << k); accb[c] = accb[c] | (acc << k); gmax[c] = MAX(gmax[c], t)
  :: else -> skip
  fi;
  FORGET_PROP(c, a);
  t = 0; p = 0; acc = 0
}

/* confirm.lua: the write-back. */
inline confirm(a, keep) {
  TAKE(CNF, a);
#ifdef NO_CONFIRM_CHECK
  if :: lock[k] != 0 -> REARM(k) :: else -> skip fi;
  t = 1;
#else
  if
  :: lock[k] == OWNER(c, a) -> REARM(k); t = 1
  :: else -> t = 0
  fi;
#endif
#ifndef NO_WRITEBACK
  if :: t == 1 -> fence[k] = MAX(fence[k], tok[c * A + a]) :: else -> skip fi;
#endif
  printf("node %d: confirm of client %d attempt %d, T = %d: %d, fence %d\n", k, c, a,
         tok[c * A + a], t, fence[k]);
  if
  :: keep && t == 1 && st[c] == P2 && att[c] == a -> okb[c] = okb[c] | (1 << k)
  :: else -> skip
  fi;
  FORGET_TOK(c, a);
  t = 0
}

/* extend.lua */
inline extend(a, keep) {
  TAKE(EXT, a);
  if
  :: lock[k] == OWNER(c, a) ->
     REARM(k);
     if
     :: keep && st[c] == RENEWING && att[c] == a -> okb[c] = okb[c] | (1 << k)
     :: else -> skip
     fi
  :: else -> skip
  fi
}


/* Node k runs the requests of client c, pending ones in any order (one connection or several).
 * Every choice is an alternative of its own: which request, reply lost or not. */
#define RUN_ACQ(a) \
  :: d_step { PENDING(ACQ, a) -> acquire(a, true) } \
  :: d_step { PENDING(ACQ, a) -> acquire(a, false) }
/* A lost reply to confirm or extend is not an alternative of its own: the node does the same,
 * and a client that sees fewer replies has no move it lacks when it sees them all (it may give
 * up, or end the round, at any time; a quorum it reaches later it also has then). A lost reply
 * to acquire is one: it changes T and where the confirms go. */
#define RUN_CNF(a) \
  :: d_step { PENDING(CNF, a) -> confirm(a, true) }
#define RUN_EXT(a) \
  :: d_step { PENDING(EXT, a) -> extend(a, true) }

proctype conn(byte c; byte k)
{
  byte t, p;
  bit acc;
end:
  do
  RUN_ACQ(0)
  RUN_ACQ(1)
  RUN_CNF(0)
  RUN_CNF(1)
#ifdef TIMED
  RUN_EXT(0)
  RUN_EXT(1)
#endif
  od
}

/* Whether the attempt that owns lock key o is over: its client sent release (which runs on node
 * k at any later time, or never). With REUSE_OWNER an owner id names every attempt of a client,
 * so a release of an earlier attempt matches the key of the current one. */
#ifdef REUSE_OWNER
#define RELEASED(o) (att[(o) - 1] > 0)
#else
#define RELEASED(o) (att[((o) - 1) / A] > ((o) - 1) % A)
#endif

#ifdef EAGER_RESTART
#define RESTARTABLE(k) true
#else
#define RESTARTABLE(k) (lock[k] == 0)
#endif

/* Node k: its lease running out, crashing, restarting. */
proctype node(byte k)
{
  byte i;
end:
  do
  /* The lease runs out (TIMED: not before ke[k] ticks; else at any time). */
  :: d_step {
       lock[k] != 0 && EXPIRED(k) ->
       printf("node %d: lease of owner %d runs out\n", k, lock[k]);
       KEY_GONE(k);
       lock[k] = 0
#ifdef TIMED
       ; ke[k] = 0
#endif
     }
  /* release.lua of an attempt that is over: compare and delete. */
  :: d_step {
       lock[k] != 0 && !down[k] && RELEASED(lock[k]) ->
       printf("node %d: release of owner %d\n", k, lock[k]);
       KEY_GONE(k);
       lock[k] = 0
#ifdef TIMED
       ; ke[k] = 0
#endif
     }
  /* The clock of the node runs ahead: the next token it mints is one higher than it would have
   * been. The clock moves, not the fence: a node with a fence still accepts a proposal above
   * the fence and below the clock. */
  :: d_step {
       bumps > 0 && !down[k] ->
       bumps--;
       floor[k] = MAX(fence[k], floor[k]) + 1;
       printf("node %d: clock ahead, %d\n", k, floor[k] + 1)
     }
  /* Crash: the requests not yet run are lost. */
  :: d_step {
       !down[k] && crashes > 0 ->
       crashes--;
       printf("node %d: crash\n", k);
       down[k] = true;
       i = 0;
       do
       :: i < C -> pend[i * N + k] = 0; i++
       :: else -> break
       od;
       i = 0
     }
  /* Restart, empty. Restart rule (b): every lease it held ran out, i.e. the lock key would be
   * gone by now anyway. Restart rule (a): its clock is past every token it stored, so the
   * clock floor stands in for the lost counter. */
  :: d_step {
       down[k] && RESTARTABLE(k) ->
#ifdef EAGER_RESTART
       floor[k] = 0;
#else
       floor[k] = MAX(fence[k], floor[k]);
#endif
       fence[k] = 0;
       lock[k] = 0;
       down[k] = false;
       printf("node %d: restarts empty, clock %d\n", k, floor[k] + 1)
     }
  od
}

#ifdef TIMED
/* Time passes: every duration counts down by one tick. Durations are kept relative to now, so
 * runs of any length have finitely many states, and states that differ only by a shift in
 * time are one. */
#define DOWN(x) if :: x > 0 -> x-- :: else -> skip fi
active proctype clock()
{
  byte i;
end:
  do
  :: d_step {
       i = 0;
       do
       :: i < N -> DOWN(ke[i]); i++
       :: else -> break
       od;
       i = 0;
       do
       :: i < C -> DOWN(cdl[i]); DOWN(rnd[i]); i++
       :: else -> break
       od;
       i = 0
     }
  od
}
#endif

init {
  byte c, k;
  atomic {
    assert(A <= 2 && (N == 3 || N == 5) && PMAX <= 6);
#ifdef LEAD
    /* node 0 starts one token ahead of the others, or not (the nodes are symmetric, so one
     * node stands for any) */
    if
    :: fence[0] = 1; printf("node 0: fence 1\n")
#ifndef NOTOKENS
    :: fence[0] = 1; floor[0] = 2; printf("node 0: fence 1, clock 3\n")
#endif
    :: skip
    fi;
#endif
    c = 0;
    do
    :: c < C ->
       run client(c);
       k = 0;
       do
       :: k < N -> run conn(c, k); k++
       :: else -> break
       od;
       c++
    :: else -> break
    od;
    k = 0;
    do
    :: k < N -> run node(k); k++
    :: else -> break
    od;
    c = 0; k = 0
  }
}
