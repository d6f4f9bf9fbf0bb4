/*
 * batcherd's coordination protocol, for spin. docs/MODEL.md maps every step below to
 * the store method or scanner step it stands for; read the two side by side.
 *
 * One repository, NO operations, batches 1..NB (NB = NO + NRETRY: every claim takes at
 * least one operation and an operation waits again only through a requeue), NR
 * replicas. A replica runs its loops one after the other, forever: claim, publish,
 * reconcile, the timeout sweep, the orphan sweep (or those its ROLE allows). It can be
 * killed between any two steps (the Killer process) and starts over with nothing in
 * memory; its reservation's lease can lapse while it works (a freeze).
 *
 * Configurations (scripts/model.sh, docs/MODEL.md) set the bounds with -D flags. Safety
 * runs add -DQUIET: the Quiet process asserts p_fence, p_agree and p_done in every
 * state where nothing can move any more.
 *
 * Granularity: one database transaction = one d_step (atomic, deterministic); one
 * GitLab call = one atomic step (its effect), whose answer may be lost (the caller
 * sees an error after GitLab acted). Everything between two steps can interleave.
 *
 * Mutants (-D flags) each remove one guard; `make model` requires spin to find a
 * counterexample for each (scripts/model.sh lists them with the property they break).
 */

#ifndef NR
#define NR 2
#endif
#ifndef NO
#define NO 2
#endif
#ifndef NRETRY
#define NRETRY 1
#endif
#ifndef KILLS
#define KILLS 1
#endif
#ifndef LOSSES
#define LOSSES 1
#endif
#ifndef HUMAN
#define HUMAN 1
#endif
/* leases that lapse while their holder still works (a replica frozen, or a GitLab call
 * slower than the lease): see "Leases" below */
#ifndef FREEZES
#define FREEZES 0
#endif

/* Roles: which loops each replica runs (bit masks of L_*; all by default). A targeted
 * configuration fixes roles to search one race exhaustively; docs/MODEL.md says why each
 * restriction keeps the race it targets. KILLWHO / FREEZEWHO: replicas the Killer may
 * kill, whose leases may lapse (bit r = replica r). */
#define L_CLAIM  1
#define L_PUB    2
#define L_REC    4
#define L_TMO    8
#define L_OPEN   16               /* orphan sweep: open MRs of inactive batches */
#define L_FAILED 32               /* orphan sweep: FAILED batches whose MR merged */
#define L_ALL    63
#define L_NOT_TMO (L_ALL - L_TMO)
#ifndef ROLE0
#define ROLE0 L_ALL
#endif
#ifndef ROLE1
#define ROLE1 L_ALL
#endif
#ifndef ROLE2
#define ROLE2 L_ALL
#endif
#ifndef KILLWHO
#define KILLWHO 7
#endif
#ifndef FREEZEWHO
#define FREEZEWHO 7
#endif
#define ROLE(x) ((x) == 0 -> ROLE0 : ((x) == 1 -> ROLE1 : ROLE2))
#define DOES(l) ((ROLE(r) & (l)) != 0)

#define NB   (NO + NRETRY)
#define MAXB 3                    /* array sizes: NB <= MAXB */
#define MAXO 3                    /* array sizes: NO <= MAXO */
#define NMAX 7                    /* MRs, foreign included */

/* merge_batch.status (sql/migrations/00001_init.sql); BLOCKED is not modelled */
#define B_NONE 0
#define B_RUN  1
#define B_SUCC 2
#define B_FAIL 3

/* operation.status */
#define O_NEW     0   /* not approved yet */
#define O_QUEUED  1
#define O_INBATCH 2
#define O_MERGED  3
#define O_FAILED  4

/* MR state in GitLab */
#define M_NONE   0
#define M_OPENED 1
#define M_MERGED 2
#define M_CLOSED 3

/* head pipeline */
#define P_RUN  0
#define P_OK   1
#define P_FAIL 2

/* ---------------- database ---------------- */
byte op_st[MAXO];          /* operation.status */
byte op_b[MAXO];           /* operation.batch_id (0 = NULL) */
bit  rq_ex[MAXO];          /* merge_batch_request row exists */
byte rq_b[MAXO];           /* merge_batch_request.batch_id (0 = NULL: waiting) */

