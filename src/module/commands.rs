//! The LEASE.* command handlers: parse the arguments (`lease::args`), read
//! the key, ask the core what the command does (`lease::ops`: the answer,
//! the effects, what the waiters need), commit the effects through the one
//! commit path (`commit.rs`), then do what the waiters need. The internal
//! effect commands read their effect (`lease::effect`) and commit it the
//! same way.

use crate::lease::args::{self, FenceArgs, check_owner, parse_acquire_options_with, parse_ttl};
use crate::lease::effect::{self, Announce, Effect};
use crate::lease::multikey::MultiOutcome;
use crate::lease::ops::{self, AcquireRequest, Answer, Commit, Commits, Env, Event, Outcome};
use crate::lease::ops::{Snapshot, Then};
use crate::lease::{LeaseError, RecordRef};
use crate::lease::{decide, multikey};

use super::commit::{KeyWriter, Reader};
use super::counters::STATS;
use super::ffi::blocked;
use super::ffi::ctx::{Args, Ctx, Str};
use super::ffi::replicate::ClientArg;
use super::ffi::reply::{Field, Reply};
use super::ffi::server::{decision_ms, decision_ms_given, now_ms};
use super::{compat, early, grace, guards, settings, tokens, waiters};

/// Where the commands that carry an owner id have it. The id is a
/// credential: the entry points redact it from SLOWLOG and MONITOR once the
/// handler is done (after replication took its copy: on Valkey 8.1 the
/// redaction replaces the argument itself).
pub const OWNER_ARG: usize = 2;

/// The exclusive lease stored in a record, if that is what it is.
fn exclusive(record: Option<RecordRef<'_>>) -> Option<&crate::lease::Lease> {
    match record {
        Some(RecordRef::Exclusive(l)) => Some(l),
        _ => None,
    }
}

/// If the server expired `name` within its lease's deadline millisecond
/// (Redis 8.2), the deadline; one load when it did not.
#[inline]
fn ended_early(ctx: Ctx, name: Str) -> Option<i64> {
    early::any_ended_early()
        .then(|| early::ended_early(ctx.selected_db(), name.bytes()))
        .flatten()
}

/// The reply an answer is.
#[inline(always)]
fn reply(answer: Answer) -> Reply {
    match answer {
        Answer::Token(t) => Reply::Int(t as i64),
        Answer::Int(n) => Reply::Int(n),
        Answer::Null => Reply::Null,
        Answer::Ok => Reply::Ok,
    }
}

/// Commits an outcome's effects, counts a refusal answered at once, does
/// what the key's waiters need, and turns the answer into a reply.
/// `server`: the command's snapshot (a hand-off decides on it too), built
/// only when something follows that reads it (not on the hot path of a
/// renewal or a release that nobody waits for).
#[inline(always)]
fn finish(
    ctx: Ctx,
    w: &mut KeyWriter,
    out: &Outcome<Commits<'_>>,
    wait: Option<waiters::Want<'_>>,
    server: impl FnOnce() -> Snapshot,
) -> Reply {
    for c in out.commits.iter_ref() {
        w.commit(c);
    }
    if let Some(c) = out.count {
        STATS.count(c);
    }
    let name = w.name();
    match out.then {
        Then::Nothing => {}
        Then::Wait(recheck_at) => {
            if let Some(want) = wait {
                let slot = (ctx.selected_db(), name.bytes().to_vec());
                return waiters::block(ctx, slot, want, recheck_at);
            }
        }
        Then::RecheckAt(at) => waiters::lease_ends_at(ctx, name, at),
        Then::Rearm => {
            let (now, expire) = (server().now_ms, w.expire_at());
            if let Ok(Some(end)) = w.held(now).map(|h| h.next_end(expire, now)) {
                waiters::lease_ends_at(ctx, name, end);
            }
        }
        Then::Serve => {
            if let Some(slot) = waiters::slot_if_waiting(ctx, name) {
                waiters::serve(&slot, w, server());
            }
        }
    }
    reply(out.answer)
}

