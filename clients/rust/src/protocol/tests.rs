//! Unit tests of the protocol core.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::{Block, Error, Loss, Mode, Options};

fn one(key: &str) -> Keys {
    Keys::One(key.to_string())
}

fn words(cmd: &redis::Cmd) -> Vec<String> {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => "<not simple>".to_string(),
        })
        .collect()
}

/// A server's error reply, as the client reads it.
fn server_error(text: &str) -> redis::RedisError {
    redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
        .unwrap()
        .extract_error()
        .unwrap_err()
}

/// A commit round decided with every reply in.
fn settled(commit: &Commit, replies: Vec<StepReply>, addr: impl Fn(usize) -> String) -> Committed {
    let replies: Vec<Option<StepReply>> = replies.into_iter().map(Some).collect();
    commit
        .decide(&replies, addr)
        .expect("decided with every reply")
}

#[test]
fn a_token_refused_as_too_far_ahead_is_left_out_and_the_next_committed() {
    const MS: u64 = 1024;
    let far = || {
        Err(server_error(
            "ERR FLOOR token is more than the grace length (1000 ms, at least 1000) ahead of this server's clock (at most 5 now)",
        ))
    };
    let grants = vec![
        (0, 900_000 * MS),
        (1, 100 * MS),
        (3, 300 * MS),
        (4, 200 * MS),
    ];
    let commit = Commit::new(grants, 3).unwrap();
    assert_eq!(
        (commit.token(), commit.on()),
        (900_000 * MS, &[0, 1, 3, 4][..])
    );
    let replies = vec![Ok(Some(900_000 * MS)), far(), far(), far()];
    let Committed::Again(next, outliers) = settled(&commit, replies, |i| format!("m{i}")) else {
        panic!("another round");
    };
    assert_eq!(
        outliers,
        vec![Outlier {
            master: 0,
            addr: "m0".into(),
            token: 900_000 * MS,
            instead: 300 * MS,
            ahead: Duration::from_millis(899_700),
        }]
    );
    assert_eq!((next.token(), next.on()), (300 * MS, &[1, 3, 4][..]));
    // Another round whose answers are a majority: held without master 0.
    let replies = vec![Ok(Some(300 * MS)), Ok(Some(300 * MS)), Ok(Some(300 * MS))];
    assert!(matches!(
        settled(&next, replies, |i| format!("m{i}")),
        Committed::Held { token, on } if token == 300 * MS && on == [1, 3, 4]
    ));
    // A minority refusing does not matter; too few refusing to make a
    // majority without the top: no lease.
    let commit = || Commit::new(vec![(0, 9), (1, 5), (2, 7)], 2).unwrap();
    assert!(matches!(
        settled(&commit(), vec![Ok(Some(9)), Ok(Some(9)), far()], |_| {
            String::new()
        }),
        Committed::Held { token: 9, .. }
    ));
    let timeout = || {
        Err(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        )))
    };
    assert!(matches!(
        settled(&commit(), vec![Ok(Some(9)), far(), timeout()], |_| {
            String::new()
        }),
        Committed::Failed
    ));
    // Other errors are no refusal of the token.
    let other = || {
        Err(server_error(
            "ERR FLOOR is for exclusive leases: it cannot be given with LIMIT or SHARED",
        ))
    };
    assert!(matches!(
        settled(&commit(), vec![Ok(Some(9)), other(), other()], |_| {
            String::new()
        }),
        Committed::Failed
    ));
    assert!(
        Commit::new(vec![(0, 9)], 2).is_none(),
        "no majority granted"
    );
}

#[test]
fn a_quorum_fence_reports_the_commands_error_and_stale_only_when_stale() {
    let value = |n| Ok(redis::Value::Int(n));
    let failed = || Err(server_error("ERR value is not an integer or out of range"));
    let stale = || {
        Err(server_error(
            "STALE fencing token is not the token of the lease held on this key",
        ))
    };
    let lost = || {
        Err(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        )))
    };
    assert!(matches!(
        fence_outcome(vec![value(1), value(2), lost()], 2),
        Ok(redis::Value::Int(1))
    ));
    match fence_outcome(vec![failed(), failed(), failed()], 2) {
        Err(Error::Redis(e)) => assert!(e.to_string().contains("not an integer"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        fence_outcome(vec![lost(), failed(), value(3)], 2),
        Err(Error::Redis(_))
    ));
    assert!(matches!(
        fence_outcome(vec![stale(), stale(), value(3)], 2),
        Err(Error::Stale)
    ));
    assert!(matches!(
        fence_outcome(vec![failed(), lost(), lost()], 2),
        Err(Error::Stale)
    ));
}