byte b_st[MAXB + 1];       /* merge_batch.status */
byte b_mr[MAXB + 1];       /* merge_batch.mr_iid (0 = NULL) */
bit  b_fc[MAXB + 1];       /* merge_batch.fail_class recorded (BatchMarkFailing) */
bit  b_old[MAXB + 1];      /* created_at older than the batch timeout */
byte b_lh[MAXB + 1];       /* a live reservation (next_check_at in the future): holder r + 1; 0 = due */
byte b_mem[MAXB + 1];      /* merge_batch_member: bit o = operation o */
byte nb;                 /* batches created (AUTO_INCREMENT) */

/* ---------------- GitLab ---------------- */
byte m_br[NMAX + 1];     /* source branch: batcherd/<inst>/batch-<m_br> */
bit  m_ours[NMAX + 1];   /* commits carry this installation's trailers for that batch */
byte m_st[NMAX + 1];
bit  m_arm[NMAX + 1];    /* auto-merge armed */
byte m_pipe[NMAX + 1];
byte nm;                 /* MRs created (iid) */

/* ---------------- the repository ---------------- */
bit rhas[MAXO];            /* the target branch holds operation o's change */
bit bmerged[MAXB + 1];     /* an MR of ours for batch b merged */

/* ---------------- replicas ---------------- */
byte hb[NR];             /* batch whose version replica r holds in memory (0 none) */
bit  hv[NR];             /* 1: that version is stale (the row was written since) */
bit  kill[NR];

byte losses = LOSSES;    /* GitLab answers that may still be lost */
byte retries = NRETRY;   /* requeues the failure policy may still plan */
bit  admitted;           /* every operation approved */

/* ---------------- properties ---------------- */
#define active(b) (b_st[b] == B_RUN)
#define done(o)   (op_st[o] == O_MERGED || op_st[o] == O_FAILED)
#define agree(o)  ((op_st[o] == O_MERGED) == rhas[o])
#define fenced(b) (!(b_st[b] == B_FAIL && bmerged[b]))

#if NO == 1
#define alldone  (admitted && done(0))
#define allagree (agree(0))
#elif NO == 2
#define alldone  (admitted && done(0) && done(1))
#define allagree (agree(0) && agree(1))
#else
#define alldone  (admitted && done(0) && done(1) && done(2))
#define allagree (agree(0) && agree(1) && agree(2))
#endif
#define allfenced (fenced(1) && fenced(2) && fenced(3))

/* P4: every approved operation ends merged or failed (no loss, nothing stuck) */
ltl p_done { <> alldone }
/* P3: an MR of a batch merged ⇒ the database does not leave the batch FAILED for good */
ltl p_fence { <> [] allfenced }
/* P5: once quiet, the database and the repository agree, operation by operation */
ltl p_agree { <> [] allagree }

/* I1, I2 after every claim (the only step that makes a batch active) */
inline check_claim() {
	/* I2 first: without the claim guard an operation is in two active batches, which
	 * are two active batches too; checked first, the assertion names the guard's property */
	for (i : 0 .. NO - 1) {
		inb = 0;
		for (j : 1 .. NB) { if :: active(j) && (b_mem[j] & (1 << i)) -> inb++ :: else fi }
		assert(inb <= 1)                     /* I2 */
	}
	i = 0; t = 0;
	for (i : 1 .. NB) { if :: active(i) -> t++ :: else fi }
	assert(t <= 1);                          /* I1 */
	i = 0; j = 0; t = 0; inb = 0
}

/*
 * merge_batch.version. Versions are only ever compared for equality (I6), between the
 * row and a copy a replica read earlier, and a version never comes back (it only
 * grows). So all that matters of a replica's copy is whether the row was written since
 * it was read: hv[r] = 1 (stale) or 0 (current). newver is every write's "version =
 * version + 1": everyone else's copy goes stale, the writer's own stays current.
 */
inline newver(bb) {
	hv[0] = (hb[0] == bb);
	if :: NR > 1 -> hv[1 % NR] = (hb[1 % NR] == bb) :: else fi;
	if :: NR > 2 -> hv[2 % NR] = (hb[2 % NR] == bb) :: else fi;
	hv[r] = 0
}

#ifdef NO_VERSION_GUARD
#define vguard(bb) true
#else
#define vguard(bb) (hb[r] == bb && !hv[r])
#endif

/* a GitLab answer is lost: GitLab acted, the caller sees an error */
inline lose() {
	if
	:: losses > 0 -> losses--; err = 1
	:: true
	fi
}

/* Fencing, as batcherd arms merges: GitLab's auto-merge merges an MR of ours only while
 * its batch is active. (A human may merge anything at any time: merged wins follows.) */
