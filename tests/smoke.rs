//! The quick start works on both servers: load, acquire, info, release.
mod common;
use common::*;

full_suite! {
    fn quick_start(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let token = int(&ok(&mut c, &["LEASE.ACQUIRE", "job:1", "me", "30000"]));
        assert!(token > 0);
        let info = ok(&mut c, &["LEASE.INFO", "job:1"]);
        assert_eq!(field(&info, "token"), Some(Value::Int(token)));
        assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", "job:1", "me"])), 1);
        assert_eq!(ok(&mut c, &["LEASE.INFO", "job:1"]), Value::Nil);
    }
}
