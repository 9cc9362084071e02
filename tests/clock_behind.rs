//! A node whose clock is over a year behind the tokens it is given
//! (design.md S3: a replica takes its master's state, never a result of its
//! own clock). The one-year bound on stored tokens (design.md S2) is for a
//! client's payload (RESTORE, MIGRATE); an RDB load and a full sync take
//! what they are given, raise the token clock, and log a warning. Clocks
//! are shifted with the LD_PRELOAD shim of tests/shim/clockshift.c.
mod common;
use common::*;

/// Two years, in milliseconds.
const TWO_YEARS_MS: i64 = 2 * 365 * 86_400_000;
const WARNING: &str = "loaded a lease value far ahead of this server's clock";

/// Is `token` more than a year of wall clock ahead of now?
fn over_a_year_ahead(token: i64) -> bool {
    token / 1024 > now_ms() + 365 * 86_400_000
}

full_suite! {
    fn a_replica_whose_clock_is_years_behind_takes_the_full_sync(kind) {
        let ahead = ClockShift::new(TWO_YEARS_MS);
        let master = Server::start_with(kind, Opts::default().clock(&ahead));
        let mut m = master.conn();
        let t = acquire(&mut m, "k", "me", "30000");
        assert!(over_a_year_ahead(t), "the master's clock runs two years ahead: token {t}");
        let t_holders = acquire_opts(&mut m, "sem", "me", "30000", &["LIMIT", "3"]).unwrap();
        let mut replica = replica_of(kind, &master);
        replica.assert_alive("a full sync of tokens two years ahead", false);
        let mut r = replica.conn();
        assert_eq!(token_of(&mut r, "k"), Some(t), "the replica has the master's lease");
        assert_eq!(holders(&ok(&mut r, &["LEASE.INFO", "sem"])).len(), 1);
        assert!(replica.log().contains(WARNING), "{}", replica.log_tail(20));
        // Promoted, it issues tokens above what it was given.
        ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
        assert!(acquire(&mut r, "k2", "me", "30000") > t.max(t_holders));
    }

    fn a_server_whose_clock_stepped_back_loads_its_own_rdb(kind) {
        let ahead = ClockShift::new(TWO_YEARS_MS);
        let s = Server::start_with(kind, Opts::default().clock(&ahead));
        let mut c = s.conn();
        let t = acquire(&mut c, "k", "me", "30000");
        let payload = dump_payload(&mut c, "k");
        ok(&mut c, &["SAVE"]);
        // The clock steps back two years (a VM restored with an old clock):
        // the same server starts on its own RDB.
        let mut s = s.restart_with(Opts::default());
        s.assert_alive("a start on an RDB with tokens two years ahead", false);
        let mut c = s.conn();
        assert_eq!(token_of(&mut c, "k"), Some(t));
        assert!(s.log().contains(WARNING), "{}", s.log_tail(20));
        assert!(acquire(&mut c, "k2", "me", "30000") > t, "the token clock goes on from it");
        // A client's payload is still bound to a year ahead.
        let mut fresh = Server::start(kind);
        let mut f = fresh.conn();
        let e = call(&mut f, &[b"RESTORE", b"k", b"0", &payload]).unwrap_err();
        assert!(error_text(&e).contains("Bad data format"), "{e}");
        assert_eq!(int(&ok(&mut f, &["EXISTS", "k"])), 0);
        assert!(fresh.log().contains("more than 365 days ahead"), "{}", fresh.log_tail(10));
        fresh.assert_alive("a refused RESTORE", false);
    }
}
