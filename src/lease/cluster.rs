//! Redis Cluster: where a slot that this node no longer serves has gone, so
//! a waiter whose key left the node is redirected as the server redirects
//! clients blocked on keys (`-ASK` while the slot migrates, `-MOVED` once it
//! has moved). Reads the text of `CLUSTER NODES`.

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

#[cfg(test)]
mod tests {
    use super::*;

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
