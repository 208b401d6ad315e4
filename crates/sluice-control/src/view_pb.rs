//! The shadow view's types to and from their gRPC messages. What comes off
//! the wire is checked: an entity with no kind, or a batch over the limit,
//! is refused naming the field.

use sluice_flint::auction::{Bid, Grant, Grants, SessionBid, BID_SESSIONS_MAX};
use sluice_flint::bottleneck::{BottleneckReport, Bound, Session};
use sluice_flint::view::{
    Ack, EntityView, IoSample, Notification, SampleBatch, Subscription, Untracked, ViewSnapshot,
    VolumeLoad, VOLUMES_IN_VIEW_MAX,
};
use sluice_flint::{Entity, WindowStats};

use crate::pb;

/// A message from the wire that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadView(pub String);

pub fn entity_to_pb(e: &Entity) -> pb::ViewEntity {
    use pb::view_entity::Kind;
    pb::ViewEntity {
        kind: Some(match e {
            Entity::NetPipe(c) => Kind::NetPipe(c.clone()),
            Entity::IoPipe(p) => Kind::IoPipe(p.clone()),
            Entity::Drive(d) => Kind::Drive(*d),
        }),
    }
}

pub fn entity_from_pb(e: Option<&pb::ViewEntity>, field: &str) -> Result<Entity, BadView> {
    use pb::view_entity::Kind;
    match e.and_then(|e| e.kind.as_ref()) {
        Some(Kind::NetPipe(c)) => Ok(Entity::NetPipe(c.clone())),
        Some(Kind::IoPipe(p)) => Ok(Entity::IoPipe(p.clone())),
        Some(Kind::Drive(d)) => Ok(Entity::Drive(*d)),
        None => Err(BadView(format!("{field}: an entity with no kind"))),
    }
}

/// A batch and a bid as one `ViewSync` message.
pub fn batch_to_pb(b: &SampleBatch, bids: &[SessionBid]) -> pb::ViewBatch {
    pb::ViewBatch {
        bids: bids
            .iter()
            .map(|s| pb::SessionBid {
                volume: s.volume,
                drive: s.drive,
                spent_bytes_total: s.spent_bytes_total,
                written_bytes_total: s.written_bytes_total,
                hungry: s.hungry,
            })
            .collect(),
        client: b.client.clone(),
        sent_at_us: b.sent_at_us,
        samples: b
            .samples
            .iter()
            .map(|s| pb::ViewSample {
                drive: s.drive,
                write: s.write,
                bytes: s.bytes,
                latency_us: s.latency_us,
                at_us: s.at_us,
                volume: s.volume,
            })
            .collect(),
    }
}

/// A `ViewSync` message as the view's batch and the auction's bid.
pub fn batch_from_pb(mut b: pb::ViewBatch) -> Result<(SampleBatch, Bid), BadView> {
    if b.bids.len() > BID_SESSIONS_MAX {
        return Err(BadView(format!(
            "bids: {} sessions in one bid; at most {BID_SESSIONS_MAX}",
            b.bids.len()
        )));
    }
    let bid = Bid {
        client: b.client.clone(),
        sessions: std::mem::take(&mut b.bids)
            .into_iter()
            .map(|s| SessionBid {
                volume: s.volume,
                drive: s.drive,
                spent_bytes_total: s.spent_bytes_total,
                written_bytes_total: s.written_bytes_total,
                hungry: s.hungry,
            })
            .collect(),
    };
    Ok((samples_from_pb(b)?, bid))
}

fn samples_from_pb(b: pb::ViewBatch) -> Result<SampleBatch, BadView> {
    if b.samples.len() > sluice_flint::view::BATCH_SAMPLES_MAX {
        return Err(BadView(format!(
            "samples: {} in one batch; at most {}",
            b.samples.len(),
            sluice_flint::view::BATCH_SAMPLES_MAX
        )));
    }
    Ok(SampleBatch {
        client: b.client,
        sent_at_us: b.sent_at_us,
        samples: b
            .samples
            .into_iter()
            .map(|s| IoSample {
                drive: s.drive,
                write: s.write,
                bytes: s.bytes,
                latency_us: s.latency_us,
                at_us: s.at_us,
                volume: s.volume,
            })
            .collect(),
    })
}

