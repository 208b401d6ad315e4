//! Back-propagation bottleneck analysis (Flint §3.5, Algorithm 1).
//!
//! Flint observes that drives saturate first and that congestion shows on
//! the submission path. So the analysis starts from the congested drives,
//! marks the target port (IOPipe) each sits behind, then walks back along
//! the active sessions: a session to a congested drive is a victim and
//! marks its client's NetPipe congested; every other session that shares a
//! congested NetPipe is a victim too. The report says, for each victim,
//! which entity bounds it.
//!
//! Sluice can also see a port congest by itself: a target's own counters
//! give each drive's latency at the target, and when the clients' latency
//! exceeds it by a queueing delay, the time goes in the port's receive and
//! send path (or the network before it), not in the drive. Sessions to any
//! drive behind such a port are victims bounded by the IOPipe, and mark
//! their NetPipes as a congested drive's sessions do.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// An active NVMe/TCP session in the view: one client's I/O to one drive.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Session {
    /// The client (its NetPipe).
    pub client: String,
    pub drive: u64,
}

/// What bounds a victim session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bound {
    /// Its own drive is congested.
    Drive(u64),
    /// It shares its client's NetPipe with sessions to a congested drive.
    NetPipe(String),
    /// The port its drive sits behind is congested (seen from a target's
    /// own counters).
    IoPipe(String),
}

/// One epoch's analysis.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BottleneckReport {
    pub epoch: u64,
    pub congested_drives: Vec<u64>,
    /// Target ports (IOPipes) of the congested drives.
    pub congested_io_pipes: Vec<String>,
    /// Clients (NetPipes) with a session to a congested drive.
    pub congested_net_pipes: Vec<String>,
    /// Victim sessions, each with what bounds it.
    pub victims: Vec<(Session, Bound)>,
}

impl BottleneckReport {
    /// Whether `client`'s session to `drive` is a victim.
    pub fn is_victim(&self, client: &str, drive: u64) -> bool {
        self.victims
            .iter()
            .any(|(s, _)| s.client == client && s.drive == drive)
    }
}

/// Algorithm 1 over `sessions`, given the congested drives, the ports
/// found congested by themselves, and the port each drive sits behind.
pub fn analyze(
    epoch: u64,
    congested_drives: &BTreeSet<u64>,
    congested_ports: &BTreeSet<String>,
    drive_port: &BTreeMap<u64, String>,
    sessions: &BTreeSet<Session>,
) -> BottleneckReport {
    // L2-5: congested drives and their IOPipes.
    let mut io_pipes: BTreeSet<String> = congested_drives
        .iter()
        .filter_map(|d| drive_port.get(d).cloned())
        .collect();
    io_pipes.extend(congested_ports.iter().cloned());
    // L6-9: sessions to a congested drive: victims; their NetPipes congest.
    // So do sessions through a port congested by itself.
    let mut net_pipes = BTreeSet::new();
    let mut victims: BTreeMap<Session, Bound> = BTreeMap::new();
    for s in sessions {
        if congested_drives.contains(&s.drive) {
            net_pipes.insert(s.client.clone());
            victims.insert(s.clone(), Bound::Drive(s.drive));
        } else if let Some(p) = drive_port
            .get(&s.drive)
            .filter(|p| congested_ports.contains(*p))
        {
            net_pipes.insert(s.client.clone());
            victims.insert(s.clone(), Bound::IoPipe(p.clone()));
        }
    }
    // L10-13: every other session sharing a congested NetPipe.
    for s in sessions {
        if net_pipes.contains(&s.client) && !victims.contains_key(s) {
            victims.insert(s.clone(), Bound::NetPipe(s.client.clone()));
        }
    }
    BottleneckReport {
        epoch,
        congested_drives: congested_drives.iter().copied().collect(),
        congested_io_pipes: io_pipes.into_iter().collect(),
        congested_net_pipes: net_pipes.into_iter().collect(),
        victims: victims.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(client: &str, drive: u64) -> Session {
        Session {
            client: client.into(),
            drive,
        }
    }

    #[test]
    fn congestion_propagates_from_a_drive_to_the_sessions_sharing_its_clients_pipes() {
        let ports: BTreeMap<u64, String> = [(1, "t1".into()), (2, "t1".into()), (3, "t2".into())]
            .into_iter()
            .collect();
        let sessions: BTreeSet<Session> = [s("a", 1), s("a", 3), s("b", 2), s("c", 3)]
            .into_iter()
            .collect();
        let r = analyze(
            7,
            &[1].into_iter().collect(),
            &BTreeSet::new(),
            &ports,
            &sessions,
        );
        assert_eq!(r.epoch, 7);
        assert_eq!(r.congested_drives, vec![1]);
        assert_eq!(r.congested_io_pipes, vec!["t1".to_owned()]);
        assert_eq!(r.congested_net_pipes, vec!["a".to_owned()]);
        assert_eq!(
            r.victims,
            vec![
                (s("a", 1), Bound::Drive(1)),
                (s("a", 3), Bound::NetPipe("a".into())),
            ]
        );
        // b shares the port but not the drive or a pipe; c shares drive 3
        // with a victim, but drive 3 is not congested.
        assert!(!r.is_victim("b", 2) && !r.is_victim("c", 3));
    }

    #[test]
    fn a_port_congested_by_itself_bounds_every_session_behind_it() {
        let ports: BTreeMap<u64, String> = [(1, "t1".into()), (2, "t1".into()), (3, "t2".into())]
            .into_iter()
            .collect();
        let sessions: BTreeSet<Session> = [s("a", 1), s("b", 2), s("b", 3), s("c", 3)]
            .into_iter()
            .collect();
        let r = analyze(
            3,
            &BTreeSet::new(),
            &["t1".to_owned()].into_iter().collect(),
            &ports,
            &sessions,
        );
        assert!(r.congested_drives.is_empty());
        assert_eq!(r.congested_io_pipes, vec!["t1".to_owned()]);
        assert_eq!(r.congested_net_pipes, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(
            r.victims,
            vec![
                (s("a", 1), Bound::IoPipe("t1".into())),
                (s("b", 2), Bound::IoPipe("t1".into())),
                (s("b", 3), Bound::NetPipe("b".into())),
            ]
        );
        assert!(!r.is_victim("c", 3));
    }

    #[test]
    fn nothing_congested_means_no_victims() {
        let sessions: BTreeSet<Session> = [s("a", 1)].into_iter().collect();
        let r = analyze(
            1,
            &BTreeSet::new(),
            &BTreeSet::new(),
            &BTreeMap::new(),
            &sessions,
        );
        assert!(r.victims.is_empty() && r.congested_net_pipes.is_empty());
    }

    proptest::proptest! {
        /// Every victim either goes to a congested drive or shares a
        /// congested NetPipe, and every session to a congested drive is a
        /// victim.
        #[test]
        fn victims_are_exactly_the_sessions_behind_congestion(
            raw in proptest::collection::btree_set((0u8..5, 0u64..6), 0..20),
            congested in proptest::collection::btree_set(0u64..6, 0..3),
        ) {
            let sessions: BTreeSet<Session> = raw.iter().map(|(c, d)| s(&c.to_string(), *d)).collect();
            let r = analyze(0, &congested, &BTreeSet::new(), &BTreeMap::new(), &sessions);
            for x in &sessions {
                let to_congested = congested.contains(&x.drive);
                let shares = sessions.iter().any(|y| y.client == x.client && congested.contains(&y.drive));
                proptest::prop_assert_eq!(r.is_victim(&x.client, x.drive), to_congested || shares);
            }
        }
    }
}