/// LEASE.ACQUIRE key owner ttl-ms [LIMIT n | SHARED] [FLOOR token] [LABEL text] [BLOCK timeout-ms]
pub fn acquire(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() < 4 {
        return Err(LeaseError::Arity("lease.acquire"));
    }
    compat::check()?;
    let owner = check_owner(a.bytes(2))?;
    let ttl = parse_ttl(a.bytes(3), settings::max_ttl_ms())?;
    let opts = if a.len() > 4 {
        parse_acquire_options_with(
            a.len() - 4,
            #[inline(always)]
            |i| a.bytes(4 + i),
        )?
    } else {
        args::AcquireOptions::default()
    };
    let name = a.str(1);
    let mut w = KeyWriter::for_command(ctx, name, Some(ClientArg::new(a.str(OWNER_ARG), owner)));
    // `LABEL text` alone: the label is the last argument, replicated as
    // that string.
    if a.len() == 6
        && let Some(label) = opts.label
    {
        w.set_label_arg(ClientArg::new(a.str(5), label));
    }
    let server = waiters::snapshot(ctx);
    let now = server.now_ms;
    // A free lease (or a free place of a counting or shared lease) with
    // clients queued goes to the oldest of them first: a newcomer never
    // overtakes a waiter. (No waiter lookup while nobody waits anywhere.)
    let mut waiters_ahead = false;
    if let Some(slot) = waiters::slot_if_waiting(ctx, name) {
        if ops::serve_first(w.record()?, now) && waiters::waiting(&slot) > 0 {
            waiters::serve(&slot, &mut w, server);
        }
        waiters_ahead = waiters::waiting(&slot) > 0;
    }
    let may_wait = opts.block_ms.is_some() && blocked::may_block(ctx);
    let floor = match opts.floor {
        Some(_) => decide::check_floor(opts.floor, now, grace::length_ms())?,
        None => 0,
    };
    let req = AcquireRequest {
        owner,
        ttl_ms: ttl,
        mode: opts.mode,
        floor,
        may_wait,
        label: opts.label,
    };
    let early = ended_early(ctx, name);
    // The key's expiry matters only to a wait (when to re-check).
    let expire = if may_wait { w.expire_at() } else { None };
    let out = tokens::with_clock(|clock| {
        let record = w.record()?;
        ops::acquire(
            record,
            || expire,
            req,
            Env {
                server,
                clock,
                waiters_ahead,
                ended_early: early,
            },
        )
    })?;
    let wait = opts.block_ms.map(|timeout_ms| waiters::Want {
        owner,
        mode: opts.mode,
        ttl_ms: ttl,
        timeout_ms,
        floor,
        label: opts.label,
    });
    Ok(finish(ctx, &mut w, &out, wait, || server))
}

/// The keys of a multi-key command (`numkeys` at 1, the keys after it) and
/// where its owner is; `after`: how many arguments follow the keys (owner,
/// ttl-ms), at least, or exactly when `exact` (no options). The keys are
/// distinct.
fn multikey_args<'a>(
    a: &Args<'a>,
    after: usize,
    exact: bool,
) -> Result<(Vec<&'a [u8]>, usize), LeaseError> {
    let given = a.len().saturating_sub(2 + after);
    let n = args::parse_numkeys(a.bytes(1), given)?;
    if exact && n != given {
        return Err(LeaseError::NumKeys { numkeys: n, given });
    }
    let keys: Vec<&[u8]> = (2..2 + n).map(|i| a.bytes(i)).collect();
    args::check_distinct(&keys)?;
    Ok((keys, 2 + n))
}

/// Opens every key of a multi-key command; WRONGTYPE when one holds
/// another type (before anything else is decided).
fn open_keys(
    ctx: Ctx,
    a: &Args,
    n: usize,
    owner_arg: ClientArg,
) -> Result<Vec<KeyWriter>, LeaseError> {
    let mut ws: Vec<KeyWriter> = (0..n)
        .map(|i| KeyWriter::for_command_key(ctx, a.str(2 + i), Some(owner_arg)))
        .collect();
    for w in &mut ws {
        w.record()?;
    }
    Ok(ws)
}

/// The state of every key for `owner` at `now` (no key is waited for).
fn states_of(
    ws: &mut [KeyWriter],
    owner: &[u8],
    now: i64,
) -> Result<Vec<multikey::KeyState>, LeaseError> {
    ws.iter_mut()
        .map(|w| Ok(multikey::key_state(w.record()?, owner, false, now)))
        .collect()
}