pub fn grants_to_pb(g: &Grants) -> pb::Grants {
    pb::Grants {
        on: g.on,
        epoch: g.epoch,
        epoch_us: g.epoch_us,
        next_epoch_in_us: g.next_epoch_in_us,
        grants: g
            .grants
            .iter()
            .map(|g| pb::Grant {
                volume: g.volume,
                drive: g.drive,
                epoch: g.epoch,
                bytes: g.bytes,
            })
            .collect(),
    }
}

/// A target's report from the wire, checked.
pub fn target_report_from_pb(
    r: pb::TargetReport,
) -> Result<sluice_flint::view::TargetReport, BadView> {
    use sluice_flint::view::{TargetDelta, TARGET_REPORT_NAMESPACES_MAX};
    if r.namespaces.len() > TARGET_REPORT_NAMESPACES_MAX {
        return Err(BadView(format!(
            "namespaces: {} in one report; at most {TARGET_REPORT_NAMESPACES_MAX}",
            r.namespaces.len()
        )));
    }
    if r.port.is_empty() || r.port.len() > 256 || !r.port.contains(':') {
        return Err(BadView(format!("port: {:?} is not HOST:PORT", r.port)));
    }
    Ok(sluice_flint::view::TargetReport {
        port: r.port,
        namespaces: r
            .namespaces
            .into_iter()
            .map(|n| TargetDelta {
                nqn: n.nqn,
                nsid: n.nsid,
                interval_us: n.interval_us,
                ios: n.ios,
                write_ios: n.write_ios,
                bytes: n.bytes,
                latency_us_sum: n.latency_us_sum,
            })
            .collect(),
    })
}

pub fn target_report_to_pb(r: &sluice_flint::view::TargetReport) -> pb::TargetReport {
    pb::TargetReport {
        port: r.port.clone(),
        namespaces: r
            .namespaces
            .iter()
            .map(|n| pb::TargetNamespace {
                nqn: n.nqn.clone(),
                nsid: n.nsid,
                interval_us: n.interval_us,
                ios: n.ios,
                write_ios: n.write_ios,
                bytes: n.bytes,
                latency_us_sum: n.latency_us_sum,
            })
            .collect(),
    }
}

/// No grants message means an older control plane: no auction.
pub fn grants_from_pb(g: Option<pb::Grants>) -> Grants {
    let Some(g) = g else {
        return Grants::default();
    };
    Grants {
        on: g.on,
        epoch: g.epoch,
        epoch_us: g.epoch_us,
        next_epoch_in_us: g.next_epoch_in_us,
        grants: g
            .grants
            .into_iter()
            .map(|g| Grant {
                volume: g.volume,
                drive: g.drive,
                epoch: g.epoch,
                bytes: g.bytes,
            })
            .collect(),
    }
}

pub fn ack_to_pb(a: &Ack, grants: &Grants) -> pb::ViewAck {
    pb::ViewAck {
        grants: Some(grants_to_pb(grants)),
        counters: a
            .counters
            .iter()
            .map(|(e, c, n)| pb::ViewCounter {
                entity: Some(entity_to_pb(e)),
                counter: *c,
                applied: *n,
            })
            .collect(),
        unknown_drive_samples: a.unknown_drive_samples,
        epoch: a.epoch,
    }
}

/// The acknowledgement and the grants it carries.
pub fn ack_from_pb(a: pb::ViewAck) -> Result<(Ack, Grants), BadView> {
    let counters = a
        .counters
        .iter()
        .map(|c| {
            Ok((
                entity_from_pb(c.entity.as_ref(), "counters.entity")?,
                c.counter,
                c.applied,
            ))
        })
        .collect::<Result<_, BadView>>()?;
    let ack = Ack {
        counters,
        unknown_drive_samples: a.unknown_drive_samples,
        epoch: a.epoch,
    };
    Ok((ack, grants_from_pb(a.grants)))
}

