//! Which connections the metrics listener keeps when it has too many: a
//! pure table, told of each connection as it is accepted, reads its request
//! and ends, that answers which connections to close.
//!
//! Any local user can connect to a loopback listener, from the same
//! address as Prometheus. Refusing newcomers when full (what the listener
//! did) lets 16 idle connections, renewed as they time out, refuse every
//! scrape. So a newcomer is always accepted and, when a limit is passed,
//! the oldest connection that has not yet sent its request is closed
//! instead: a scrape sends its request at once, so it is never the oldest
//! idle one for long, while connections that send nothing (or a byte a
//! second) are the first to go. Per peer address first, so one address
//! cannot crowd out another; then in all, to bound the listener's file
//! descriptors. A connection already answered is closed only when a peer
//! holds nothing else to close (it is being written to, for at most the
//! write timeout).
//!
//! Order is age: ids only grow, so the smallest id is the oldest.

use std::collections::BTreeMap;
use std::net::IpAddr;

/// How many connections are kept.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// From one peer address.
    pub per_peer: usize,
    /// In all.
    pub total: usize,
}

struct Conn<H> {
    peer: IpAddr,
    /// Still reading its request (the ones closed first).
    reading: bool,
    handle: Option<H>,
}

/// The open connections; `H` is what closes one (a task's abort handle).
pub struct Admission<H> {
    limits: Limits,
    next: u64,
    conns: BTreeMap<u64, Conn<H>>,
}

impl<H> Admission<H> {
    pub fn new(limits: Limits) -> Self {
        Admission {
            limits,
            next: 0,
            conns: BTreeMap::new(),
        }
    }

    /// A connection from `peer` was accepted: its id, and the handles of the
    /// connections to close to stay within the limits (see the module).
    /// `arrived` says whether a connection still reading has its request
    /// waiting already (its task has not run yet: on a busy machine a scrape
    /// can wait that long while a flood opens dozens of connections); such a
    /// one counts as answered, not idle.
    pub fn admit(&mut self, peer: IpAddr, arrived: impl Fn(&H) -> bool) -> (u64, Vec<H>) {
        let id = self.next;
        self.next += 1;
        self.conns.insert(
            id,
            Conn {
                peer,
                reading: true,
                handle: None,
            },
        );
        let mut closed = Vec::new();
        while self.conns.values().filter(|c| c.peer == peer).count() > self.limits.per_peer {
            let Some(victim) = self.oldest(id, |c| c.peer == peer) else {
                break;
            };
            if !self.spared(victim, &arrived) {
                closed.extend(self.conns.remove(&victim).and_then(|c| c.handle));
            }
        }
        while self.conns.len() > self.limits.total {
            let Some(victim) = self.oldest(id, |_| true) else {
                break;
            };
            if !self.spared(victim, &arrived) {
                closed.extend(self.conns.remove(&victim).and_then(|c| c.handle));
            }
        }
        (id, closed)
    }

    /// Whether `victim`, still reading, has its request waiting after all:
    /// then it is marked answered (and the next victim is looked for; each
    /// connection is spared at most once, so the loops end).
    fn spared(&mut self, victim: u64, arrived: &impl Fn(&H) -> bool) -> bool {
        let Some(c) = self.conns.get_mut(&victim) else {
            return false;
        };
        if c.reading && c.handle.as_ref().is_some_and(arrived) {
            c.reading = false;
            return true;
        }
        false
    }

    /// The oldest connection (other than `newcomer`) matching `which`,
    /// preferring one still reading its request.
    fn oldest(&self, newcomer: u64, which: impl Fn(&Conn<H>) -> bool) -> Option<u64> {
        let candidates = || {
            self.conns
                .iter()
                .filter(|(id, c)| **id != newcomer && which(c))
        };
        candidates()
            .find(|(_, c)| c.reading)
            .or_else(|| candidates().next())
            .map(|(id, _)| *id)
    }

    /// What closes connection `id` (given once its task is started). False
    /// if it was closed meanwhile: then `handle` should be used at once.
    pub fn set_handle(&mut self, id: u64, handle: H) -> Result<(), H> {
        match self.conns.get_mut(&id) {
            Some(c) => {
                c.handle = Some(handle);
                Ok(())
            }
            None => Err(handle),
        }
    }