#[test]
fn a_quorum_fence_is_expiring_when_minttl_refused_it_where_the_token_was_current() {
    let value = |n| Ok(redis::Value::Int(n));
    let expiring = |left: u64| {
        Err(server_error(&format!(
            "EXPIRING lease has {left} ms left, less than MINTTL 500"
        )))
    };
    let stale = || {
        Err(server_error(
            "STALE fencing token is not the token of the lease held on this key",
        ))
    };
    let ms = Duration::from_millis;
    match fence_outcome(vec![expiring(120), expiring(130), stale()], 2) {
        Err(Error::Expiring { left, min_ttl }) => assert_eq!((left, min_ttl), (ms(120), ms(500))),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        fence_outcome(vec![value(1), expiring(120), value(2)], 2),
        Ok(redis::Value::Int(1))
    ));
    assert!(matches!(
        fence_outcome(vec![value(1), expiring(120), stale()], 2),
        Err(Error::Expiring { .. })
    ));
    assert!(
        matches!(
            fence_outcome(vec![expiring(120), stale(), stale()], 2),
            Err(Error::Stale)
        ),
        "current on one master of three: STALE"
    );
    assert_eq!(
        expiring_of("lease has 7 ms left, less than MINTTL 9"),
        Some((ms(7), ms(9)))
    );
    assert_eq!(expiring_of("something else"), None);
    assert_eq!(min_ttl_millis(Duration::from_micros(1)), 1);
    assert_eq!(min_ttl_millis(ms(500)), 500);
    assert_eq!(min_ttl_millis(Duration::ZERO), 0);
}

#[test]
fn a_block_retry_with_nothing_left_does_not_wait_forever() {
    let opts = Options::default();
    let past = Instant::now() - Duration::from_secs(1);
    let (c, read) = acquire_cmd(
        "k",
        "o",
        Duration::from_secs(1),
        Mode::Exclusive,
        None,
        Block::For(Duration::from_secs(1)),
        Some(past),
        &opts,
    );
    assert_eq!(c.args_iter().count(), 4, "no BLOCK option");
    assert!(!waits(&c));
    assert_eq!(read, Some(opts.io_timeout));
    let (c, read) = acquire_cmd(
        "k",
        "o",
        Duration::from_secs(1),
        Mode::Exclusive,
        None,
        Block::Forever,
        None,
        &opts,
    );
    assert_eq!(c.args_iter().count(), 6);
    assert!(waits(&c));
    assert_eq!(read, None);
    assert_eq!(
        normalize(Block::For(Duration::from_micros(10))),
        Block::NoWait
    );
}