#define FENCED_ARM(mm) assert(!m_ours[mm] || active(m_br[mm]))

/* GitLab merges m: the repository gets the files of m's batch when the MR is ours */
inline gl_merge(mm) {
	m_st[mm] = M_MERGED; m_arm[mm] = 0;
	if
	:: m_ours[mm] ->
		bmerged[m_br[mm]] = 1;
		for (j : 0 .. NO - 1) { if :: b_mem[m_br[mm]] & (1 << j) -> rhas[j] = 1 :: else fi };
		j = 0
	:: else
	fi
}

#ifdef ADOPT_ANY
#define mine(mm) true
#else
#define mine(mm) m_ours[mm]
#endif

/* mr.Client.FindMR: the branch's MR in any state, merged > opened > closed, newest
 * first; only MRs carrying our trailers (installation identity) unless ADOPT_ANY. */
inline find_body(bb, anyone) {
	m = 0; ms = M_NONE; found = 0; t = 0;
	for (i : 1 .. nm) {
		if
		:: m_br[i] == bb && (anyone || mine(i)) ->
			if
			:: m_st[i] == M_MERGED -> j = 3
			:: m_st[i] == M_OPENED -> j = 2
			:: else -> j = 1
			fi;
			if
			:: j > t -> t = j; m = i   /* newest first among equals: i ascends, so strictly greater */
			:: else
			fi
		:: else
		fi
	};
	if :: m != 0 -> found = 1; ms = m_st[m] :: else fi;
	i = 0; j = 0; t = 0
}
inline find_mr(bb, anyone) {
	d_step { find_body(bb, anyone) }
}

/* GetMR: the state, and (for reconcile) whether the open MR's pipeline failed (pipe
 * = 1) or it is not armed yet (pipe = 2) */
#define GET_BODY(mm) ms = m_st[mm]; \
	if :: m_st[mm] == M_OPENED && m_pipe[mm] == P_FAIL -> pipe = 1 \
	   :: m_st[mm] == M_OPENED && m_pipe[mm] != P_FAIL && !m_arm[mm] -> pipe = 2 \
	   :: else -> pipe = 0 fi
inline get_mr(mm) {
	d_step { GET_BODY(mm); pipe = 0 }
}

/* mr.Client.CloseMR: a merged MR stays merged; the answer is the MR's state */
inline close_mr(mm) {
	atomic {
		if :: m_st[mm] == M_OPENED -> m_st[mm] = M_CLOSED; m_arm[mm] = 0 :: else fi;
		ms = m_st[mm];
		lose()
	}
}

/* mr.Client.SetAutoMerge(iid, sha): merges at once when the pipeline already
 * succeeded, arms it while it runs, is refused otherwise */
inline set_auto_merge(mm) {
	atomic {
		if
		:: m_st[mm] == M_OPENED && m_pipe[mm] == P_OK -> FENCED_ARM(mm); gl_merge(mm)
		:: m_st[mm] == M_OPENED && m_pipe[mm] == P_RUN -> m_arm[mm] = 1
		:: else -> err = 1
		fi;
		ms = m_st[mm];
		lose()
	}
}

/* ---------------- leases ---------------- */
/* BatchReserve pushes next_check_at past a lease: the batch is not due (BatchesDue, and
 * BatchesTimedOut for a batch without an MR) until the lease lapses. The model has no
 * clock; it keeps who holds a live reservation (b_lh) and lets it lapse when its holder's
 * item ends (publish's BatchMarkDue, or the lease running out after the item) or the
 * holder is killed, and — up to FREEZES times — while its holder is still in the item
 * (frozen, or waiting on GitLab, for longer than the lease). LAPSE_ANYTIME: every
 * reservation may lapse at any moment (unbounded freezes: the batch is always due). */
#ifdef LAPSE_ANYTIME
#define DUE(k) true
#define HOLD(k) skip
#else
#define DUE(k) (b_lh[k] == 0)
#define HOLD(k) b_lh[k] = r + 1
#endif
inline release() {
	d_step {
		for (i : 1 .. NB) { if :: b_lh[i] == r + 1 -> b_lh[i] = 0 :: else fi };
		i = 0
	}
}

/* ---------------- store methods (one transaction each) ---------------- */

/* BatchReserve: next_check_at = now + lease, guarded on version and an active status */
inline reserve_body(bb) {
	if
	:: active(bb) && vguard(bb) -> newver(bb); HOLD(bb); mrr = b_mr[bb]; fc = b_fc[bb]
	:: else -> err = 1
	fi
}