    /// Connection `id` has sent its whole request.
    pub fn request_read(&mut self, id: u64) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.reading = false;
        }
    }

    /// Connection `id` is closed.
    pub fn done(&mut self, id: u64) {
        self.conns.remove(&id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.conns.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    const OTHER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 7));

    /// Admit a connection whose handle is its own id.
    fn admit(table: &mut Admission<u64>, peer: IpAddr) -> (u64, Vec<u64>) {
        let (id, closed) = table.admit(peer, |_| false);
        table.set_handle(id, id).unwrap();
        (id, closed)
    }

    #[test]
    fn a_newcomer_is_kept_and_the_oldest_idle_connection_of_its_peer_closed() {
        let mut t = Admission::new(Limits {
            per_peer: 3,
            total: 10,
        });
        let ids: Vec<u64> = (0..3).map(|_| admit(&mut t, LOCAL).0).collect();
        // The first has sent its request: it is being answered.
        t.request_read(ids[0]);
        let (scrape, closed) = admit(&mut t, LOCAL);
        assert_eq!(closed, [ids[1]], "the oldest still reading goes");
        let (next, closed) = admit(&mut t, LOCAL);
        assert_eq!(closed, [ids[2]]);
        // Only answered ones left: the oldest of the peer goes.
        t.request_read(scrape);
        t.request_read(next);
        let (_, closed) = admit(&mut t, LOCAL);
        assert_eq!(closed, [ids[0]]);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn a_connection_whose_request_waits_unread_is_not_closed_as_idle() {
        let mut t = Admission::new(Limits {
            per_peer: 3,
            total: 10,
        });
        // A scrape whose task has not run yet (its request is waiting),
        // then a flood of idle connections from the same address.
        let (scrape, _) = admit(&mut t, LOCAL);
        let waiting = |h: &u64| *h == scrape;
        for _ in 0..20 {
            let (id, closed) = t.admit(LOCAL, waiting);
            t.set_handle(id, id).unwrap();
            assert!(!closed.contains(&scrape), "the scrape was closed");
        }
        assert_eq!(t.len(), 3);
        // Told nothing arrived, the oldest idle one would have gone.
        let mut t = Admission::new(Limits {
            per_peer: 1,
            total: 10,
        });
        let (first, _) = admit(&mut t, LOCAL);
        let (_, closed) = admit(&mut t, LOCAL);
        assert_eq!(closed, [first]);
    }

    #[test]
    fn one_peer_never_closes_another_peers_connections_below_the_total() {
        let mut t = Admission::new(Limits {
            per_peer: 2,
            total: 4,
        });
        let (prometheus, _) = admit(&mut t, OTHER);
        for _ in 0..50 {
            let (_, closed) = admit(&mut t, LOCAL);
            assert!(!closed.contains(&prometheus));
        }
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn the_total_is_kept_by_closing_the_oldest_idle_connection_of_anyone() {
        let mut t = Admission::new(Limits {
            per_peer: 10,
            total: 3,
        });
        let peers: Vec<IpAddr> = (1..=4)
            .map(|n| IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, n)))
            .collect();
        let (a, _) = admit(&mut t, peers[0]);
        let (b, _) = admit(&mut t, peers[1]);
        t.request_read(a);
        admit(&mut t, peers[2]);
        let (_, closed) = admit(&mut t, peers[3]);
        assert_eq!(
            closed,
            [b],
            "the oldest still reading, not the answered one"
        );
    }

    #[test]
    fn a_connection_closed_before_its_handle_is_given_says_so() {
        let mut t: Admission<u64> = Admission::new(Limits {
            per_peer: 1,
            total: 10,
        });
        let (first, _) = t.admit(LOCAL, |_| false);
        let (_, closed) = admit(&mut t, LOCAL);
        assert!(closed.is_empty(), "no handle yet");
        assert_eq!(t.set_handle(first, 99), Err(99));
        t.done(first);
        assert_eq!(t.len(), 1);
    }
}
