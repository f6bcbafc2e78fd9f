//! CLUSTER NODES, as far as walrus reads it: one line a node,
//! `id ip:port@busport[,hostname] flags primary ping pong epoch link slot...`.

use std::net::IpAddr;

/// One node as the Valkey asked sees it.
#[derive(Debug, PartialEq, Eq)]
pub struct Node<'a> {
    pub id: &'a str,
    /// The address its clients are told (a walrus's), `None` while Valkey knows none
    /// (`noaddr`, or `:0`).
    pub ip: Option<IpAddr>,
    pub port: u16,
    pub bus_port: u16,
    flags: Vec<&'a str>,
    slots: Vec<&'a str>,
}

impl<'a> Node<'a> {
    fn parse(line: &'a str) -> Option<Node<'a>> {
        let mut fields = line.split_whitespace();
        let id = fields.next()?;
        let addr = fields.next()?;
        let flags = fields.next()?.split(',').collect();
        // primary, ping sent, pong received, epoch, link state.
        let slots = fields.skip(5).collect();
        let addr = addr.split(',').next()?;
        let (ip_port, bus) = addr.split_once('@')?;
        let (ip, port) = ip_port.rsplit_once(':')?;
        Some(Node {
            id,
            ip: ip.parse().ok(),
            port: port.parse().ok()?,
            bus_port: bus.parse().ok()?,
            flags,
            slots,
        })
    }

    fn flagged(&self, flag: &str) -> bool {
        self.flags.contains(&flag)
    }

    pub fn myself(&self) -> bool {
        self.flagged("myself")
    }

    /// Not heard from for `cluster-node-timeout` (suspected failed, `fail?`), failed, or
    /// with no address at all. A link down for a moment, as while nodes are being met, is
    /// not that.
    pub fn unreachable(&self) -> bool {
        ["fail", "fail?", "noaddr"].iter().any(|f| self.flagged(f))
    }

    /// The slots it owns: `0-5460`, `7000`; the `[slot->-node]` entries of a migration are
    /// not owned slots.
    pub fn owned_slots(&self) -> i64 {
        self.slots
            .iter()
            .filter(|r| !r.starts_with('['))
            .map(|r| match r.split_once('-') {
                Some((a, b)) => match (a.parse::<i64>(), b.parse::<i64>()) {
                    (Ok(a), Ok(b)) => b - a + 1,
                    _ => 0,
                },
                None => i64::from(r.parse::<u16>().is_ok()),
            })
            .sum()
    }
}

/// Every node of a CLUSTER NODES reply; lines walrus cannot read are left out.
pub fn parse(text: &str) -> Vec<Node<'_>> {
    text.lines().filter_map(Node::parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "a 127.0.0.1:7001@17001 master - 0 0 1 connected 0-5460\n\
        b 127.0.0.1:7002@17002,pod-1.walrus myself,master - 0 0 2 connected 5461-10922 12000 [13000->-c] [14000-<-c]\n\
        c ::1:7003@17003 master,fail? - 0 0 3 connected 10923-11999 12001-16383\n\
        d :0@0 master,noaddr - 0 0 4 disconnected\n\
        e 127.0.0.5:7005@17005 master - 0 0 5 disconnected 0\n";

    #[test]
    fn reads_addresses_flags_and_owned_slots() {
        let nodes = parse(NODES);
        assert_eq!(nodes.len(), 5);
        let me: Vec<_> = nodes.iter().filter(|n| n.myself()).collect();
        assert_eq!(me.len(), 1);
        assert_eq!(me[0].ip, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(me[0].id, "b");
        assert_eq!((me[0].port, me[0].bus_port), (7002, 17002));
        assert_eq!(me[0].owned_slots(), 5462 + 1);
        assert_eq!(nodes[2].ip, Some("::1".parse().unwrap()));
        assert_eq!(nodes[2].port, 7003);
        let unreachable: Vec<_> = nodes.iter().map(Node::unreachable).collect();
        assert_eq!(unreachable, [false, false, true, true, false]);
        assert_eq!(nodes[4].owned_slots(), 1);
        assert_eq!(nodes[3].ip, None);
        assert_eq!(nodes[3].owned_slots(), 0);
        assert!(parse("x 1:2@3 myself,master - 0 0 1 connected\n")[0].owned_slots() == 0);
        assert!(parse("").is_empty());
    }
}