/* BatchRecordMR: guarded on RUNNING and version (fencing: before any merge is armed) */
inline record_mr(bb, mm) {
	d_step {
		if
		:: b_st[bb] == B_RUN && vguard(bb) -> b_mr[bb] = mm; newver(bb)
		:: else -> err = 1
		fi
	}
}

/* BatchMarkFailing: the class goes on record before the close */
inline mark_failing(bb) {
	d_step {
		if
		:: active(bb) && vguard(bb) -> b_fc[bb] = 1; newver(bb)
		:: else -> err = 1
		fi
	}
}

/* BatchSettleSucceeded (from RUNNING, or from FAILED: merged wins) */
inline settle_succeeded(bb, from) {
	d_step {
		if
		:: b_st[bb] == from && vguard(bb) ->
			b_st[bb] = B_SUCC; newver(bb);
			assert(b_mr[bb] != 0);         /* a SUCCEEDED batch names its MR (verify) */
			for (j : 0 .. NO - 1) {
				if
				:: op_b[j] == bb && ((from == B_FAIL && op_st[j] == O_FAILED) ||
				                     (from != B_FAIL && op_st[j] == O_INBATCH)) ->
					op_st[j] = O_MERGED;
					assert(rhas[j])        /* no false merge */
				:: else
				fi
			};
			j = 0
		:: else -> err = 1
		fi
	}
}

/* BatchSettleRequeue: batch guard first, then the members (fail, or back to the
 * waiting set when the policy planned a retry), failed members' waiting rows deleted */
inline settle_failed(bb, from, requeue) {
	d_step {
		if
		:: b_st[bb] == from && vguard(bb) ->
			b_st[bb] = B_FAIL; newver(bb);
			if :: requeue -> retries-- :: else fi;
			for (j : 0 .. NO - 1) {
				if
				:: op_b[j] == bb && op_st[j] == O_INBATCH ->
					if
					:: requeue -> op_st[j] = O_QUEUED; op_b[j] = 0; rq_b[j] = 0
					:: else -> op_st[j] = O_FAILED; rq_ex[j] = 0; rq_b[j] = 0
					fi
				:: else
				fi
			};
			j = 0
		:: else -> err = 1
		fi
	}
}

/* BatchRecordMRFailed: an MR found by branch recorded on a FAILED batch */
inline record_mr_failed(bb, mm) {
	d_step {
		if
		:: b_st[bb] == B_FAIL && b_mr[bb] == 0 && vguard(bb) -> b_mr[bb] = mm; newver(bb)
		:: else -> err = 1
		fi
	}
}

/* ---------------- scanner steps ---------------- */

/* Scanner.mergedAfterFailed: merged wins */
inline merged_after_failed(bb, mm, recorded) {
	if
	:: !recorded -> record_mr_failed(bb, mm)
	:: else
	fi;
	if
	:: !err -> settle_succeeded(bb, B_FAIL)
	:: else
	fi
}

/* Scanner.settleFailure(b, class): b was just reserved (st, mrr, fc, hv[r]) */
/* its first step: the MR by the recorded iid, else by the deterministic branch */
#define SF_LOOKUP(bb) \
	if \
	:: mrr != 0 -> m = mrr; found = 1; GET_BODY(m) \
	:: else -> find_body(bb, false) \
	fi

inline settle_failure(bb) {
	d_step { found = 0; SF_LOOKUP(bb) };
	settle_failure_rest(bb)
}

inline settle_failure_rest(bb) {
	if
	:: found ->
		if
		:: ms == M_OPENED ->
			if :: !fc -> mark_failing(bb) :: else -> fc = 0 fi;
			if :: !err -> close_mr(m) :: else fi
		:: else
		fi;
#ifndef NO_REREAD
		/* re-read after closing, never trust the close's answer alone: merged wins */
		if :: !err -> get_mr(m) :: else fi;
#else
		if :: !err && ms == M_MERGED -> ms = M_CLOSED :: else fi;
#endif
		if
		:: !err && ms == M_MERGED ->
			if
			:: mrr == 0 -> record_mr(bb, m)
			:: else
			fi;
			if :: !err -> settle_succeeded(bb, B_RUN) :: else fi;
			found = 2                                /* settled, one way or the other */
		:: !err && ms == M_OPENED -> err = 1         /* still open: try again later */
		:: else
		fi
	:: else
	fi;
	if
	:: !err && found != 2 ->
		/* the failure policy plans from BatchWaitingMembers: retry, or fail */
		if
		:: retries > 0 -> settle_failed(bb, B_RUN, 1)
		:: true -> settle_failed(bb, B_RUN, 0)
		fi
	:: else
	fi
}

