//! The run-to-completion path ([`DirectQueue`]) against Sluice's real
//! target over loopback: data written at QD 32 in every transfer shape
//! (in-capsule, R2T, H2CData split at MAXH2CDATA, C2HData split) reads back
//! intact, NVMe statuses reach the caller, QIDs count against the granted
//! queues, a target that goes away mid-run fails every outstanding
//! command instead of hanging, and a timed-out command holds its CID until
//! the target answers it, while the queue goes on.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::RealTarget;
use sluice_config::{NamespaceConfig, SsdConfig};
use sluice_host::core::{Completion, Payload};
use sluice_host::{ConnectOptions, Controller, DirectQueue, HostError, IoFlags, RwBuilder};
use sluice_proto::command::{io, Sqe};
use sluice_proto::Status;

const QD: usize = 32;

fn opts() -> ConnectOptions {
    ConnectOptions {
        hostnqn: "nqn.2024-01.io.sluice:direct".into(),
        io_queues: 1,
        direct_queues: 1,
        queue_depth: QD as u16 + 1,
        command_timeout: Duration::from_secs(10),
        ..Default::default()
    }
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `n` transfers back to back from LBA 0 (512-byte blocks), their sizes
/// taken from `sizes` in turn: `(lba, len)` each.
fn layout(sizes: &[usize], n: usize) -> Vec<(u64, usize)> {
    let mut lba = 0u64;
    (0..n)
        .map(|i| {
            let len = sizes[i % sizes.len()];
            let at = lba;
            lba += (len / 512) as u64;
            (at, len)
        })
        .collect()
}

type Done = Vec<(u64, sluice_host::Result<Completion>)>;

/// Polls until `n` completions arrived (bounded: a hang fails the test).
fn drain(q: &mut DirectQueue, out: &mut Done, n: usize, wait: Option<Duration>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} completions",
            out.len()
        );
        q.poll(out, wait).expect("poll");
    }
}

