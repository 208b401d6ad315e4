//! Reservation decoders on arbitrary bytes: the extended Reservation Status
//! a target returns to the host, the Reservation Notification log page,
//! the commands' data keys, and the commands' CDW10 fields (the first 64
//! bytes as an SQE).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::command::Sqe;
use sluice_proto::reservation::{
    one_key, two_keys, AcquireCommand, NotificationLog, RegisterCommand, ReleaseCommand,
    ReportCommand, ReservationStatus, EXTENDED_ENTRY_BYTES, EXTENDED_HEADER_BYTES,
};

fuzz_target!(|data: &[u8]| {
    if let Some(s) = ReservationStatus::decode_extended(data) {
        assert!(s.registrants.len() <= usize::from(s.registrant_count));
        assert!(
            EXTENDED_HEADER_BYTES + s.registrants.len() * EXTENDED_ENTRY_BYTES <= data.len(),
            "more entries than the bytes hold"
        );
        // What was decoded encodes back to the same structure.
        let len = EXTENDED_HEADER_BYTES + s.registrants.len() * EXTENDED_ENTRY_BYTES;
        let again = ReservationStatus::decode_extended(&s.encode_extended(len))
            .expect("an encoded report decodes");
        assert_eq!(again, s, "Reservation Status round trip");
        let _ = s.reservation();
    } else {
        assert!(data.len() < EXTENDED_HEADER_BYTES);
    }
    if let Some(log) = NotificationLog::decode(data) {
        assert_eq!(NotificationLog::decode(&log.encode()), Some(log));
    }
    let _ = (two_keys(data), one_key(data));
    if data.len() >= 64 {
        let mut b = [0u8; 64];
        b.copy_from_slice(&data[..64]);
        let sqe = Sqe(b);
        // A parsed command writes back the fields it parsed.
        if let Ok(c) = RegisterCommand::parse(&sqe) {
            let mut s = Sqe::new(0x0d, 0, 1);
            c.write_to(&mut s);
            assert_eq!(RegisterCommand::parse(&s), Ok(c));
        }
        if let Ok(c) = AcquireCommand::parse(&sqe) {
            let mut s = Sqe::new(0x11, 0, 1);
            c.write_to(&mut s);
            assert_eq!(AcquireCommand::parse(&s), Ok(c));
        }
        if let Ok(c) = ReleaseCommand::parse(&sqe) {
            let mut s = Sqe::new(0x15, 0, 1);
            c.write_to(&mut s);
            assert_eq!(ReleaseCommand::parse(&s), Ok(c));
        }
        let r = ReportCommand::parse(&sqe);
        assert!(r.len_bytes >= 4 && r.len_bytes % 4 == 0);
    }
});