/// Commits a multi-key outcome's effects key by key, counts a refusal
/// answered at once, and does what the keys' waiters need (but a wait).
fn finish_multikey(
    ctx: Ctx,
    ws: &mut [KeyWriter],
    out: &MultiOutcome<'_>,
    server: Snapshot,
) -> Reply {
    for (i, c) in &out.commits {
        ws[*i].commit(c);
    }
    if let Some(c) = out.count {
        STATS.count(c);
    }
    match out.then {
        Then::Nothing | Then::Wait(_) | Then::Rearm => {}
        Then::RecheckAt(at) => {
            for w in ws.iter() {
                waiters::lease_ends_at(ctx, w.name(), at);
            }
        }
        Then::Serve => {
            for w in ws.iter_mut() {
                if let Some(slot) = waiters::slot_if_waiting(ctx, w.name()) {
                    waiters::serve(&slot, w, server);
                }
            }
        }
    }
    reply(out.answer)
}

/// LEASE.MACQUIRE numkeys key [key ...] owner ttl-ms [LABEL text] [BLOCK timeout-ms]
pub fn macquire(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() < 5 {
        return Err(LeaseError::Arity("lease.macquire"));
    }
    compat::check()?;
    let (keys, at) = multikey_args(a, 2, false)?;
    let owner = check_owner(a.bytes(at))?;
    let ttl = parse_ttl(a.bytes(at + 1), settings::max_ttl_ms())?;
    let opts = a.with_rest(at + 2, args::parse_macquire_options)?;
    let block_ms = opts.block_ms;
    let mut ws = open_keys(ctx, a, keys.len(), ClientArg::new(a.str(at), owner))?;
    let server = waiters::snapshot(ctx);
    let now = server.now_ms;
    // A free key with clients queued goes to the oldest of them first (as
    // for LEASE.ACQUIRE); a key still waited for is not free.
    let mut waited = vec![false; ws.len()];
    if waiters::total() > 0 {
        for (i, w) in ws.iter_mut().enumerate() {
            if let Some(slot) = waiters::slot_if_waiting(ctx, w.name()) {
                if ops::serve_first(w.record()?, now) && waiters::waiting(&slot) > 0 {
                    waiters::serve(&slot, w, server);
                }
                waited[i] = waiters::waiting(&slot) > 0;
            }
        }
    }
    let may_wait = block_ms.is_some() && blocked::may_block(ctx);
    // The keys' expiries are read only for a wait, as LEASE.ACQUIRE does.
    let mut views = Vec::with_capacity(ws.len());
    for (i, w) in ws.iter_mut().enumerate() {
        let expire = if may_wait { w.expire_at() } else { None };
        let early = ended_early(ctx, w.name());
        views.push(multikey::key_view(
            w.record()?,
            owner,
            waited[i],
            now,
            expire,
            early,
        ));
    }
    let out = tokens::with_clock(|clock| {
        multikey::acquire(
            &keys,
            &views,
            owner,
            opts.label,
            ttl,
            Env {
                server,
                clock,
                waiters_ahead: false,
                ended_early: None,
            },
            multikey::Caller::Command { may_wait },
        )
    })?;
    if let (Then::Wait(rechecks), Some(timeout_ms)) = (&out.then, block_ms) {
        let db = ctx.selected_db();
        let slots = keys.iter().map(|k| (db, k.to_vec())).collect();
        let want = waiters::Want {
            owner,
            mode: crate::lease::Mode::Exclusive,
            ttl_ms: ttl,
            timeout_ms,
            floor: 0,
            label: opts.label,
        };
        return Ok(waiters::block_multikey(ctx, slots, want, rechecks));
    }
    Ok(finish_multikey(ctx, &mut ws, &out, server))
}

/// LEASE.MRENEW numkeys key [key ...] owner ttl-ms
pub fn mrenew(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() < 5 {
        return Err(LeaseError::Arity("lease.mrenew"));
    }
    compat::check()?;
    let (keys, at) = multikey_args(a, 2, true)?;
    let owner = check_owner(a.bytes(at))?;
    let ttl = parse_ttl(a.bytes(at + 1), settings::max_ttl_ms())?;
    let mut ws = open_keys(ctx, a, keys.len(), ClientArg::new(a.str(at), owner))?;
    let server = waiters::snapshot(ctx);
    let states = states_of(&mut ws, owner, server.now_ms)?;
    let out = multikey::renew(&states, owner, ttl, server.now_ms);
    Ok(finish_multikey(ctx, &mut ws, &out, server))
}