#[test]
fn a_grace_period_is_read_from_info_lease() {
    let info = "# lease\r\nlease_grace_remaining_ms:4210\r\nlease_grace_reason:promoted\r\n";
    match grace_of(info) {
        Some(Error::Grace { remaining, reason }) => {
            assert_eq!(
                (remaining, reason.as_str()),
                (Duration::from_millis(4210), "promoted")
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(grace_of("lease_grace_remaining_ms:0\nlease_grace_reason:none").is_none());
    assert!(grace_of("").is_none());
}

#[test]
fn a_ttl_under_a_millisecond_is_an_error() {
    assert!(matches!(
        check_ttl(Duration::from_micros(999)),
        Err(Error::InvalidTtl(_))
    ));
    assert!(matches!(
        check_ttl(Duration::ZERO),
        Err(Error::InvalidTtl(_))
    ));
    assert!(check_ttl(Duration::from_millis(1)).is_ok());
}

#[test]
fn a_lease_known_lost_is_released_briefly_or_not_at_all() {
    assert_eq!(release_plan(None), ReleasePlan::Full);
    assert_eq!(release_plan(Some(Loss::Expired)), ReleasePlan::Short);
    assert_eq!(release_plan(Some(Loss::Refused)), ReleasePlan::Nothing);
    let io = || {
        Error::Redis(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        )))
    };
    let opts = Options::default();
    let mut attempt = 0;
    assert!(
        release_failed(io(), &mut attempt, &opts, ReleasePlan::Full).is_none(),
        "a lost reply is sent again"
    );
    assert_eq!(attempt, 1);
    attempt = opts.retries;
    assert!(matches!(
        release_failed(io(), &mut attempt, &opts, ReleasePlan::Full),
        Some(Err(_))
    ));
    let mut attempt = 0;
    let s = short(&opts);
    assert!(
        matches!(
            release_failed(io(), &mut attempt, &s, ReleasePlan::Short),
            Some(Ok(false))
        ),
        "known lost: one try"
    );
    assert!(matches!(
        release_failed(Error::Stale, &mut attempt, &opts, ReleasePlan::Full),
        Some(Err(Error::Stale))
    ));
    assert!(release_opts(ReleasePlan::Nothing, &opts).is_none());
    let s = short(&Options::default());
    assert_eq!(
        (s.connect_timeout, s.io_timeout, s.retries),
        (SHORT_RELEASE, SHORT_RELEASE, 0)
    );
}

/// A loss signal for the schedule's tests: a deadline and a loss.
#[derive(Clone, Default)]
struct Probe(Arc<Mutex<(Option<Instant>, Option<Loss>)>>);

impl Probe {
    fn new(deadline: Instant) -> Probe {
        Probe(Arc::new(Mutex::new((Some(deadline), None))))
    }
    fn loss(&self) -> Option<Loss> {
        self.0.lock().unwrap().1
    }
}

impl Renewable for Probe {
    fn live(&self) -> bool {
        self.loss().is_none()
    }
    fn deadline(&self) -> Instant {
        self.0.lock().unwrap().0.unwrap()
    }
    fn renewed(&self, sent: Instant, ttl: Duration) -> bool {
        let mut st = self.0.lock().unwrap();
        st.0 = Some(sent + ttl);
        st.1.is_none()
    }
    fn refused(&self) {
        self.0.lock().unwrap().1 = Some(Loss::Refused);
    }
}

fn sent(next: Next) -> Batch {
    match next {
        Next::Send(b) => b,
        Next::Sleep(_) => panic!("sleeps"),
        Next::Idle => panic!("idle"),
    }
}

#[test]
fn renewals_due_together_share_one_batch() {
    let ttl = Duration::from_millis(1200);
    let t0 = Instant::now();
    let mut s = Schedule::default();
    // Due at +400 ms, +450 ms (within the 100 ms window) and +700 ms.
    let probes: Vec<Probe> = (0..3).map(|_| Probe::new(t0 + ttl)).collect();
    for (i, at) in [400u64, 450, 700].iter().enumerate() {
        s.add(
            &one(&format!("k{i}")),
            "o",
            ttl,
            t0 + Duration::from_millis(*at),
            probes[i].clone(),
        );
    }
    assert!(
        matches!(s.next(t0, Duration::from_secs(5)), Next::Sleep(t) if t == t0 + Duration::from_millis(400))
    );
    // The watchdog sleeps until +400 ms: a lease due later wakes nothing,
    // one due sooner does.
    let late = Probe::new(t0 + ttl);
    let (id, wake) = s.add(
        &one("late"),
        "o",
        ttl,
        t0 + Duration::from_millis(900),
        late,
    );
    assert!(!wake);
    s.remove(id);
    let soon = Probe::new(t0 + ttl);
    let (id, wake) = s.add(
        &one("soon"),
        "o",
        ttl,
        t0 + Duration::from_millis(300),
        soon,
    );
    assert!(wake);
    s.remove(id);
    let now = t0 + Duration::from_millis(400);
    let b = sent(s.next(now, Duration::from_secs(5)));
    assert_eq!(b.cmds.len(), 2, "the one due 50 ms later goes along");
    assert!(b.read <= Duration::from_millis(800) && b.read > Duration::from_millis(700));
    s.settle(&b, vec![Reply::Int(1), Reply::Int(1)]);
    assert_eq!((s.renewals, s.round_trips, s.len()), (2, 1, 3));
    // Both now due at now + 400 ms: in step from here on.
    assert!(
        matches!(s.next(now, Duration::from_secs(5)), Next::Sleep(t) if t == t0 + Duration::from_millis(700))
    );
    let b = sent(s.next(t0 + Duration::from_millis(700), Duration::from_secs(5)));
    assert_eq!(b.cmds.len(), 3, "700 and 800 within the window");
    // A refusal is the loss and ends the watch; no reply is tried again.
    s.settle(&b, vec![Reply::Int(0)]);
    let lost = probes
        .iter()
        .filter(|p| p.loss() == Some(Loss::Refused))
        .count();
    assert_eq!(lost, 1);
    assert_eq!(s.len(), 2);
    let b = sent(s.next(
        Instant::now() + Duration::from_millis(300),
        Duration::from_secs(5),
    ));
    assert_eq!(
        b.cmds.len(),
        2,
        "the two with no reply come back within the retry pause"
    );
}

#[test]
fn lost_or_released_leases_leave_the_schedule() {
    let ttl = Duration::from_millis(300);
    let now = Instant::now();
    let mut s = Schedule::default();
    let p = Probe::new(now + ttl);
    let (id, wake) = s.add(&one("k"), "o", ttl, now, p.clone());
    assert!(wake, "a watchdog that is not running is started");
    let q = Probe::new(now + ttl);
    s.add(&one("k2"), "o", ttl, now, q.clone());
    q.refused();
    let b = sent(s.next(now, Duration::from_secs(5)));
    assert_eq!(b.cmds.len(), 1, "the lost one is not renewed");
    s.remove(id);
    s.settle(&b, vec![Reply::Int(1)]);
    assert!(matches!(s.next(now, Duration::from_secs(5)), Next::Idle));
}

#[test]
fn an_acquire_retries_lost_replies_only_and_a_little_later_each_time() {
    let opts = Options {
        retries: 2,
        ..Options::default()
    };
    let ttl = Duration::from_secs(1);
    assert!(matches!(
        Acquire::new(
            &one("k"),
            Duration::ZERO,
            Mode::Exclusive,
            None,
            Block::NoWait,
            &opts,
            false,
            &Held::default()
        ),
        Err(Error::InvalidTtl(_))
    ));
    let k = one("k");
    let mut plan = Acquire::new(
        &k,
        ttl,
        Mode::Exclusive,
        None,
        Block::NoWait,
        &opts,
        false,
        &Held::default(),
    )
    .unwrap();
    let lost = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
    let refused = redis::RedisError::from((redis::ErrorKind::Client, "ERR"));
    assert_eq!(plan.retry(&refused), None, "an error reply is the answer");
    assert_eq!(plan.retry(&lost), Some(Duration::from_millis(20)));
    assert_eq!(plan.retry(&lost), Some(Duration::from_millis(40)));
    assert_eq!(plan.retry(&lost), None, "retries spent");
    let owner = plan.owner.clone();
    let (cmd, _) = plan.attempt();
    assert!(
        cmd.args_iter()
            .any(|a| matches!(a, redis::Arg::Simple(b) if b == owner.as_bytes())),
        "the same owner every time"
    );
}

#[test]
fn a_lease_granted_late_counts_from_its_first_renewal() {
    let ttl = Duration::from_secs(3);
    let sent = Instant::now() - Duration::from_secs(2);
    assert!(renews_first(sent, ttl));
    assert!(!renews_first(Instant::now(), ttl));
    let now = Instant::now();
    assert_eq!(start(sent, ttl, 1, Some((now, &Ok(1)))), (now + ttl, None));
    assert_eq!(
        start(sent, ttl, 1, Some((now, &Ok(0)))),
        (sent + ttl, Some(Loss::Refused))
    );
    let lost = Err(redis::RedisError::from(std::io::Error::from(
        std::io::ErrorKind::TimedOut,
    )));
    assert_eq!(start(sent, ttl, 1, Some((now, &lost))), (sent + ttl, None));
    assert_eq!(start(sent, ttl, 1, None), (sent + ttl, None));
    assert!(matches!(refused::<u64>(""), Ok(None)));
    assert!(matches!(
        refused::<u64>("lease_grace_remaining_ms:10"),
        Err(Error::Grace { .. })
    ));
}

#[test]
fn a_multi_key_lease_sends_every_key_with_its_count() {
    assert!(matches!(
        Keys::many::<&str>(&[]),
        Err(Error::InvalidKeys(_))
    ));
    assert!(matches!(
        Keys::many(&["a", "b", "a"]),
        Err(Error::InvalidKeys(ref m)) if m.contains("\"a\"")
    ));
    let keys = Keys::many(&["{t}a", "{t}b"]).unwrap();
    assert_eq!(
        (keys.count(), keys.first(), keys.route()),
        (2, "{t}a", Some("{t}a"))
    );
    assert_eq!(one("k").route(), None);
    assert!(keys.one_slot().is_ok());
    let cross = Keys::many(&["{t}a", "{u}b"]).unwrap();
    assert!(matches!(cross.one_slot(), Err(Error::InvalidKeys(ref m)) if m.contains("CROSSSLOT")));
    assert_eq!(
        words(&keys.renew_cmd("o", Duration::from_millis(1500))),
        ["LEASE.MRENEW", "2", "{t}a", "{t}b", "o", "1500"]
    );
    assert_eq!(
        words(&keys.release_cmd("o")),
        ["LEASE.MRELEASE", "2", "{t}a", "{t}b", "o"]
    );
    let each: Vec<_> = keys.leftover_cmds("o").iter().map(words).collect();
    assert_eq!(
        each,
        [
            ["LEASE.RELEASE", "{t}a", "o"],
            ["LEASE.RELEASE", "{t}b", "o"]
        ]
    );
    assert!(one("k").leftover_cmds("o").is_empty());
    let opts = Options::default();
    let plan = Acquire::new(
        &keys,
        Duration::from_secs(1),
        Mode::Shared,
        None,
        Block::Forever,
        &opts,
        false,
        &Held::default(),
    )
    .unwrap();
    let (cmd, read) = plan.attempt();
    let w = words(&cmd);
    assert_eq!(w[..4], ["LEASE.MACQUIRE", "2", "{t}a", "{t}b"]);
    assert_eq!(w[4], plan.owner);
    assert_eq!(
        w[5..],
        ["1000", "BLOCK", "0"],
        "exclusive, whatever the mode"
    );
    assert_eq!(read, None);
    assert!(waits(&cmd));
    // A key named BLOCK is not the option.
    let odd = Keys::many(&["BLOCK", "x"]).unwrap();
    let plan = Acquire::new(
        &odd,
        Duration::from_secs(1),
        Mode::Exclusive,
        None,
        Block::NoWait,
        &opts,
        false,
        &Held::default(),
    )
    .unwrap();
    let (cmd, read) = plan.attempt();
    assert!(!waits(&cmd));
    assert_eq!(read, Some(opts.io_timeout));
    let (cmd, _) = acquire_cmd(
        "BLOCK",
        "o",
        Duration::from_secs(1),
        Mode::Exclusive,
        None,
        Block::NoWait,
        None,
        &opts,
    );
    assert!(!waits(&cmd));
    // The renewal at once after a long wait renewed every key, or not.
    let sent = Instant::now() - Duration::from_secs(2);
    let now = Instant::now();
    let ttl = Duration::from_secs(3);
    assert_eq!(start(sent, ttl, 2, Some((now, &Ok(2)))), (now + ttl, None));
    assert_eq!(
        start(sent, ttl, 2, Some((now, &Ok(0)))),
        (sent + ttl, Some(Loss::Refused))
    );
}

#[test]
fn a_multi_key_renewal_is_one_command_that_renews_every_key_or_none() {
    let ttl = Duration::from_millis(600);
    let now = Instant::now();
    let mut s = Schedule::default();
    let (m, single) = (Probe::new(now + ttl), Probe::new(now + ttl));
    let keys = Keys::many(&["{t}a", "{t}b", "{t}c"]).unwrap();
    s.add(&keys, "o", ttl, now, m.clone());
    s.add(&one("k"), "o", ttl, now, single.clone());
    let b = sent(s.next(now, Duration::from_secs(5)));
    assert_eq!(b.cmds.len(), 2, "one command per lease, in the same batch");
    let multi = b
        .routes
        .iter()
        .position(|r| r.is_some())
        .expect("the multi-key one is routed");
    assert_eq!(b.routes[multi].as_deref(), Some("{t}a"));
    assert_eq!(words(&b.cmds[multi])[0], "LEASE.MRENEW");
    assert_eq!(b.routes[1 - multi], None);
    // 3 renews all three keys; a 1 from LEASE.MRENEW would not.
    let mut replies = vec![Reply::Int(1), Reply::Int(1)];
    replies[multi] = Reply::Int(3);
    s.settle(&b, replies);
    assert!(m.loss().is_none() && single.loss().is_none());
    assert_eq!((s.renewals, s.round_trips, s.len()), (2, 1, 2));
    let later = now + renew_every(ttl);
    let b = sent(s.next(later, Duration::from_secs(5)));
    let multi = b.routes.iter().position(|r| r.is_some()).unwrap();
    let mut replies = vec![Reply::Int(1), Reply::Int(1)];
    replies[multi] = Reply::Int(0);
    s.settle(&b, replies);
    assert_eq!(m.loss(), Some(Loss::Refused), "0: the loss of every key");
    assert_eq!(s.len(), 1);
}

#[test]
fn an_idle_watchdog_lingers_and_a_later_lease_does_not_wake_it() {
    let now = Instant::now();
    assert_eq!(
        linger_left(now, now + Duration::from_secs(1)),
        Some(WATCHDOG_LINGER - Duration::from_secs(1))
    );
    assert_eq!(
        linger_left(now, now + WATCHDOG_LINGER),
        None,
        "then it ends"
    );
    let ttl = Duration::from_secs(30);
    let mut s: Schedule<Probe> = Schedule::default();
    assert!(matches!(s.next(now, Duration::from_secs(5)), Next::Idle));
    // Without the linger mark, any lease wakes an idle watchdog.
    let (_, wake) = s.add(
        &one("a"),
        "o",
        ttl,
        now + renew_every(ttl),
        Probe::new(now + ttl),
    );
    assert!(wake);
    let mut s: Schedule<Probe> = Schedule::default();
    assert!(matches!(s.next(now, Duration::from_secs(5)), Next::Idle));
    s.idle_until(now + WATCHDOG_LINGER);
    let (_, wake) = s.add(
        &one("a"),
        "o",
        ttl,
        now + renew_every(ttl),
        Probe::new(now + ttl),
    );
    assert!(!wake, "its first renewal is after the watchdog looks again");
    let (_, wake) = s.add(
        &one("b"),
        "o",
        ttl,
        now + Duration::from_millis(10),
        Probe::new(now + ttl),
    );
    assert!(wake, "one due before that wakes it");
}

#[test]
fn labels_are_cut_on_a_character_boundary_and_go_before_block() {
    use crate::Label;
    assert_eq!(super::label::truncate(&"x".repeat(300)).len(), 256);
    for pad in 0..4 {
        let long = format!("{}{}", "x".repeat(pad), "€".repeat(100));
        let cut = super::label::truncate(&long);
        assert!(cut.len() <= 256 && cut.len() > 252, "{pad}: {}", cut.len());
    }
    assert_eq!(resolve(&Label::None, None), None);
    assert_eq!(resolve(&Label::text(""), None), None);
    assert_eq!(
        resolve(&Label::Default, None).as_deref(),
        Some(default_label())
    );
    let inherited = Some(std::sync::Arc::from("client's"));
    assert_eq!(
        resolve(&Label::Default, Some(&inherited)).as_deref(),
        Some("client's")
    );
    let opts = Options::default();
    let k = one("k");
    let plan = Acquire::new(
        &k,
        Duration::from_secs(1),
        Mode::Shared,
        Some("l"),
        Block::For(Duration::from_secs(1)),
        &opts,
        false,
        &Held::default(),
    )
    .unwrap();
    let (cmd, _) = plan.attempt();
    let w = words(&cmd);
    assert_eq!(w[3..7], ["1000", "SHARED", "LABEL", "l"]);
    assert_eq!(w[7], "BLOCK");
    assert!(waits(&cmd));
    assert_eq!(
        words(&plan.attempt().0)[5..7],
        ["LABEL", "l"],
        "the same on a retry"
    );
}

#[test]
fn the_waiters_reply_in_resp2_and_resp3() {
    use redis::Value::{Array, BulkString, Int, Map, Nil, SimpleString};
    let b = |s: &str| BulkString(s.as_bytes().to_vec());
    let flat = Array(vec![
        b("client"),
        Int(7),
        b("label"),
        b("w"),
        b("mode"),
        b("keys"),
        b("limit"),
        Int(0),
        b("keys"),
        Int(2),
        b("waited"),
        Int(15),
        b("timeout"),
        Int(-1),
    ]);
    let map = Map(vec![
        (SimpleString("client".into()), Int(8)),
        (SimpleString("label".into()), Nil),
        (SimpleString("mode".into()), b("limit")),
        (SimpleString("limit".into()), Int(3)),
        (SimpleString("keys".into()), Int(1)),
        (SimpleString("waited".into()), Int(0)),
        (SimpleString("timeout".into()), Int(250)),
    ]);
    let ws = parse_waiters(&Array(vec![flat, map])).unwrap();
    assert_eq!(ws.len(), 2);
    assert_eq!(
        (ws[0].client, ws[0].label.as_deref(), ws[0].mode.as_str()),
        (7, Some("w"), "keys")
    );
    assert_eq!(
        (ws[0].keys, ws[0].waited, ws[0].timeout),
        (2, Duration::from_millis(15), None)
    );
    assert_eq!(
        (ws[1].client, ws[1].label.as_deref(), ws[1].limit),
        (8, None, 3)
    );
    assert_eq!(ws[1].timeout, Some(Duration::from_millis(250)));
    assert!(parse_waiters(&Array(vec![])).unwrap().is_empty());
    assert!(matches!(
        waiters_cmd("k", Some(0)),
        Err(Error::InvalidCount(0))
    ));
    assert_eq!(
        words(&waiters_cmd("k", Some(5)).unwrap()),
        ["LEASE.WAITERS", "k", "COUNT", "5"]
    );
}

#[test]
fn every_step_of_a_quorum_acquisition_sends_its_label() {
    let steps = Steps {
        key: "k",
        owner: "o",
        ttl: Duration::from_millis(1500),
        label: Some("job 991"),
    };
    assert_eq!(
        words(&steps.first(None)),
        ["LEASE.ACQUIRE", "k", "o", "1500", "LABEL", "job 991"]
    );
    assert_eq!(
        words(&steps.commit(42)),
        [
            "LEASE.ACQUIRE",
            "k",
            "o",
            "1500",
            "FLOOR",
            "42",
            "LABEL",
            "job 991"
        ]
    );
    let none = Steps {
        label: None,
        ..steps
    };
    assert_eq!(
        words(&none.first(None)),
        ["LEASE.ACQUIRE", "k", "o", "1500"]
    );
    assert_eq!(
        words(&steps.first(Some(7))),
        [
            "LEASE.ACQUIRE",
            "k",
            "o",
            "1500",
            "FLOOR",
            "7",
            "LABEL",
            "job 991"
        ]
    );
    assert_eq!(
        words(&none.commit(42)),
        ["LEASE.ACQUIRE", "k", "o", "1500", "FLOOR", "42"]
    );
}

#[test]
fn guard_and_unguard_send_the_key_and_read_their_replies() {
    assert_eq!(words(&guard_cmd("{g}:lock")), ["LEASE.GUARD", "{g}:lock"]);
    assert_eq!(
        words(&unguard_cmd("{g}:lock")),
        ["LEASE.UNGUARD", "{g}:lock"]
    );
    assert!(guard_reply(&redis::Value::Okay).is_ok());
    assert!(guard_reply(&redis::Value::SimpleString("OK".into())).is_ok());
    assert!(matches!(
        guard_reply(&redis::Value::Int(1)),
        Err(Error::Redis(_))
    ));
    assert!(unguard_reply(&redis::Value::Int(1)).unwrap());
    assert!(!unguard_reply(&redis::Value::Int(0)).unwrap());
    assert!(matches!(
        unguard_reply(&redis::Value::Okay),
        Err(Error::Redis(_))
    ));
}

#[test]
fn a_fenced_refusal_names_the_key_and_the_guard_even_with_quotes_in_them() {
    let text = |key: &str, guard: &str| {
        format!(
            "write to '{key}' refused: its hash tag is guarded by '{guard}'; write it through LEASE.FENCE {guard} <token> ..."
        )
    };
    for (key, guard) in [
        ("{g}:data", "{g}:lock"),
        ("{g}:it's", "{g}:o'lock"),
        // The middle words in a key's name: the guard named twice decides.
        (
            "{g}' refused: its hash tag is guarded by 'x",
            "{g}' refused: its hash tag is guarded by 'y",
        ),
        (
            "{g}:a?b",
            "{g}:0123456789012345678901234567890123456789012345678901234567...",
        ),
        ("", ""),
    ] {
        assert_eq!(
            fenced_of(&text(key, guard)),
            Some((key.to_string(), guard.to_string())),
            "{key:?} {guard:?}"
        );
    }
    for other in [
        "",
        "write to 'k' refused",
        "write to 'k' refused: its hash tag is guarded by 'g'; write it through LEASE.FENCE h <token> ...",
        "write to 'k' refused: its hash tag is guarded by 'g'; write it through LEASE.FENCE g",
    ] {
        assert_eq!(fenced_of(other), None, "{other:?}");
    }
}

/// Step 1's replies in so far: `Some(t)` a token, `0` null, `-1` a refusal
/// of the proposal as too far ahead, `-2` a timeout; `None` not in yet.
fn step1(replies: &[Option<i64>]) -> Vec<Option<StepReply>> {
    replies
        .iter()
        .map(|r| {
            r.map(|v| match v {
                0 => Ok(None),
                -1 => Err(server_error(
                    "ERR FLOOR token is more than the grace length (1000 ms, at least 1000) ahead of this server's clock",
                )),
                -2 => Err(redis::RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::TimedOut,
                ))),
                t => Ok(Some(t as u64)),
            })
        })
        .collect()
}