fn window_to_pb(w: &WindowStats) -> pb::ViewWindow {
    pb::ViewWindow {
        ios: w.ios,
        bytes: w.bytes,
        iops: w.iops,
        bytes_per_sec: w.bytes_per_sec,
        latency_us_mean: w.latency_us_mean,
        latency_us_max: w.latency_us_max,
        queue_delay_us_mean: w.queue_delay_us_mean,
        write_share: w.write_share,
    }
}

fn window_from_pb(w: &pb::ViewWindow) -> WindowStats {
    WindowStats {
        ios: w.ios,
        bytes: w.bytes,
        iops: w.iops,
        bytes_per_sec: w.bytes_per_sec,
        latency_us_mean: w.latency_us_mean,
        latency_us_max: w.latency_us_max,
        queue_delay_us_mean: w.queue_delay_us_mean,
        write_share: w.write_share,
    }
}

pub fn entity_view_to_pb(v: &EntityView) -> pb::EntityView {
    pb::EntityView {
        entity: Some(entity_to_pb(&v.entity)),
        counter: v.counter,
        stats: Some(window_to_pb(&v.stats)),
        ewma: v.ewma.as_ref().map(window_to_pb),
        capacity_bytes_per_sec: v.capacity_bytes_per_sec,
        headroom_bytes_per_sec: v.headroom_bytes_per_sec,
        busy_degree: v.busy_degree,
        congested: v.congested,
        target: v.target.as_ref().map(window_to_pb),
        path_delay_us: v.path_delay_us,
        volumes: v
            .volumes
            .iter()
            .map(|l| pb::ViewVolumeLoad {
                volume: l.volume,
                stats: Some(window_to_pb(&l.stats)),
                share: l.share,
            })
            .collect(),
        untracked_volume_samples: v.untracked.volume_samples,
        untracked_session_samples: v.untracked.session_samples,
    }
}

pub fn entity_view_from_pb(v: &pb::EntityView) -> Result<EntityView, BadView> {
    if v.volumes.len() > VOLUMES_IN_VIEW_MAX {
        return Err(BadView(format!(
            "entities.volumes: {} volumes for one drive; at most {VOLUMES_IN_VIEW_MAX}",
            v.volumes.len()
        )));
    }
    Ok(EntityView {
        entity: entity_from_pb(v.entity.as_ref(), "entities.entity")?,
        counter: v.counter,
        stats: v.stats.as_ref().map(window_from_pb).unwrap_or_default(),
        ewma: v.ewma.as_ref().map(window_from_pb),
        capacity_bytes_per_sec: v.capacity_bytes_per_sec,
        headroom_bytes_per_sec: v.headroom_bytes_per_sec,
        busy_degree: v.busy_degree,
        congested: v.congested,
        target: v.target.as_ref().map(window_from_pb),
        path_delay_us: v.path_delay_us,
        volumes: v
            .volumes
            .iter()
            .map(|l| VolumeLoad {
                volume: l.volume,
                stats: l.stats.as_ref().map(window_from_pb).unwrap_or_default(),
                share: if l.share.is_finite() {
                    l.share.clamp(0.0, 1.0)
                } else {
                    0.0
                },
            })
            .collect(),
        untracked: Untracked {
            volume_samples: v.untracked_volume_samples,
            session_samples: v.untracked_session_samples,
        },
    })
}

fn report_to_pb(r: &BottleneckReport) -> pb::BottleneckReport {
    pb::BottleneckReport {
        epoch: r.epoch,
        congested_drives: r.congested_drives.clone(),
        congested_io_pipes: r.congested_io_pipes.clone(),
        congested_net_pipes: r.congested_net_pipes.clone(),
        victims: r
            .victims
            .iter()
            .map(|(s, b)| pb::ViewVictim {
                client: s.client.clone(),
                drive: s.drive,
                bound: Some(entity_to_pb(&match b {
                    Bound::Drive(d) => Entity::Drive(*d),
                    Bound::NetPipe(c) => Entity::NetPipe(c.clone()),
                    Bound::IoPipe(p) => Entity::IoPipe(p.clone()),
                })),
            })
            .collect(),
    }
}