/// LEASE.MRELEASE numkeys key [key ...] owner
pub fn mrelease(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() < 4 {
        return Err(LeaseError::Arity("lease.mrelease"));
    }
    compat::check()?;
    let (keys, at) = multikey_args(a, 1, true)?;
    let owner = check_owner(a.bytes(at))?;
    let mut ws = open_keys(ctx, a, keys.len(), ClientArg::new(a.str(at), owner))?;
    let server = waiters::snapshot(ctx);
    let states = states_of(&mut ws, owner, server.now_ms)?;
    let out = multikey::release(&states, owner, server.now_ms);
    Ok(finish_multikey(ctx, &mut ws, &out, server))
}

/// Where a multi-key command has its owner (redacted from SLOWLOG and
/// MONITOR): after `numkeys` keys; `None` when `numkeys` is no number.
pub fn multikey_owner_arg(argv_numkeys: &[u8]) -> Option<usize> {
    let n = args::parse_i64(argv_numkeys)?;
    usize::try_from(n).ok().map(|n| 2 + n)
}

/// LEASE.RENEW key owner ttl-ms
pub fn renew(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 4 {
        return Err(LeaseError::Arity("lease.renew"));
    }
    compat::check()?;
    let owner = check_owner(a.bytes(2))?;
    let ttl = parse_ttl(a.bytes(3), settings::max_ttl_ms())?;
    let mut w =
        KeyWriter::for_command(ctx, a.str(1), Some(ClientArg::new(a.str(OWNER_ARG), owner)));
    let out = ops::renew(
        w.record()?,
        owner,
        ttl,
        decision_ms(ctx),
        ops::PRUNE_PER_CALL,
    );
    Ok(finish(ctx, &mut w, &out, None, || waiters::snapshot(ctx)))
}

/// LEASE.RELEASE key owner
///
/// From a client: the core decides (`ops::release`). From the master or the
/// AOF: the effect `Effect::Release`, applied by owner alone (the master
/// decided; the replica's clock must not).
pub fn release(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 3 {
        return Err(LeaseError::Arity("lease.release"));
    }
    let owner = check_owner(a.bytes(2))?;
    // The flags once: the effect test and, on Redis 7.0, the time.
    let flags = ctx.flags();
    if Ctx::effect_in(flags) {
        return apply_effect(ctx, a, Effect::Release { owner }, true);
    }
    compat::check()?;
    let mut w =
        KeyWriter::for_command(ctx, a.str(1), Some(ClientArg::new(a.str(OWNER_ARG), owner)));
    let now = decision_ms_given(ctx, || flags);
    let out = ops::release(w.record()?, owner, now, ops::PRUNE_PER_CALL);
    Ok(finish(ctx, &mut w, &out, None, || waiters::snapshot(ctx)))
}

/// LEASE.FENCE key token [MINTTL ms] [command [arg ...]]
pub fn fence(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() < 3 {
        return Err(LeaseError::Arity("lease.fence"));
    }
    compat::check()?;
    // `key token` alone, the hot path: no option or command to look for.
    let f = if a.len() == 3 {
        FenceArgs::plain(args::parse_token(a.bytes(2))?)
    } else {
        // The token, and `MINTTL ms` when given: at most three arguments.
        a.with_head::<3, _>(2, args::parse_fence_args)?
    };
    if a.len() > 2 + f.command_at {
        return super::fence::fence_with_command(ctx, a, f);
    }
    super::fence::check_token(ctx, a.str(1), &f)?;
    STATS.fence_ok.incr();
    Ok(Reply::Ok)
}

