//! Every lease command, in every mode and with every option, on a key that
//! does not exist (nor ever did): answers as on a free key, and the server
//! stays up. Redis 8.2 dereferences the missing value of a key opened for
//! writing that holds nothing in `RedisModule_GetAbsExpire` (up to 8.0 that
//! call answered "no expire"): a BLOCK, LIMIT or SHARED acquire on such a
//! key killed it. No call on an empty key reaches the server now.
mod common;
use common::*;

every_server! {
    fn every_command_on_a_missing_key_answers_and_the_server_stays_up(kind) {
        let s = Server::start(kind);
        let mut c = s.conn();
        let acquires: [&[&str]; 8] = [
            &[],
            &["BLOCK", "100"],
            &["BLOCK", "0"],
            &["LIMIT", "3"],
            &["LIMIT", "3", "BLOCK", "100"],
            &["SHARED"],
            &["SHARED", "BLOCK", "100"],
            &["BLOCK", "100", "LIMIT", "100000"],
        ];
        for (i, opts) in acquires.iter().enumerate() {
            let key = format!("missing:{i}");
            let mut args = vec!["LEASE.ACQUIRE", &key, "o", "30000"];
            args.extend_from_slice(opts);
            let v = ok(&mut c, &args);
            assert!(matches!(v, Value::Int(t) if t > 0), "{kind:?}: {args:?} answered {v:?}");
            assert_eq!(ok(&mut c, &["PING"]), Value::SimpleString("PONG".into()), "after {args:?}");
        }
        for key in ["never:1", "never:2"] {
            assert_eq!(int(&ok(&mut c, &["LEASE.RENEW", key, "o", "1000"])), 0);
            assert_eq!(int(&ok(&mut c, &["LEASE.RELEASE", key, "o"])), 0);
            assert!(err(&mut c, &["LEASE.FENCE", key, "5"]).starts_with("STALE"));
            assert!(err(&mut c, &["LEASE.FENCE", key, "5", "SET", key, "x"]).starts_with("STALE"));
            assert_eq!(ok(&mut c, &["LEASE.INFO", key]), Value::Nil);
            assert_eq!(int(&ok(&mut c, &["EXISTS", key])), 0, "nothing was created");
        }
        // The same inside MULTI/EXEC and a script, where BLOCK does not block.
        ok(&mut c, &["MULTI"]);
        ok(&mut c, &["LEASE.ACQUIRE", "tx:1", "o", "30000", "BLOCK", "100"]);
        ok(&mut c, &["LEASE.ACQUIRE", "tx:2", "o", "30000", "LIMIT", "2"]);
        ok(&mut c, &["LEASE.ACQUIRE", "tx:3", "o", "30000", "SHARED"]);
        let Value::Array(replies) = ok(&mut c, &["EXEC"]) else { panic!("EXEC") };
        assert!(replies.iter().all(|r| matches!(r, Value::Int(_))), "{replies:?}");
        let v = ok(&mut c, &[
            "EVAL",
            "return redis.call('LEASE.ACQUIRE', KEYS[1], 'o', '30000', 'LIMIT', '2', 'BLOCK', '10')",
            "1",
            "lua:1",
        ]);
        assert!(matches!(v, Value::Int(_)), "{v:?}");
        assert_eq!(ok(&mut c, &["PING"]), Value::SimpleString("PONG".into()));
    }
}