fn report_from_pb(r: &pb::BottleneckReport) -> Result<BottleneckReport, BadView> {
    let victims = r
        .victims
        .iter()
        .map(|v| {
            let bound = match entity_from_pb(v.bound.as_ref(), "victims.bound")? {
                Entity::Drive(d) => Bound::Drive(d),
                Entity::NetPipe(c) => Bound::NetPipe(c),
                Entity::IoPipe(p) => Bound::IoPipe(p),
            };
            Ok((
                Session {
                    client: v.client.clone(),
                    drive: v.drive,
                },
                bound,
            ))
        })
        .collect::<Result<_, BadView>>()?;
    Ok(BottleneckReport {
        epoch: r.epoch,
        congested_drives: r.congested_drives.clone(),
        congested_io_pipes: r.congested_io_pipes.clone(),
        congested_net_pipes: r.congested_net_pipes.clone(),
        victims,
    })
}

pub fn snapshot_to_pb(s: &ViewSnapshot) -> pb::ViewSnapshot {
    pb::ViewSnapshot {
        epoch: s.epoch,
        entities: s.entities.iter().map(entity_view_to_pb).collect(),
        report: Some(report_to_pb(&s.report)),
    }
}

pub fn snapshot_from_pb(s: &pb::ViewSnapshot) -> Result<ViewSnapshot, BadView> {
    Ok(ViewSnapshot {
        epoch: s.epoch,
        entities: s
            .entities
            .iter()
            .map(entity_view_from_pb)
            .collect::<Result<_, _>>()?,
        report: s
            .report
            .as_ref()
            .map(report_from_pb)
            .transpose()?
            .unwrap_or_default(),
    })
}

pub fn subscription_from_pb(s: &pb::ViewSubscription) -> Result<Subscription, BadView> {
    let h = s.headroom_below_bytes_per_sec;
    if !h.is_finite() || h < 0.0 {
        return Err(BadView(format!(
            "subscriptions.headroom_below_bytes_per_sec: {h} must be a finite number >= 0"
        )));
    }
    Ok(if h == 0.0 {
        Subscription::Congestion { drive: s.drive }
    } else {
        Subscription::HeadroomBelow {
            drive: s.drive,
            bytes_per_sec: h,
        }
    })
}

pub fn subscription_to_pb(s: &Subscription) -> pb::ViewSubscription {
    match s {
        Subscription::Congestion { drive } => pb::ViewSubscription {
            drive: *drive,
            headroom_below_bytes_per_sec: 0.0,
        },
        Subscription::HeadroomBelow {
            drive,
            bytes_per_sec,
        } => pb::ViewSubscription {
            drive: *drive,
            headroom_below_bytes_per_sec: *bytes_per_sec,
        },
    }
}

pub fn notification_to_pb(n: &Notification) -> pb::ViewNotification {
    pb::ViewNotification {
        subscription: Some(subscription_to_pb(&n.subscription)),
        holds: n.holds,
        view: Some(entity_view_to_pb(&n.view)),
    }
}