/// LEASE.INFO key
pub fn info(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 2 {
        return Err(LeaseError::Arity("lease.info"));
    }
    compat::check()?;
    let mut key = Reader::open(ctx, a.str(1));
    let expire = key.expire_at();
    let now = decision_ms(ctx);
    Ok(match key.record()? {
        Some(RecordRef::Holders(m)) => match decide::holders_info(m, now, expire) {
            Some(view) => Reply::Fields(vec![
                ("mode", Field::Str(view.mode.name())),
                ("limit", Field::Int(view.mode.limit() as i64)),
                ("token", Field::Int(view.token as i64)),
                ("ttl", Field::Int(view.ttl_ms)),
                (
                    "waiters",
                    Field::Int(waiters::waiting_on(ctx, a.str(1)) as i64),
                ),
                (
                    "holders",
                    Field::Maps(
                        view.holders
                            .into_iter()
                            .map(|h| {
                                vec![
                                    ("token", Field::Int(h.token as i64)),
                                    ("ttl", Field::Int(h.ttl_ms)),
                                    ("since", Field::Int(h.since_ms)),
                                    ("label", Field::Bytes(h.label.map(Into::into))),
                                ]
                            })
                            .collect(),
                    ),
                ),
                ("guard", Field::Int(0)),
            ]),
            None => Reply::Null,
        },
        current => {
            let guard = exclusive(current).is_some_and(|l| l.is_guard());
            let waiting = Field::Int(waiters::waiting_on(ctx, a.str(1)) as i64);
            match decide::info(exclusive(current), now, expire) {
                Some(view) => Reply::Fields(vec![
                    ("token", Field::Int(view.token as i64)),
                    ("ttl", Field::Int(view.ttl_ms)),
                    ("waiters", waiting),
                    ("since", Field::Int(view.since_ms)),
                    ("label", Field::Bytes(view.label.map(Into::into))),
                    ("guard", Field::Int(guard as i64)),
                ]),
                // A guard nobody holds (design.md S12): no holding.
                None if guard => Reply::Fields(vec![
                    ("token", Field::Bytes(None)),
                    ("ttl", Field::Bytes(None)),
                    ("waiters", waiting),
                    ("since", Field::Bytes(None)),
                    ("label", Field::Bytes(None)),
                    ("guard", Field::Int(1)),
                ]),
                None => Reply::Null,
            }
        }
    })
}

/// LEASE.GUARD key: the key guards its hash tag (design.md S12).
pub fn guard(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 2 {
        return Err(LeaseError::Arity("lease.guard"));
    }
    if ctx.is_effect() {
        return apply_effect(ctx, a, Effect::Guard, false);
    }
    compat::check()?;
    let name = a.bytes(1);
    let tag_guard = guards::guard_of(ctx.selected_db(), name);
    // The key is opened once the name passed the core's checks.
    let mut opened = None;
    let out = ops::guard(name, tag_guard.as_deref(), || {
        opened
            .insert(KeyWriter::for_command(ctx, a.str(1), None))
            .record()
    })?;
    let Some(w) = opened.as_mut() else {
        return Err(LeaseError::Internal("LEASE.GUARD decided unread".into()));
    };
    Ok(finish(ctx, w, &out, None, || waiters::snapshot(ctx)))
}

/// LEASE.UNGUARD key: 1 when the key guarded its hash tag and stops, else
/// 0.
pub fn unguard(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 2 {
        return Err(LeaseError::Arity("lease.unguard"));
    }
    if ctx.is_effect() {
        return apply_effect(ctx, a, Effect::Unguard, true);
    }
    compat::check()?;
    let mut w = KeyWriter::for_command(ctx, a.str(1), None);
    let out = ops::unguard(w.record()?);
    Ok(finish(ctx, &mut w, &out, None, || waiters::snapshot(ctx)))
}

/// LEASE.FENCED key guard: a write the guard of its key refused (the
/// command filter puts it in the place of the refused command, and the
/// server runs it only where it would have run that command: its client
/// authenticated, its user allowed it), counted and logged here.
pub fn fenced(_ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 3 {
        return Err(LeaseError::Arity("lease.fenced"));
    }
    Err(guards::refused(a.bytes(1), a.bytes(2)))
}