/// Runs `ios` (token = index) keeping QD in flight; returns the results
/// by token.
fn run_at_qd(
    q: &mut DirectQueue,
    ios: Vec<(Sqe, Payload)>,
    wait: Option<Duration>,
) -> HashMap<u64, sluice_host::Result<Completion>> {
    let total = ios.len();
    let mut pending = ios.into_iter().enumerate();
    let mut results = HashMap::new();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while results.len() < total {
        assert!(
            Instant::now() < deadline,
            "{} of {total} done",
            results.len()
        );
        while q.outstanding() < QD {
            let Some((i, (sqe, p))) = pending.next() else {
                break;
            };
            q.submit(sqe, p, i as u64).expect("submit");
        }
        assert!(q.outstanding() <= QD);
        q.poll(&mut out, wait).expect("poll");
        for (t, r) in out.drain(..) {
            assert!(results.insert(t, r).is_none(), "token {t} completed twice");
        }
    }
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_read_back_at_qd32_in_every_transfer_shape() {
    let t = RealTarget::start();
    let c = Controller::connect(t.addr(), &t.subnqn, opts())
        .await
        .expect("connect");
    let ns = c.namespace(1).expect("ns");
    let rw = ns.rw_builder();
    assert_eq!(rw.max_command_bytes(), 128 << 10, "MDTS of the test target");
    let mut q = c.connect_direct_queue().await.expect("direct queue");
    assert_eq!(q.qid(), 2, "after the one threaded I/O queue");
    assert_eq!(usize::from(q.depth()), QD + 1);
    // The controller granted 2 I/O queues: no QID is left for another.
    match c.connect_direct_queue().await {
        Err(HostError::InvalidArgument(m)) => assert!(m.contains("granted 2"), "{m}"),
        r => panic!("a third I/O queue must be refused: {r:?}"),
    }

    // The bench thread owns the queue: drive it on a plain OS thread.
    let handle = std::thread::spawn(move || {
        // 512 B .. 8 KiB in-capsule; 12 KiB and 32 KiB by R2T; 64 KiB and
        // 128 KiB above MAXH2CDATA (32 KiB: several H2CData per R2T) and
        // above the target's C2HData limit (64 KiB: several C2HData).
        let layout = layout(&[512, 4096, 8192, 12288, 32768, 65536, 131072, 1024], 240);
        let (lba, len) = layout[layout.len() - 1];
        assert!(lba + (len / 512) as u64 <= rw.size_blocks());
        let data: Vec<Vec<u8>> = (0..layout.len())
            .map(|i| pattern(layout[i].1, i as u64 + 1))
            .collect();
        // Writes, sleeping in epoll when idle.
        let writes = layout
            .iter()
            .zip(&data)
            .map(|(&(lba, _), d)| rw.write(lba, d.clone(), IoFlags::default()).unwrap())
            .collect();
        let r = run_at_qd(&mut q, writes, Some(Duration::from_millis(1)));
        for (t, r) in &r {
            r.as_ref()
                .unwrap_or_else(|e| panic!("write {t} ({:?}) failed: {e}", layout[*t as usize]));
        }
        // Reads, busy-polled.
        let s0 = q.stats();
        let reads: Vec<_> = layout
            .iter()
            .map(|&(lba, len)| rw.read(lba, len, IoFlags::default()).unwrap())
            .collect();
        let n = reads.len() as u64;
        let r = run_at_qd(&mut q, reads, None);
        for (t, r) in r {
            let c = r.unwrap_or_else(|e| panic!("read {t} failed: {e}"));
            let i = t as usize;
            assert!(
                c.data == data[i],
                "read back differs at LBA {} ({} bytes)",
                layout[i].0,
                layout[i].1
            );
        }
        let s = q.stats().since(&s0);
        assert_eq!((s.completions, s.submitted), (n, n), "{s:?}");
        // Batched: the first QD commands leave in one write, and never
        // more than one write per command after that.
        assert!(s.sends < n, "{} sends for {n} reads", s.sends);
        assert!(s.reads > 0);
        // Busy-polled: never slept.
        assert_eq!(s.sleeps, 0, "{s:?}");
        // The 64 KiB C2HData PDUs of the large reads went mostly straight
        // into their buffers.
        assert!(s.rx_direct_bytes > 0, "{s:?}");
        assert_eq!(q.outstanding(), 0);
        // Reads into recycled buffers holding other bytes get the device's.
        let reads: Vec<_> = layout
            .iter()
            .map(|&(lba, len)| {
                rw.read_into(lba, vec![0xee; len], IoFlags::default())
                    .unwrap()
            })
            .collect();
        for (t, r) in run_at_qd(&mut q, reads, Some(Duration::from_millis(1))) {
            let c = r.unwrap_or_else(|e| panic!("read {t} failed: {e}"));
            assert!(
                c.data == data[t as usize],
                "read into a used buffer differs"
            );
        }
        q
    });
    let q = tokio::task::spawn_blocking(move || handle.join())
        .await
        .expect("join task")
        .expect("direct thread");
    // The threaded queue of the same controller still works beside it
    // (distinct QIDs), and sees what the direct queue wrote.
    let d = ns.read(0, 512, IoFlags::default()).await.expect("read");
    assert_eq!(d, pattern(512, 1));
    drop(q);
    c.disconnect(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_lba_gets_the_nvme_status() {
    let t = RealTarget::start();
    let c = Controller::connect(t.addr(), &t.subnqn, opts())
        .await
        .expect("connect");
    let ns = c.namespace(1).expect("ns");
    let rw = ns.rw_builder();
    let mut q = c.connect_direct_queue().await.expect("direct queue");
    // The builder refuses it locally, as Namespace::read does.
    assert!(matches!(
        rw.read(t.size_blocks, 512, IoFlags::default()),
        Err(HostError::InvalidArgument(_))
    ));
    // Sent anyway, the controller answers with its status.
    let sqe = Sqe::rw(io::READ, 0, 1, t.size_blocks, 1, false);
    q.submit(sqe, Payload::Read(512), 7).expect("submit");
    let mut out = Vec::new();
    drain(&mut q, &mut out, 1, Some(Duration::from_millis(5)));
    match &out[0] {
        (7, Err(e @ HostError::Nvme { status, .. })) => {
            assert_eq!(*status, Status::LBA_OUT_OF_RANGE, "{e}");
            assert!(!e.is_fatal_for_connection());
        }
        other => panic!("expected LBA Out of Range: {other:?}"),
    }
    // The queue carries on.
    q.submit_read(&rw, 0, 4096, IoFlags::default(), 8)
        .expect("submit");
    out.clear();
    drain(&mut q, &mut out, 1, None);
    assert!(matches!(&out[0], (8, Ok(c)) if c.data.len() == 4096));
    drop(q);
    c.disconnect(Duration::from_secs(1)).await;
}

/// Batched wake-ups: sleeps wait for a low-water mark of half the bytes
/// still due, data read back intact at QD 32 in every size, and reads that
/// fail (their data never comes, so the mark is never reached) complete at
/// the sleep's deadline instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_wakeups_read_back_and_survive_reads_that_send_no_data() {
    let t = RealTarget::start();
    let c = Controller::connect(t.addr(), &t.subnqn, opts())
        .await
        .expect("connect");
    let ns = c.namespace(1).expect("ns");
    let rw = ns.rw_builder();
    let mut q = c.connect_direct_queue().await.expect("direct queue");
    let size_blocks = t.size_blocks;
    let handle = std::thread::spawn(move || {
        q.set_wake_batch_min(Some(1));
        let layout = layout(&[4096, 131_072, 512, 65536, 8192], 120);
        let data: Vec<Vec<u8>> = (0..layout.len())
            .map(|i| pattern(layout[i].1, i as u64 + 7))
            .collect();
        let wait = Some(Duration::from_millis(2));
        let writes = layout
            .iter()
            .zip(&data)
            .map(|(&(lba, _), d)| rw.write(lba, d.clone(), IoFlags::default()).unwrap())
            .collect();
        for (t, r) in run_at_qd(&mut q, writes, wait) {
            r.unwrap_or_else(|e| panic!("write {t} failed: {e}"));
        }
        let s0 = q.stats();
        let reads = layout
            .iter()
            .map(|&(lba, len)| rw.read(lba, len, IoFlags::default()).unwrap())
            .collect();
        for (t, r) in run_at_qd(&mut q, reads, wait) {
            let c = r.unwrap_or_else(|e| panic!("read {t} failed: {e}"));
            assert!(c.data == data[t as usize], "read {t} differs");
        }
        let st = q.stats().since(&s0);
        assert!(st.batched_sleeps > 0, "no sleep waited for a batch: {st:?}");
        assert!(st.batched_sleeps <= st.sleeps, "{st:?}");
        // Two 128 KiB reads past the end: the target answers each with a
        // 24-byte error, far below the mark of 128 KiB they set.
        for i in 0..2 {
            let sqe = Sqe::rw(io::READ, 0, 1, size_blocks + i, 256, false);
            q.submit(sqe, Payload::Read(131_072), 1000 + i)
                .expect("submit");
        }
        let mut out = Vec::new();
        drain(&mut q, &mut out, 2, wait);
        for (t, r) in &out {
            match r {
                Err(HostError::Nvme { status, .. }) => {
                    assert_eq!(*status, Status::LBA_OUT_OF_RANGE, "read {t}")
                }
                other => panic!("read {t}: expected LBA Out of Range, got {other:?}"),
            }
        }
        // The queue goes on.
        q.submit_read(&rw, 0, 4096, IoFlags::default(), 7)
            .expect("submit");
        out.clear();
        drain(&mut q, &mut out, 1, wait);
        assert!(matches!(&out[0], (7, Ok(c)) if c.data == data[0]));
        q
    });
    let q = tokio::task::spawn_blocking(move || handle.join())
        .await
        .expect("join task")
        .expect("direct thread");
    drop(q);
    c.disconnect(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_shutdown_fails_every_outstanding_command() {
    // Namespace 2 is a slow emulated SSD: its reads (3 s) are still
    // outstanding when the target closes the connections (100 ms drain).
    let t = RealTarget::start_sub(
        &[],
        |s| s.with_shutdown_drain_ms(100),
        |s| {
            s.with_namespace(NamespaceConfig::emulated_ssd(
                2,
                1 << 20,
                SsdConfig::default().with_base_read_latency_us(3_000_000),
            ))
        },
    );
    let c = Controller::connect(t.addr(), &t.subnqn, opts())
        .await
        .expect("connect");
    let rw = c.namespace(2).expect("ns 2").rw_builder();
    let mut q = c.connect_direct_queue().await.expect("direct queue");
    let (stopping_tx, stopping_rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        for i in 0..QD as u64 {
            q.submit_read(&rw, i * 8, 4096, IoFlags::default(), i)
                .expect("submit");
        }
        let mut out = Vec::new();
        // Let the commands reach the target, then stop it.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(200) {
            q.poll(&mut out, Some(Duration::from_millis(5)))
                .expect("poll");
        }
        assert!(out.is_empty(), "3 s reads completed: {out:?}");
        assert_eq!(q.outstanding(), QD);
        stopping_rx.recv().expect("target stopping");
        // Every command ends, with an error, without hanging.
        drain(&mut q, &mut out, QD, Some(Duration::from_millis(50)));
        let mut tokens: Vec<u64> = out.iter().map(|(t, _)| *t).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, (0..QD as u64).collect::<Vec<_>>());
        for (t, r) in &out {
            match r {
                Err(e) => assert!(e.is_fatal_for_connection(), "token {t}: {e}"),
                Ok(_) => panic!("token {t} completed after the target stopped"),
            }
        }
        assert!(q.is_closed());
        assert_eq!(q.outstanding(), 0);
        // Nothing left: poll reports the close, submit refuses.
        assert!(q.poll(&mut out, None).is_err());
        assert!(q.submit_read(&rw, 0, 4096, IoFlags::default(), 99).is_err());
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopper = std::thread::spawn(move || drop(t));
    stopping_tx.send(()).expect("direct thread alive");
    tokio::task::spawn_blocking(move || handle.join())
        .await
        .expect("join task")
        .expect("direct thread");
    c.disconnect(Duration::from_millis(100)).await;
    tokio::task::spawn_blocking(move || stopper.join())
        .await
        .expect("join task")
        .expect("target shutdown");
}

/// A real target whose namespace 2 answers reads after `read_latency_us`,
/// a controller connected with `o`, one direct queue, and the builders of
/// namespace 2 (slow) and 1 (fast). Keep the target alive.
async fn with_a_slow_namespace(
    read_latency_us: u64,
    o: ConnectOptions,
) -> (RealTarget, Controller, DirectQueue, RwBuilder, RwBuilder) {
    let t = RealTarget::start_sub(
        &[],
        |s| s,
        |s| {
            s.with_namespace(NamespaceConfig::emulated_ssd(
                2,
                1 << 20,
                SsdConfig::default().with_base_read_latency_us(read_latency_us),
            ))
        },
    );
    let c = Controller::connect(t.addr(), &t.subnqn, o)
        .await
        .expect("connect");
    let slow = c.namespace(2).expect("ns 2").rw_builder();
    let fast = c.namespace(1).expect("ns 1").rw_builder();
    let q = c.connect_direct_queue().await.expect("direct queue");
    (t, c, q, slow, fast)
}

/// A command that times out on a direct queue fails with `Timeout` at its
/// deadline, but its CID stays held until the target answers it (late, or
/// aborted through the admin queue): meanwhile the other commands run on
/// the remaining CIDs, and once the answer came every CID is usable again
/// and the queue is still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_command_holds_its_cid_until_answered_and_the_queue_goes_on() {
    // Namespace 2 reads in 1.5 s; the host gives commands 1 s. (Unanswered
    // at twice the timeout, a queue would close: 1.5 s is inside that.)
    let o = ConnectOptions {
        queue_depth: 4,
        command_timeout: Duration::from_secs(1),
        ..opts()
    };
    let (_t, c, mut q, slow, fast) = with_a_slow_namespace(1_500_000, o).await;
    let handle = std::thread::spawn(move || {
        let mut out = Vec::new();
        let t0 = Instant::now();
        q.submit_read(&slow, 0, 4096, IoFlags::default(), 1)
            .expect("submit the slow read");
        drain(&mut q, &mut out, 1, Some(Duration::from_millis(20)));
        let waited = t0.elapsed();
        assert!(
            matches!(&out[0], (1, Err(HostError::Timeout { .. }))),
            "{out:?}"
        );
        assert!(
            waited >= Duration::from_millis(900) && waited < Duration::from_millis(1400),
            "timed out after {waited:?}"
        );
        assert!(!q.is_closed());
        // Fill every free CID with writes: the held one is not among them.
        out.clear();
        let data = pattern(4096, 5);
        let mut free_while_held = 0u64;
        while q
            .submit_write(
                &fast,
                free_while_held * 8,
                data.clone(),
                IoFlags::default(),
                10 + free_while_held,
            )
            .is_ok()
        {
            free_while_held += 1;
        }
        assert!(free_while_held >= 1, "other commands still run");
        drain(
            &mut q,
            &mut out,
            free_while_held as usize,
            Some(Duration::from_millis(20)),
        );
        assert!(out.iter().all(|(_, r)| r.is_ok()), "{out:?}");
        // The late answer (or the abort's) frees it, and is not reported
        // a second time.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut free_after = 0u64;
        out.clear();
        while Instant::now() < deadline {
            q.poll(&mut out, Some(Duration::from_millis(20)))
                .expect("poll");
            // Probe: how many reads go in now?
            let mut n = 0u64;
            while q
                .submit_read(&fast, n * 8, 4096, IoFlags::default(), 100 + n)
                .is_ok()
            {
                n += 1;
            }
            let want = out.len() + n as usize;
            drain(&mut q, &mut out, want, Some(Duration::from_millis(20)));
            free_after = n;
            if n > free_while_held {
                break;
            }
        }
        assert_eq!(
            free_after,
            free_while_held + 1,
            "the timed-out command's CID came back"
        );
        assert!(
            out.iter().all(|(tok, r)| *tok >= 100 && r.is_ok()),
            "{out:?}"
        );
        for (tok, r) in &out {
            if *tok - 100 < free_while_held {
                assert!(r.as_ref().unwrap().data == data, "token {tok}");
            }
        }
        assert!(!q.is_closed(), "a late answer does not close the queue");
        assert!(t0.elapsed() < Duration::from_secs(10));
        q
    });
    let q = tokio::task::spawn_blocking(move || handle.join())
        .await
        .expect("join task")
        .expect("direct thread");
    drop(q);
    c.disconnect(Duration::from_secs(1)).await;
}

/// The clock a caller passes to `poll_at` is the queue's clock: a command
/// times out when the reading passes its deadline, without that time
/// having gone by, and a reading older than one the queue already saw
/// does not move its clock back (the command then stays timed out once,
/// not twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clock_a_poll_is_given_runs_the_command_timers() {
    // Namespace 2 answers reads after 10 s: only the clock given can time
    // them out within this test.
    let o = ConnectOptions {
        command_timeout: Duration::from_secs(5),
        ..opts()
    };
    let (_t, c, mut q, slow, fast) = with_a_slow_namespace(10_000_000, o).await;
    let handle = std::thread::spawn(move || {
        let mut out = Vec::new();
        let t0 = Instant::now();
        q.submit_read(&slow, 0, 4096, IoFlags::default(), 1)
            .expect("submit the slow read");
        // Half the timeout on the given clock: nothing yet.
        q.poll_at(t0 + Duration::from_millis(2500), &mut out, None)
            .expect("poll");
        assert!(out.is_empty(), "{out:?}");
        // Past it: the read times out at once.
        q.poll_at(t0 + Duration::from_secs(6), &mut out, None)
            .expect("poll");
        assert!(
            matches!(&out[..], [(1, Err(HostError::Timeout { .. }))]),
            "{out:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(4), "no real wait");
        // An older reading: the clock stays where it was, the read is not
        // reported again, and a fast write still completes.
        out.clear();
        let data = pattern(4096, 9);
        q.submit_write(&fast, 0, data, IoFlags::default(), 2)
            .expect("submit the write");
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.is_empty() && Instant::now() < deadline {
            q.poll_at(t0, &mut out, Some(Duration::from_millis(20)))
                .expect("poll");
        }
        assert!(matches!(&out[..], [(2, Ok(_))]), "{out:?}");
        assert!(!q.is_closed());
        q
    });
    let q = tokio::task::spawn_blocking(move || handle.join())
        .await
        .expect("join task")
        .expect("direct thread");
    drop(q);
    c.disconnect(Duration::from_secs(1)).await;
}

/// A PDU held by the host's send freight leaves at the freight's timer
/// even when the owner sleeps: epoll alone rounds every sleep up to a
/// whole millisecond, so a 100 µs timer fired ~1.1 ms late and every QD 1
/// I/O of a batching (`unified`) queue took over 1 ms. The median of 200
/// QD 1 reads must stay well under that millisecond (a loose bound: the
/// timer plus a loopback round trip is ~0.2 ms here, in a debug build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_pdu_leaves_at_its_freight_timer_while_the_owner_sleeps() {
    use sluice_proto::send::{SchedulerKind, SendConfig};
    let t = RealTarget::start();
    let mut send = SendConfig {
        scheduler: SchedulerKind::Unified,
        flush_when_idle: false,
        ..SendConfig::default()
    };
    // One command never fills the container: only its timer sends it.
    send.unified.degree = 16;
    send.unified.timer = Duration::from_micros(100);
    let o = ConnectOptions { send, ..opts() };
    let c = Controller::connect(t.addr(), &t.subnqn, o)
        .await
        .expect("connect");
    let rw = c.namespace(1).expect("ns").rw_builder();
    let mut q = c.connect_direct_queue().await.expect("direct queue");
    let lat = std::thread::spawn(move || {
        let mut lat = Vec::new();
        let mut out = Vec::new();
        for i in 0..200u64 {
            let (sqe, p) = rw.read(i % 64, 4096, IoFlags::default()).unwrap();
            let t0 = Instant::now();
            q.submit(sqe, p, i).expect("submit");
            // Sleep-only waits (as an idle owner in interrupt mode).
            drain(&mut q, &mut out, 1, Some(Duration::from_millis(50)));
            lat.push(t0.elapsed());
            let (_, r) = out.pop().expect("completion");
            r.expect("read");
        }
        lat
    })
    .join()
    .expect("thread");
    let mut sorted = lat.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    assert!(
        median < Duration::from_micros(700),
        "median QD 1 latency {median:?} with a 100 µs freight timer: the owner overslept the timer"
    );
}

/// `ConnectOptions::tcp_congestion`: with Reno (built into every kernel)
/// the threaded and the direct queues connect and move data intact; a name
/// the kernel lacks fails the connect with a transport error that names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_congestion_is_set_on_the_queue_sockets() {
    let t = RealTarget::start();
    let o = ConnectOptions {
        tcp_congestion: Some("reno".into()),
        ..opts()
    };
    let c = Controller::connect(t.addr(), &t.subnqn, o)
        .await
        .expect("connect with reno");
    let ns = c.namespace(1).expect("ns");
    let d = pattern(128 << 10, 9);
    ns.write(0, &d, IoFlags::default()).await.expect("write");
    let back = ns.read(0, d.len(), IoFlags::default()).await.expect("read");
    assert!(back == d, "128 KiB read back differs");
    let rw = ns.rw_builder();
    let mut q = c.connect_direct_queue().await.expect("direct queue");
    let ios = vec![rw.read(0, d.len(), IoFlags::default()).unwrap()];
    let handle = std::thread::spawn(move || run_at_qd(&mut q, ios, None));
    let r = handle.join().unwrap();
    assert!(r[&0].as_ref().expect("direct read").data == d);

    let o = ConnectOptions {
        tcp_congestion: Some("no-such-cc".into()),
        ..opts()
    };
    match Controller::connect(t.addr(), &t.subnqn, o).await {
        Err(HostError::Transport(m)) => {
            assert!(m.contains("TCP congestion control `no-such-cc`"), "{m}");
        }
        r => panic!("an unknown algorithm must fail the connect: {r:?}"),
    }
}