pub fn auction_to_pb(a: &crate::view::AuctionStatus) -> pb::AuctionStatusResponse {
    pb::AuctionStatusResponse {
        on: a.on,
        epoch: a.epoch,
        epoch_us: a.epoch_us,
        drives: a
            .drives
            .iter()
            .map(|d| pb::AuctionDrive {
                drive: d.drive,
                port: d.port.clone(),
                bytes_per_sec: d.bytes_per_sec,
                bytes_per_sec_max: d.bytes_per_sec_max,
                slice_bytes: d.slice_bytes,
                granted_bytes: d.granted_bytes,
                queue_delay_us_mean: d.queue_delay_us_mean,
                inflation_mean: d.inflation_mean,
                contention_mean: d.contention_mean,
                completed_bytes_per_sec: d.completed_bytes_per_sec,
                heavy_cap_bytes_per_sec: d.heavy_cap_bytes_per_sec,
            })
            .collect(),
        sessions: a
            .sessions
            .iter()
            .map(|s| pb::AuctionSession {
                client: s.client.clone(),
                volume: s.volume,
                drive: s.drive,
                weight: s.weight,
                granted_bytes: s.granted_bytes,
                spent_last_bytes: s.spent_last_bytes,
                hungry: s.hungry,
                idle: s.idle,
                contention_mean: s.contention_mean,
                held_back: s.held_back,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_survives_the_wire() {
        let snap = ViewSnapshot {
            epoch: 4,
            entities: vec![EntityView {
                entity: Entity::Drive(3),
                counter: 9,
                stats: WindowStats {
                    ios: 5,
                    bytes: 20480,
                    iops: 5.0,
                    bytes_per_sec: 20480.0,
                    latency_us_mean: 120.0,
                    latency_us_max: 300,
                    queue_delay_us_mean: 20.0,
                    write_share: 0.2,
                },
                ewma: None,
                capacity_bytes_per_sec: 1e9,
                headroom_bytes_per_sec: 5e8,
                busy_degree: 0.5,
                congested: true,
                target: Some(WindowStats {
                    ios: 7,
                    ..WindowStats::default()
                }),
                path_delay_us: Some(1200.0),
                volumes: vec![
                    VolumeLoad {
                        volume: 0,
                        stats: WindowStats {
                            ios: 4,
                            bytes: 16384,
                            ..WindowStats::default()
                        },
                        share: 0.8,
                    },
                    VolumeLoad {
                        volume: 12,
                        stats: WindowStats::default(),
                        share: 0.2,
                    },
                ],
                untracked: Untracked {
                    volume_samples: 3,
                    session_samples: 41,
                },
            }],
            report: BottleneckReport {
                epoch: 4,
                congested_drives: vec![3],
                congested_io_pipes: vec!["t:1".into()],
                congested_net_pipes: vec!["c".into()],
                victims: vec![(
                    Session {
                        client: "c".into(),
                        drive: 3,
                    },
                    Bound::Drive(3),
                )],
            },
        };
        assert_eq!(snapshot_from_pb(&snapshot_to_pb(&snap)), Ok(snap));
    }

    #[test]
    fn a_drive_listing_too_many_volumes_or_a_wild_share_is_refused_or_clamped() {
        let load = |share: f64| pb::ViewVolumeLoad {
            volume: 1,
            stats: None,
            share,
        };
        let mut v = pb::EntityView {
            entity: Some(entity_to_pb(&Entity::Drive(1))),
            ..pb::EntityView::default()
        };
        v.volumes = vec![load(f64::NAN), load(7.0), load(-1.0)];
        let back = entity_view_from_pb(&v).expect("three volumes");
        let shares: Vec<f64> = back.volumes.iter().map(|l| l.share).collect();
        assert_eq!(shares, vec![0.0, 1.0, 0.0]);
        v.volumes = (0..=VOLUMES_IN_VIEW_MAX).map(|_| load(0.1)).collect();
        assert!(entity_view_from_pb(&v).is_err_and(|e| e.0.contains("entities.volumes")));
    }

    #[test]
    fn entities_without_a_kind_are_refused_and_every_bound_survives_the_wire() {
        assert!(entity_from_pb(Some(&pb::ViewEntity { kind: None }), "x")
            .is_err_and(|e| e.0.contains("x: an entity with no kind")));
        let bad = pb::BottleneckReport {
            victims: vec![pb::ViewVictim {
                client: "c".into(),
                drive: 1,
                bound: None,
            }],
            ..Default::default()
        };
        assert!(report_from_pb(&bad).is_err());
        // A port congested by itself bounds sessions too.
        let r = BottleneckReport {
            epoch: 3,
            congested_io_pipes: vec!["p:1".into()],
            victims: vec![(
                Session {
                    client: "c".into(),
                    drive: 1,
                },
                Bound::IoPipe("p:1".into()),
            )],
            ..Default::default()
        };
        assert_eq!(report_from_pb(&report_to_pb(&r)), Ok(r));
        assert!(subscription_from_pb(&pb::ViewSubscription {
            drive: 1,
            headroom_below_bytes_per_sec: f64::NAN
        })
        .is_err());
    }
}