#[test]
fn step_1_holds_on_an_exact_majority_of_the_proposal_as_soon_as_it_is_in() {
    let all = [0, 1, 2, 3, 4];
    let first = |rule, replies: &[Option<i64>]| first_outcome(rule, 500, &all, &step1(replies), 3);
    // Three exact answers decide it; the two others are not waited for.
    assert!(matches!(
        first(Rule::Exact, &[Some(500), None, Some(500), None, Some(500)]),
        Some(First::Held { token: 500, on }) if on == [0, 2, 4]
    ));
    // Two exact, two pending: undecided.
    assert!(first(Rule::Exact, &[Some(500), None, Some(500), None, Some(900)]).is_none());
    // Three that cannot be exact: step 3 with the grants in so far.
    let Some(First::Commit(c)) = first(
        Rule::Exact,
        &[Some(500), Some(700), Some(900), Some(800), None],
    ) else {
        panic!("step 3");
    };
    assert_eq!((c.token(), c.on()), (900, &[0, 1, 2, 3][..]));
    // A majority cannot grant: failed at once.
    assert!(matches!(
        first(Rule::Exact, &[Some(0), Some(-2), None, Some(0), Some(500)]),
        Some(First::Failed)
    ));
    // A majority of different tokens holds nothing: step 3 (the unsafe
    // rule of the control would hold with the proposal).
    let different = [Some(600), Some(700), Some(800), Some(0), Some(0)];
    assert!(matches!(
        first(Rule::Exact, &different),
        Some(First::Commit(_))
    ));
    assert!(matches!(
        first(Rule::AtLeast, &different),
        Some(First::Held { token: 500, .. })
    ));
    // Without the commit step: every reply, then the highest.
    assert!(
        first(
            Rule::WithoutCommit,
            &[Some(500), Some(500), Some(500), None, Some(9000)]
        )
        .is_none()
    );
    assert!(matches!(
        first(
            Rule::WithoutCommit,
            &[Some(500), Some(500), Some(500), Some(-2), Some(9000)]
        ),
        Some(First::Held { token: 9000, .. })
    ));
}

