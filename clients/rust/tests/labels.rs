//! Labels (`LABEL`) and the waiters' list (`LEASE.WAITERS`), design.md S11,
//! through the sync and the async clients, against real servers (Redis 7.0
//! and 8.2, Valkey 8.1 and 9.1).

#![cfg(feature = "tokio")]

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Server, wait_until};
use redis::Value;
use redis_lease_client::{Block, Label, LeaseClient, Mode, Waiter, default_label};
use support::LossyProxy;

const MS: fn(u64) -> Duration = Duration::from_millis;

fn client(s: &Server) -> LeaseClient {
    LeaseClient::open(&s.url(false)).unwrap()
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A field of a RESP2 flat array.
fn field<'a>(flat: &'a [Value], name: &str) -> &'a Value {
    let i = flat
        .iter()
        .position(|v| text(v).as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no field {name} in {flat:?}"));
    &flat[i + 1]
}

/// `LEASE.INFO key`'s label of an exclusive lease (`None`: no label).
fn label_of(c: &mut redis::Connection, key: &str) -> Option<String> {
    let info: Vec<Value> = redis::cmd("LEASE.INFO").arg(key).query(c).unwrap();
    assert!(!info.is_empty(), "{key} is not held");
    text(field(&info, "label"))
}

/// The label of each holder of a counting or shared lease, by token.
fn holder_labels(c: &mut redis::Connection, key: &str) -> Vec<Option<String>> {
    let info: Vec<Value> = redis::cmd("LEASE.INFO").arg(key).query(c).unwrap();
    let Value::Array(holders) = field(&info, "holders") else {
        panic!("no holders in {info:?}")
    };
    holders
        .iter()
        .map(|h| match h {
            Value::Array(flat) => text(field(flat, "label")),
            other => panic!("a holder {other:?}"),
        })
        .collect()
}

fn waiting(c: &LeaseClient, key: &str, n: usize) -> Vec<Waiter> {
    let mut found = Vec::new();
    assert!(
        wait_until(Duration::from_secs(5), || {
            found = c.waiters(key, None).unwrap();
            found.len() >= n
        }),
        "{} waiters, not {n}",
        found.len()
    );
    found
}