/* one pass of the claim loop: BatchClaim */
inline claim() {
#ifndef NO_SLOT
	d_step {
		t = 0;
		for (i : 1 .. NB) { if :: active(i) -> t = 1 :: else fi };
		if
		:: t == 0 ->                                      /* the slot INSERT succeeded */
			t = 0;
			for (i : 0 .. NO - 1) { if :: rq_ex[i] && rq_b[i] == 0 -> t = t | (1 << i) :: else fi };
			if
			:: t != 0 ->
				assert(nb < NB);
				nb++;
				b_st[nb] = B_RUN; b_mem[nb] = t;
				for (i : 0 .. NO - 1) {
					if :: t & (1 << i) -> rq_b[i] = nb; op_st[i] = O_INBATCH; op_b[i] = nb :: else fi
				}
			:: else                                       /* nothing_to_claim: rolled back */
			fi
		:: else                                           /* slot_occupied */
		fi;
		check_claim()
	}
#else
	/* mutant: no unique slot. The transaction's statements then interleave with other
	 * claims at READ COMMITTED: read the waiting rows, later the guarded UPDATE. */
	d_step {
		cl = 0;
		for (i : 0 .. NO - 1) { if :: rq_ex[i] && rq_b[i] == 0 -> cl = cl | (1 << i) :: else fi };
		i = 0
	}
	d_step {
		t = 0;
#ifndef NO_CLAIM_GUARD
		/* UPDATE … WHERE batch_id IS NULL AND id IN (…); affected ≠ read → roll back */
		for (i : 0 .. NO - 1) { if :: (cl & (1 << i)) && !(rq_ex[i] && rq_b[i] == 0) -> t = 1 :: else fi };
#endif
		if
		:: cl != 0 && t == 0 && nb < NB ->
			nb++;
			b_st[nb] = B_RUN; b_mem[nb] = cl;
			for (i : 0 .. NO - 1) {
				if :: cl & (1 << i) -> rq_b[i] = nb; op_st[i] = O_INBATCH; op_b[i] = nb :: else fi
			}
		:: else
		fi;
		cl = 0; t = 0;
		check_claim()
	}
#endif
}

/* Every item starts with the fetch → tryLock of its loop: the fetch (BatchesDue,
 * BatchesTimedOut, …) reads candidates without locks, BatchReserve then takes one with
 * a write guarded on the version the fetch read. The model does both in one step: a
 * reserve that would lose to a write between the two does nothing, which is the same
 * as not having fetched the batch. The step is a guard: it is enabled only when there
 * is a candidate (a pass that finds nothing changes nothing). */
#define FORGET \
	err = 0; found = 0; m = 0; ms = 0; st = 0; mrr = 0; fc = 0; pipe = 0; \
	hb[r] = 0; hv[r] = 0

#define ANYB(C) (C(1) || C(2) || C(3))
#define ANYM(C) (C(1) || C(2) || C(3) || C(4) || C(5) || C(6) || C(7))

#define FETCH_RESERVE(L, CAND, READ) \
	d_step { \
		DOES(L) && ANYB(CAND) -> \
		FORGET; \
		hb[r] = 1; \
		do :: !CAND(hb[r]) -> hb[r]++ :: else -> break od; \
		newver(hb[r]); HOLD(hb[r]); \
		mrr = b_mr[hb[r]]; fc = b_fc[hb[r]]; \
		READ \
	}
/* The GitLab read that follows a reserve is part of the reserve's step: between the
 * two, nothing another process does in GitLab depends on the reserve (it only makes
 * other replicas' guarded writes lose, and those do not reach GitLab), so such events
 * commute to before the reserve. */

/* publish: RUNNING, no MR, not past the timeout (publishLoop.runOnce) */
#define PUB_CAND(k) (b_st[k] == B_RUN && b_mr[k] == 0 && !b_old[k] && DUE(k))
/* reconcile: active, MR recorded; a poll that would find nothing to do (open, armed,
 * pipeline not failed) is left out: it only bumps the version */
#define REC_CAND(k) (active(k) && b_mr[k] != 0 && DUE(k) && \
	!(m_st[b_mr[k]] == M_OPENED && m_arm[b_mr[k]] && m_pipe[b_mr[k]] != P_FAIL))