#[test]
fn a_commit_round_is_decided_by_a_majority_not_the_slowest_master() {
    let commit = Commit::new(vec![(0, 9), (1, 5), (2, 7), (3, 8), (4, 6)], 3).unwrap();
    let decide = |r: &[Option<i64>]| commit.decide(&step1(r), |i| format!("m{i}"));
    assert!(matches!(
        decide(&[Some(9), None, Some(9), Some(9), None]),
        Some(Committed::Held { token: 9, .. })
    ));
    assert!(decide(&[Some(9), None, Some(9), None, None]).is_none());
    assert!(matches!(
        decide(&[Some(9), Some(-2), Some(-2), Some(-2), None]),
        Some(Committed::Failed)
    ));
    let Some(Committed::Again(next, outliers)) =
        decide(&[Some(9), Some(-1), Some(-1), Some(-1), None])
    else {
        panic!("another round without master 0");
    };
    assert_eq!(
        (next.token(), next.on(), outliers.len()),
        (8, &[1, 2, 3][..], 1)
    );
}

#[test]
fn a_release_is_decided_by_a_majority() {
    let r = |v: &[Option<i64>]| -> Vec<Option<Result<i64, ()>>> {
        v.iter().map(|x| x.map(Ok)).collect()
    };
    assert_eq!(
        release_outcome(&r(&[Some(1), None, Some(1), Some(1), None]), 5),
        Some(true)
    );
    assert_eq!(
        release_outcome(&r(&[Some(1), None, Some(0), Some(0), Some(0)]), 5),
        Some(false)
    );
    assert_eq!(
        release_outcome(&r(&[Some(1), None, Some(0), Some(1), None]), 5),
        None
    );
}