full_suite! {
    fn the_default_label_names_the_host_the_pid_and_the_executable(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let label = default_label();
        let exe = std::env::current_exe().unwrap();
        let exe = exe.file_name().unwrap().to_string_lossy();
        assert!(label.ends_with(&format!(" pid {} {exe}", std::process::id())), "{label}");
        assert!(!label.starts_with(' ') && label.len() <= 256);
        assert!(std::ptr::eq(label, default_label()), "computed once per process");
        let client = client(&s);
        assert_eq!(client.label(), Some(label));
        let mut lease = client.acquire("job", MS(10_000), Block::NoWait).unwrap().unwrap();
        assert_eq!(label_of(&mut c, "job").as_deref(), Some(label));
        let info: Vec<Value> = redis::cmd("LEASE.INFO").arg("job").query(&mut c).unwrap();
        let since: i64 = redis::from_redis_value(field(&info, "since").clone()).unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        assert!((since - now).abs() < 60_000, "since is unix time in ms");
        assert!(lease.renew().unwrap());
        let info: Vec<Value> = redis::cmd("LEASE.INFO").arg("job").query(&mut c).unwrap();
        let again: i64 = redis::from_redis_value(field(&info, "since").clone()).unwrap();
        assert_eq!(again, since, "a renewal keeps since");
        assert!(lease.release().unwrap());
    }

    fn a_label_per_client_or_per_call_or_none(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let cases = [
            (Label::None, None),
            (Label::text(""), None),
            (Label::text("worker-7 job 991"), Some("worker-7 job 991".to_string())),
            (Label::text("é".repeat(200)), Some("é".repeat(128))),
            (Label::text(format!("x{}", "é".repeat(200))), Some(format!("x{}", "é".repeat(127)))),
            (Label::Default, Some(default_label().to_string())),
        ];
        let base = client(&s);
        for (label, expected) in cases {
            // For one call: a labelled clone (it shares the pool and the watchdog).
            let lease = base.clone().with_label(label.clone()).acquire("job", MS(10_000), Block::NoWait).unwrap().unwrap();
            assert_eq!(label_of(&mut c, "job"), expected, "{label:?}");
            assert!(lease.release().unwrap());
        }
        let off = base.clone().with_label(Label::None);
        assert_eq!(off.label(), None);
        let many = off.acquire_many(&["{m}1", "{m}2"], MS(10_000), Block::NoWait).unwrap().unwrap();
        assert_eq!(label_of(&mut c, "{m}2"), None);
        assert!(many.release().unwrap());
        let mover = base.with_label(Label::text("transfer 12"));
        let many = mover.acquire_many(&["{m}1", "{m}2"], MS(10_000), Block::NoWait).unwrap().unwrap();
        assert_eq!(label_of(&mut c, "{m}1").as_deref(), Some("transfer 12"));
        assert_eq!(label_of(&mut c, "{m}2").as_deref(), Some("transfer 12"));
        assert!(many.release().unwrap());
        let permits = mover.clone().with_mode(Mode::Limit(2));
        let one = permits.acquire("sem", MS(10_000), Block::NoWait).unwrap().unwrap();
        // Another client: clones share what they hold (AlreadyHeld).
        let two = client(&s).with_mode(Mode::Limit(2)).with_label(Label::None).acquire("sem", MS(10_000), Block::NoWait).unwrap().unwrap();
        assert_eq!(holder_labels(&mut c, "sem"), [Some("transfer 12".to_string()), None]);
        let reader = mover.with_mode(Mode::Shared).acquire("rw", MS(10_000), Block::NoWait).unwrap().unwrap();
        assert_eq!(holder_labels(&mut c, "rw"), [Some("transfer 12".to_string())]);
        for l in [one, two, reader] {
            assert!(l.release().unwrap());
        }
    }

    fn a_lost_reply_is_retried_with_the_same_label(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let proxy = LossyProxy::start(s.port);
        let client = LeaseClient::open(&proxy.url()).unwrap().with_label(Label::text("retried"));
        proxy.arm();
        let lease = client.acquire("job", MS(10_000), Block::For(MS(1000))).unwrap().expect("the retry's lease");
        assert_eq!(proxy.dropped(), 1, "the first reply was lost");
        assert_eq!(label_of(&mut c, "job").as_deref(), Some("retried"));
        assert!(lease.release().unwrap());
    }

    fn the_waiters_list_shows_labels_modes_and_times_oldest_first(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let lister = client(&s);
        assert!(lister.waiters("job", None).unwrap().is_empty());
        let _: i64 = redis::cmd("LEASE.ACQUIRE").arg("job").arg("holder").arg(10_000).query(&mut c).unwrap();
        let first = client(&s).with_label(Label::text("first waiter"));
        let a = thread::spawn(move || {
            let lease = first.acquire("job", MS(10_000), Block::Forever).unwrap();
            lease.map(|l| l.release().unwrap())
        });
        waiting(&lister, "job", 1);
        let second = client(&s).with_label(Label::None);
        let b = thread::spawn(move || {
            let lease = second.acquire_many(&["job"], MS(10_000), Block::For(MS(8000))).unwrap();
            lease.map(|l| l.release().unwrap())
        });
        let ws = waiting(&lister, "job", 2);
        assert_eq!(ws[0].label.as_deref(), Some("first waiter"), "oldest first");
        assert_eq!(ws[1].label, None);
        assert_eq!((ws[0].mode.as_str(), ws[0].limit, ws[0].keys), ("exclusive", 0, 1));
        assert_eq!((ws[1].mode.as_str(), ws[1].keys), ("keys", 1));
        assert_eq!(ws[0].timeout, None, "BLOCK 0 waits forever");
        assert!(ws[1].timeout.is_some_and(|t| t > Duration::ZERO && t <= MS(8000)));
        assert!(ws.iter().all(|w| w.client > 0));
        let only = lister.waiters("job", Some(1)).unwrap();
        assert_eq!(only.len(), 1, "COUNT 1");
        assert_eq!(only[0].label.as_deref(), Some("first waiter"));
        assert!(matches!(lister.waiters("job", Some(0)), Err(redis_lease_client::Error::InvalidCount(0))));
        assert!(matches!(lister.waiters("job", Some(1001)), Err(redis_lease_client::Error::InvalidCount(1001))));
        let _: i64 = redis::cmd("LEASE.RELEASE").arg("job").arg("holder").query(&mut c).unwrap();
        assert_eq!(a.join().unwrap(), Some(true), "the first waiter is served");
        assert_eq!(b.join().unwrap(), Some(true), "then the second");
        assert!(lister.waiters("job", None).unwrap().is_empty());
    }

    fn the_async_client_labels_and_lists_waiters(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let url = s.url(false);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            use redis_lease_client::aio::LeaseClient;
            let client = LeaseClient::open(&url).unwrap().with_label(Label::text("async worker"));
            assert_eq!(client.label(), Some("async worker"));
            let holder = client.acquire("job", MS(10_000), Block::NoWait).await.unwrap().unwrap();
            assert_eq!(label_of(&mut c, "job").as_deref(), Some("async worker"));
            let reader = LeaseClient::open(&url).unwrap().with_mode(Mode::Shared).with_label(Label::text("reader"));
            let waiter = tokio::spawn(async move {
                reader.acquire("job", MS(10_000), Block::For(MS(5000))).await.unwrap()
            });
            let mut found = Vec::new();
            for _ in 0..500 {
                found = client.waiters("job", Some(5)).await.unwrap();
                if !found.is_empty() {
                    break;
                }
                tokio::time::sleep(MS(10)).await;
            }
            assert_eq!(found.len(), 1);
            assert_eq!((found[0].label.as_deref(), found[0].mode.as_str()), (Some("reader"), "shared"));
            assert!(holder.release().await.unwrap());
            let lease = tokio::time::timeout(MS(10_000), waiter).await.unwrap().unwrap().expect("served");
            assert_eq!(holder_labels(&mut c, "job"), [Some("reader".to_string())]);
            assert!(lease.release().await.unwrap());
            let off = client.clone().with_label(Label::None);
            let many = off.acquire_many(&["{k}1", "{k}2"], MS(10_000), Block::NoWait).await.unwrap().unwrap();
            assert_eq!(label_of(&mut c, "{k}1"), None);
            assert!(many.release().await.unwrap());
            assert!(client.waiters("job", None).await.unwrap().is_empty());
        });
    }
}