/* timeout sweep: qBatchesTimedOut (active, older than the timeout; one without an MR
 * only once its publish reservation lapsed; one with an MR whatever its reservation) */
#ifdef NO_LAPSE_TIMEOUT
/* mutant: only batches with a recorded MR time out */
#define TMO_CAND(k) (active(k) && b_old[k] && b_mr[k] != 0)
#else
#define TMO_CAND(k) (active(k) && b_old[k] && (b_mr[k] != 0 || DUE(k)))
#endif

/* publishLoop.publish for the reserved batch bb */
inline publish(bb) {
	/* FindMR (in the fetch step) */
#ifndef ADOPT_ANY
	if
	:: found && !m_ours[m] ->
		/* installation identity: a foreign MR on the branch is never adopted; the
		 * batch fails naming it */
		settle_failure(bb); err = 1
	:: else
	fi;
#endif
	if
	:: !err && (!found || ms == M_OPENED) ->
		/* EnsureBranch + CommitFiles: idempotent by branch and trailer, no state the
		 * protocol reads; then renew the reservation before the MR exists */
		/* the renewal, and EnsureMR's FindMR (a GitLab read right after a reserve:
		 * one step, see FETCH_RESERVE) */
		d_step {
			reserve_body(bb);
			if :: !err -> find_body(bb, false) :: else fi
		}
		if
		:: !err ->
			/* EnsureMR: create when FindMR found none (GitLab refuses a second open
			 * MR for a branch: 409, and the client reads again) */
			if
			:: !found ->
				atomic {
					t = 0;
					for (i : 1 .. nm) { if :: m_br[i] == bb && m_st[i] == M_OPENED -> t = i :: else fi };
					i = 0;
					if
					:: t != 0 && mine(t) -> m = t; ms = M_OPENED; found = 1
					:: t != 0 -> err = 1
					:: else ->
						assert(nm < NMAX);
						nm++; m_br[nm] = bb; m_ours[nm] = 1; m_st[nm] = M_OPENED;
						m = nm; ms = M_OPENED; found = 1
					fi;
					t = 0;
					lose()
				}
			:: else
			fi
		:: else
		fi
	:: else
	fi;
	if
	:: !err ->
#ifdef NO_FENCE_RECORD
		/* mutant: arm the merge before the fencing record */
		if :: ms == M_OPENED -> set_auto_merge(m); err = 0 :: else fi;
#endif
		record_mr(bb, m);
		if
		:: !err ->
#ifndef NO_FENCE_RECORD
			if :: ms == M_OPENED -> set_auto_merge(m); err = 0 :: else fi;
#endif
			/* BatchMarkDue: the item's end (release(), in the replica) makes it due */
		:: else ->
			/* lostRecord: BatchGet; a FAILED batch's MR must not stay open */
			d_step { err = 0; st = b_st[bb]; mrr = b_mr[bb]; hv[r] = 0 }
			if
			:: st == B_FAIL ->
				if :: ms == M_OPENED -> close_mr(m) :: else fi;
				/* merged wins; the MR is recorded first when the row has none */
#ifdef LOST_RECORD_IN_MEMORY
				/* mutant, the code before the model's fourth finding: the MR was set on
				 * the batch in memory only, so it was taken as recorded */
				if :: !err && ms == M_MERGED -> merged_after_failed(bb, m, true) :: else fi
#else
				if :: !err && ms == M_MERGED -> merged_after_failed(bb, m, mrr != 0) :: else fi
#endif
			:: else
			fi
		fi
	:: else
	fi
}

/* reconcileLoop.reconcile for the reserved batch bb */
inline reconcile(bb) {
	/* GetMR (in the fetch step) */
	if
	:: ms == M_MERGED -> settle_succeeded(bb, B_RUN)
	:: ms == M_CLOSED -> settle_failure(bb)                   /* closed_by_user / resumed */
	:: ms == M_OPENED && pipe == 1 -> settle_failure(bb) /* isolate */
	:: ms == M_OPENED && pipe == 2 ->
		set_auto_merge(m);
		if :: !err && ms == M_MERGED -> settle_succeeded(bb, B_RUN) :: else fi
	:: else
	fi
}

/* orphanLoop.sweepOpen: an open labelled MR of ours whose batch is not active */
#define ORPH_CAND(k) (m_st[k] == M_OPENED && mine(k) && !active(m_br[k]))

