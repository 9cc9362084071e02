//! Redis Cluster: where a slot that this node no longer serves has gone, so
//! a waiter whose key left the node is redirected as the server redirects
//! clients blocked on keys (`-ASK` while the slot migrates, `-MOVED` once it
//! has moved). Reads the text of `CLUSTER NODES`. And the slot of a key,
//! as the server computes it.

/// One line of `CLUSTER NODES`.
struct Node<'a> {
    id: &'a str,
    /// `ip:port`, without the cluster bus port and hostname.
    addr: &'a str,
    myself: bool,
    /// Slot ranges and `[slot->-id]` / `[slot-<-id]` migration entries.
    slots: Vec<&'a str>,
}

fn parse(line: &str) -> Option<Node<'_>> {
    let mut fields = line.split_ascii_whitespace();
    let id = fields.next()?;
    let addr_field = fields.next()?;
    let flags = fields.next()?;
    let addr = addr_field.split(['@', ',']).next()?;
    // master, ping-sent, pong-recv, config-epoch, link-state
    let slots: Vec<&str> = fields.skip(5).collect();
    Some(Node {
        id,
        addr,
        myself: flags.split(',').any(|f| f == "myself"),
        slots,
    })
}

fn serves(range: &str, slot: u16) -> bool {
    if range.starts_with('[') {
        return false;
    }
    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
    match (lo.parse::<u16>(), hi.parse::<u16>()) {
        (Ok(lo), Ok(hi)) => (lo..=hi).contains(&slot),
        _ => false,
    }
}

/// The redirection for a key of `slot` that this node does not serve, as
/// the error text the server would send (`ASK <slot> <ip:port>` or `MOVED
/// <slot> <ip:port>`); `None` when `nodes` does not say where it went.
pub fn redirect(nodes: &str, slot: u16) -> Option<String> {
    let nodes: Vec<Node> = nodes.lines().filter_map(parse).collect();
    let addr_of = |id: &str| {
        nodes
            .iter()
            .find(|n| n.id == id)
            .map(|n| n.addr)
            .filter(|a| !a.starts_with(':'))
    };
    let me = nodes.iter().find(|n| n.myself)?;
    let migrating = format!("[{slot}->-");
    if let Some(target) = me
        .slots
        .iter()
        .find_map(|s| s.strip_prefix(migrating.as_str())?.strip_suffix(']'))
    {
        return addr_of(target).map(|a| format!("ASK {slot} {a}"));
    }
    let owner = nodes
        .iter()
        .find(|n| n.slots.iter().any(|r| serves(r, slot)))?;
    if owner.myself {
        return None;
    }
    addr_of(owner.id).map(|a| format!("MOVED {slot} {a}"))
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes
/// between the first `{` and the first `}` after it, when there are some)
/// or of the whole key, modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_are_the_servers() {
        // As CLUSTER KEYSLOT answers (Valkey 9.1).
        assert_eq!(key_slot(b"a"), 15495);
        assert_eq!(key_slot(b"b"), 3300);
        assert_eq!(key_slot(b"h"), 11694);
        assert_eq!(key_slot(b"{b}x"), 3300);
        assert_eq!(key_slot(b"g{b}"), 3300);
        // An empty tag hashes the whole key; only the first tag counts.
        assert_eq!(key_slot(b"{}b"), 6680);
        assert_eq!(key_slot(b"x{b}{a}"), 3300);
        // CRC16-XMODEM("123456789") is 0x31C3, below 16384.
        assert_eq!(key_slot(b"123456789"), 0x31C3);
    }

    const NODES: &str = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [93->-b2]
b2 127.0.0.1:7001@17001,host-b master - 0 1426238316232 2 connected 5461-10922 [93-<-a1]
c3 127.0.0.1:7002@17002 master - 0 1426238316232 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1426238317239 1 connected
";

    #[test]
    fn a_migrating_slot_asks_its_target() {
        assert_eq!(
            redirect(NODES, 93).as_deref(),
            Some("ASK 93 127.0.0.1:7001")
        );
    }

    #[test]
    fn a_slot_served_elsewhere_is_moved_to_its_owner() {
        assert_eq!(
            redirect(NODES, 12000).as_deref(),
            Some("MOVED 12000 127.0.0.1:7002")
        );
        assert_eq!(
            redirect(NODES, 5461).as_deref(),
            Some("MOVED 5461 127.0.0.1:7001")
        );
    }

    #[test]
    fn own_or_unknown_slots_have_no_redirect() {
        assert_eq!(redirect(NODES, 100), None);
        assert_eq!(redirect("", 100), None);
        let unassigned = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-100\n";
        assert_eq!(redirect(unassigned, 200), None);
        let no_addr = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-100\n\
                       b2 :0@0 master,noaddr - 0 0 2 disconnected 101-200\n";
        assert_eq!(redirect(no_addr, 150), None);
    }
}