/// LEASE.WAITERS key [COUNT count]
pub fn waiters(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() != 2 && a.len() != 4 {
        return Err(LeaseError::Arity("lease.waiters"));
    }
    let count = if a.len() == 4 {
        args::parse_count(a.bytes(2), a.bytes(3))?
    } else {
        args::DEFAULT_WAITERS_COUNT
    };
    compat::check()?;
    // A key of another type is refused, as LEASE.INFO refuses it.
    Reader::open(ctx, a.str(1)).record()?;
    let now = now_ms();
    Ok(Reply::Maps(waiters::list(ctx, a.str(1), count, |ws| {
        ws.into_iter()
            .map(|w| {
                let v = w.view(now);
                vec![
                    ("client", Field::Int(v.client as i64)),
                    ("label", Field::Bytes(v.label.map(Into::into))),
                    ("mode", Field::Str(v.mode)),
                    ("limit", Field::Int(v.limit as i64)),
                    ("keys", Field::Int(v.keys as i64)),
                    ("waited", Field::Int(v.waited_ms)),
                    ("timeout", Field::Int(v.timeout_ms)),
                ]
            })
            .collect()
    })))
}

/// Commits an effect from the master link or the AOF. `reads_key`: the
/// effect answers WRONGTYPE on a key of another type (DROP, RELEASE),
/// rather than replacing it (APPLY, HOLD: the master's state wins).
/// Answers whether it changed the key (DROP, RELEASE) or OK.
fn apply_effect(
    ctx: Ctx,
    a: &Args,
    effect: Effect<'_>,
    reads_key: bool,
) -> Result<Reply, LeaseError> {
    if compat::ignoring_effects() {
        return Ok(if reads_key { Reply::Int(0) } else { Reply::Ok });
    }
    let mut w = KeyWriter::for_effect(ctx, a.str(1));
    if reads_key {
        w.record()?;
    }
    let changed = w.commit(&Commit {
        effect,
        event: Event::Replayed,
    });
    Ok(if reads_key {
        Reply::Int(changed as i64)
    } else {
        Reply::Ok
    })
}

/// The internal effect commands (`LEASE.APPLY`, `LEASE.HOLD`, `LEASE.DROP`,
/// `LEASE.PRUNE`): accepted only from the master link and the AOF.
fn effect_command(ctx: Ctx, a: &Args, which: &'static std::ffi::CStr) -> Result<Reply, LeaseError> {
    if !ctx.is_effect() {
        return Err(LeaseError::InternalOnly(
            which.to_str().unwrap_or("LEASE.APPLY"),
        ));
    }
    // A call without its key fails the effect's own arity check first.
    let rest = a.rest(2);
    let effect = Effect::parse(which, &rest)?;
    let reads_key = matches!(effect, Effect::Drop { .. });
    apply_effect(ctx, a, effect, reads_key)
}

/// LEASE.APPLY key owner token deadline-ms (internal)
pub fn apply(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    effect_command(ctx, a, effect::APPLY)
}

/// LEASE.HOLD key owner token deadline-ms LIMIT n|SHARED (internal)
pub fn hold(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    effect_command(ctx, a, effect::HOLD)
}

/// LEASE.DROP key owner (internal)
pub fn drop(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    effect_command(ctx, a, effect::DROP)
}

/// LEASE.PRUNE key deadline-ms token (internal)
pub fn prune(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    effect_command(ctx, a, effect::PRUNE)
}

/// The internal announcements (`LEASE.CLOCK last`, `LEASE.VERSION effects
/// records`), accepted only from the master link and the AOF.
fn announcement(ctx: Ctx, a: &Args, which: &'static std::ffi::CStr) -> Result<Reply, LeaseError> {
    if !ctx.is_effect() {
        return Err(LeaseError::InternalOnly(
            which.to_str().unwrap_or("LEASE.CLOCK"),
        ));
    }
    match Announce::parse(which, &a.rest(1))? {
        Announce::Clock { last } => tokens::observe(last),
        Announce::Version { effects, records } => compat::announced(ctx, effects, records),
    }
    super::ffi::replicate::replicate_verbatim(ctx);
    Ok(Reply::Ok)
}

/// LEASE.CLOCK last (internal)
pub fn clock(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    announcement(ctx, a, effect::CLOCK)
}

/// LEASE.VERSION effects records (internal)
pub fn version(ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    announcement(ctx, a, effect::VERSION)
}

/// LEASE.GATE [key] (internal): changes nothing. Flagged `write`, so that
/// calling it in script mode asks the server whether a write to `key` (or,
/// without one, any write) would be accepted now (see `commit::gate`).
pub fn gate(_ctx: Ctx, a: &Args) -> Result<Reply, LeaseError> {
    if a.len() > 2 {
        return Err(LeaseError::Arity("lease.gate"));
    }
    Ok(Reply::Ok)
}