/* orphanLoop.sweepFailed: a FAILED batch whose MR merged: the recorded one, or, with
 * none recorded, one of ours found by the batch's branch */
#define OM(k, i) (m_br[i] == k && mine(i) && m_st[i] == M_MERGED)
#define OURS_MERGED_ON(k) (OM(k, 1) || OM(k, 2) || OM(k, 3) || OM(k, 4) || OM(k, 5) || OM(k, 6) || OM(k, 7))
#if defined(NO_UNRECORDED_SWEEP)
/* mutant, the code before the model's first finding: only batches with a recorded MR
 * were re-read, by that MR */
#define FAILED_MERGED(k) (b_st[k] == B_FAIL && b_mr[k] != 0 && m_st[b_mr[k]] == M_MERGED)
#elif defined(RECORDED_FIRST)
/* mutant, the code before the model's third finding: the recorded MR when there is one,
 * the branch only when none is recorded */
#define FAILED_MERGED(k) (b_st[k] == B_FAIL && \
	((b_mr[k] != 0 && m_st[b_mr[k]] == M_MERGED) || (b_mr[k] == 0 && OURS_MERGED_ON(k))))
#else
/* any MR of ours on the batch's branch (FindMR: merged first), recorded or not: a
 * publisher whose lease lapsed inside EnsureMR can open a second MR after the first
 * was recorded and closed (docs/MODEL.md, Findings) */
#define FAILED_MERGED(k) (b_st[k] == B_FAIL && OURS_MERGED_ON(k))
#endif

/* claim: the precheck (something waiting, the slot free); a claim that would answer
 * slot_occupied or nothing_to_claim changes nothing */
#define WAITING(k) (rq_ex[k] && rq_b[k] == 0)
#ifndef NO_SLOT
#define CLAIM_GUARD (!active(1) && !active(2) && !active(3) && (WAITING(0) || WAITING(1) || WAITING(2)))
#else
#define CLAIM_GUARD (nb < NB && (WAITING(0) || WAITING(1) || WAITING(2)))
#endif

/* A replica: one item of one of its loops at a time, any of them whose fetch finds
 * a candidate. (Real replicas run the loops concurrently; several replica processes
 * cover those interleavings.) Killed between any two steps, it restarts with nothing
 * in memory. */
proctype Replica(byte r) {
	byte i, j, t, m, ms, st, mrr, pipe, cl, found, inb;
	bit err, fc;
end:	do
	:: {
		if
		:: DOES(L_CLAIM) && CLAIM_GUARD -> claim()
		:: FETCH_RESERVE(L_PUB, PUB_CAND, find_body(hb[r], true)); publish(hb[r]); release()
		:: FETCH_RESERVE(L_REC, REC_CAND, m = mrr; GET_BODY(m)); reconcile(hb[r]); release()
		:: FETCH_RESERVE(L_TMO, TMO_CAND, SF_LOOKUP(hb[r])); settle_failure_rest(hb[r]); release()
		:: d_step {
			/* sweepOpen: ListOpenLabeled, then BatchGet of the branch's batch */
			DOES(L_OPEN) && ANYM(ORPH_CAND) ->
			FORGET;
			m = 1;
			do :: !ORPH_CAND(m) -> m++ :: else -> break od;
			hb[r] = m_br[m]; st = b_st[hb[r]]; mrr = b_mr[hb[r]]; hv[r] = 0
		   };
		   close_mr(m);
		   if
		   :: !err && ms == M_MERGED && st == B_FAIL -> merged_after_failed(hb[r], m, mrr != 0)
		   :: else
		   fi
#ifndef NO_MERGED_WINS
		:: d_step {
			/* sweepFailed: BatchesFailedRecently, then GetMR (recorded) or FindMR (by
			 * branch): merged → merged wins (a read that finds it not merged changes
			 * nothing, so it is not a step) */
			DOES(L_FAILED) && ANYB(FAILED_MERGED) ->
			FORGET;
			hb[r] = 1;
			do :: !FAILED_MERGED(hb[r]) -> hb[r]++ :: else -> break od;
			hv[r] = 0; mrr = b_mr[hb[r]];
#if defined(NO_UNRECORDED_SWEEP) || defined(RECORDED_FIRST)
			if :: mrr != 0 -> m = mrr :: else -> find_body(hb[r], false) fi
#else
			find_body(hb[r], false)
#endif
		   };
		   merged_after_failed(hb[r], m, mrr != 0)
#endif
		fi
	   } unless {
		kill[r] -> d_step {
			kill[r] = 0; FORGET; j = 0; t = 0; cl = 0;
			/* its reservations lapse (a lease later; nothing of the dead process renews them) */
			for (i : 1 .. NB) { if :: b_lh[i] == r + 1 -> b_lh[i] = 0 :: else fi };
			i = 0
		}
	   }
	od
}