#[test]
fn proposals_follow_the_majoritys_clocks_and_stay_above_the_previous_one() {
    const MS: u64 = 1024;
    let mut p = Proposer::default();
    let now = 1_000_000;
    let a = p.propose(now, 7);
    assert_eq!(
        a,
        (now as u64 + 20) * MS + 8,
        "20 ms ahead, low bits 1 to 255"
    );
    // Within the same ms: above the previous proposal.
    let b = p.propose(now, 0);
    assert_eq!(b, a + 1);
    // Three masters' clock tokens came back 5 s above this clock, two
    // answered exactly: the offset follows the majority.
    let replies = step1(&[
        Some(b as i64),
        Some(((now + 5000) as u64 * MS) as i64),
        Some(((now + 5001) as u64 * MS) as i64),
        Some(((now + 5002) as u64 * MS) as i64),
        Some(b as i64),
    ]);
    p.learn(now, b, &replies);
    assert_eq!(p.offset_ms(), 5000);
    assert!(p.propose(now + 1, 0) > (now as u64 + 5002) * MS);
    // One master 400 days ahead (an outlier) does not move it.
    let mut p = Proposer::default();
    let c = p.propose(now, 0);
    let far = ((now + 400 * 86_400_000) as u64 * MS) as i64;
    p.learn(
        now,
        c,
        &step1(&[
            Some(far),
            Some(c as i64),
            Some(c as i64),
            Some(c as i64),
            Some(-2),
        ]),
    );
    assert_eq!(p.offset_ms(), 0);
    // A majority behind (tokens from step 1 without FLOOR, after refusing
    // the proposal): the offset goes back with them.
    let behind = ((now - 3000) as u64 * MS) as i64;
    p.learn(
        now,
        c,
        &step1(&[
            Some(behind),
            Some(behind),
            Some(behind),
            Some(c as i64),
            None,
        ]),
    );
    assert_eq!(p.offset_ms(), -3000);
}