/* approvals: each operation enters the waiting set (Admit, with the operation queued) */
proctype Admitter() {
	byte o;
	for (o : 0 .. NO - 1) {
		d_step { op_st[o] = O_QUEUED; rq_ex[o] = 1; rq_b[o] = 0 }
	};
	admitted = 1
}

/* GitLab itself: pipelines finish; an armed MR whose pipeline succeeded merges; a
 * failed pipeline disarms auto-merge. One guarded option per MR, so weak fairness
 * means "every enabled GitLab action eventually happens". */
#define GL(k) \
	:: atomic { m_st[k] == M_OPENED && m_pipe[k] == P_RUN -> \
		if :: m_pipe[k] = P_OK :: m_pipe[k] = P_FAIL; m_arm[k] = 0 fi } \
	:: atomic { m_st[k] == M_OPENED && m_arm[k] && m_pipe[k] == P_OK -> FENCED_ARM(k); gl_merge(k) }
proctype GitLab() {
	byte j;
end:	do
	GL(1) GL(2) GL(3) GL(4) GL(5) GL(6) GL(7)
	od
}

/* a human merges or closes any open MR, at any time, or never (retires). The guard is
 * inside the atomic step: the MR is open when the human's merge or close lands (an MR
 * GitLab merged in between cannot be closed). */
#define HU(k) \
	:: atomic { h > 0 && m_st[k] == M_OPENED -> h--; if :: gl_merge(k) :: m_st[k] = M_CLOSED; m_arm[k] = 0 fi }
proctype Human() {
	byte h = HUMAN, j;
	do
	HU(1) HU(2) HU(3) HU(4) HU(5) HU(6) HU(7)
	:: break
	od
}

/* time: a batch grows older than the timeout, once, at any time. (Leases are above:
 * a reservation lapses at its holder's item end, its holder's death, or a freeze.) */
#define AG(k) :: d_step { active(k) && !b_old[k] -> b_old[k] = 1 }
proctype Aging() {
end:	do AG(1) AG(2) AG(3) od
}

/* crashes: kill -9 of a replica between any two of its steps, then a restart; and
 * freezes: a live reservation lapses while its holder is still in its item. The killer
 * may stop at any time. */
#define FR(k) :: f > 0 && b_lh[k] != 0 && (FREEZEWHO & (1 << (b_lh[k] - 1))) -> f--; b_lh[k] = 0
proctype Killer() {
	byte k = KILLS, f = FREEZES;
	do
	:: (KILLWHO & 1) && k > 0 && !kill[0] -> k--; kill[0] = 1
	:: (KILLWHO & 2) && NR > 1 && k > 0 && !kill[1 % NR] -> k--; kill[1 % NR] = 1
	:: (KILLWHO & 4) && NR > 2 && k > 0 && !kill[2 % NR] -> k--; kill[2 % NR] = 1
	FR(1) FR(2) FR(3)
	:: break
	od
}

#ifdef QUIET
/* Once nothing can move any more (every replica idle, GitLab, the human and the killer
 * done), the properties that p_done, p_agree and p_fence ask for eventually must hold:
 * a quiet state is where an execution stays for ever. A safety search checks them in
 * every quiet state it reaches; the LTL runs check them on every fair infinite run. */
proctype Quiet() {
	timeout -> assert(allfenced); assert(allagree); assert(alldone)
}
#endif

init {
	byte k;
	atomic {
#ifndef NO_FOREIGN
		/* another installation's MR on batch 1's branch: none, merged long ago, or open */
		if
		:: skip
		:: nm = 1; m_br[1] = 1; m_ours[1] = 0; m_st[1] = M_MERGED; m_pipe[1] = P_OK
		:: nm = 1; m_br[1] = 1; m_ours[1] = 0; m_st[1] = M_OPENED; m_pipe[1] = P_OK
		fi;
#endif
		run Admitter();
		run GitLab();
		run Human();
		run Aging();
		run Killer();
#ifdef QUIET
		run Quiet();
#endif
		for (k : 0 .. NR - 1) { run Replica(k) }
	}
}
