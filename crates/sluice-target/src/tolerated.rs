//! Inputs the NVMe/TCP specification does not make us refuse and that both
//! reference targets (Linux nvmet and SPDK's nvmf_tgt) accept: Sluice
//! accepts them too, so every host that works against those targets works
//! here. Each case is logged at debug level the first time this process
//! sees it, and counted (`docs/conformance.md` lists the cases and the
//! test behind each).

use std::sync::atomic::{AtomicU64, Ordering};

/// One tolerated deviation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tolerated {
    /// A command reuses the CID of an Asynchronous Event Request the host
    /// left outstanding (SPDK's host at shutdown): the AER is dropped.
    AerCidReused,
    /// Get Features with a reserved SEL (4-7): answered as SEL 0 (current).
    FeatureSelReserved,
    /// Reserved FLAGS bits in a PDU header (LAST_PDU or SUCCESS in a CapsuleCmd,
    /// SUCCESS in H2CData, any bit in ICReq or H2CTermReq): ignored.
    PduReservedFlags,
    /// Non-zero reserved bits or bytes in an ICReq (DGST bits 7:2, bytes
    /// 16-127) or an H2CData (bytes 20-23): ignored.
    PduReservedBytes,
    /// PDO not zero in a PDU without data (ICReq, H2CTermReq, CapsuleCmd
    /// without in-capsule data): ignored.
    PduOffsetWithoutData,
    /// DDGSTF set on a CapsuleCmd without in-capsule data: ignored (there is
    /// no data digest to check).
    CapsuleDdgstfWithoutData,
    /// H2CData whose LAST_PDU flag is missing on the PDU that ends the R2T, or
    /// set on one that does not: the transfer ends when all its bytes are in.
    H2cLastPduMismatch,
    /// An I/O Connect whose HOSTID differs from the admin queue's (same
    /// HOSTNQN): the queue joins the association.
    IoConnectHostIdDiffers,
}

impl Tolerated {
    pub const ALL: [Tolerated; 8] = [
        Tolerated::AerCidReused,
        Tolerated::FeatureSelReserved,
        Tolerated::PduReservedFlags,
        Tolerated::PduOffsetWithoutData,
        Tolerated::CapsuleDdgstfWithoutData,
        Tolerated::H2cLastPduMismatch,
        Tolerated::IoConnectHostIdDiffers,
        Tolerated::PduReservedBytes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tolerated::AerCidReused => "aer-cid-reused",
            Tolerated::FeatureSelReserved => "feature-sel-reserved",
            Tolerated::PduReservedFlags => "pdu-reserved-flags",
            Tolerated::PduOffsetWithoutData => "pdu-offset-without-data",
            Tolerated::CapsuleDdgstfWithoutData => "capsule-ddgstf-without-data",
            Tolerated::H2cLastPduMismatch => "h2c-last-pdu-mismatch",
            Tolerated::IoConnectHostIdDiffers => "io-connect-hostid-differs",
            Tolerated::PduReservedBytes => "pdu-reserved-bytes",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Tolerated::AerCidReused => {
                "a command reused the CID of an outstanding Asynchronous Event Request; the request is dropped without a completion"
            }
            Tolerated::FeatureSelReserved => {
                "Get Features with a reserved SEL value (4-7); answered with the current value"
            }
            Tolerated::PduReservedFlags => {
                "a PDU header had reserved FLAGS bits set; they are ignored"
            }
            Tolerated::PduOffsetWithoutData => {
                "a PDU without data had a non-zero PDO; it is ignored"
            }
            Tolerated::CapsuleDdgstfWithoutData => {
                "a CapsuleCmd without in-capsule data had DDGSTF set; it is ignored"
            }
            Tolerated::H2cLastPduMismatch => {
                "an H2CData PDU's LAST_PDU flag did not match the end of the R2T; the transfer ends when all its bytes are in"
            }
            Tolerated::IoConnectHostIdDiffers => {
                "an I/O Connect gave another HOSTID than the admin queue's; the queue joins the association"
            }
            Tolerated::PduReservedBytes => {
                "an ICReq or H2CData header had non-zero reserved bits or bytes; they are ignored"
            }
        }
    }

    /// The variant's position (declaration order; `ALL` lists every one).
    fn index(self) -> usize {
        self as usize
    }
}

static SEEN: [AtomicU64; Tolerated::ALL.len()] =
    [const { AtomicU64::new(0) }; Tolerated::ALL.len()];

/// Records one occurrence of `case`; the first in this process is logged at
/// debug level with `detail`.
pub fn note(case: Tolerated, detail: std::fmt::Arguments<'_>) {
    if SEEN[case.index()].fetch_add(1, Ordering::Relaxed) == 0 {
        tracing::debug!(case = case.name(), detail = %detail, "tolerated: {} (logged once)", case.what());
    }
}

/// How often `case` was seen in this process.
pub fn count(case: Tolerated) -> u64 {
    SEEN[case.index()].load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_distinct_and_in_range() {
        let mut seen = [false; Tolerated::ALL.len()];
        for t in Tolerated::ALL {
            assert!(!seen[t.index()], "{t:?}");
            seen[t.index()] = true;
        }
    }

    #[test]
    fn notes_count() {
        let before = count(Tolerated::AerCidReused);
        note(Tolerated::AerCidReused, format_args!("cid {}", 3));
        note(Tolerated::AerCidReused, format_args!("cid {}", 4));
        assert!(count(Tolerated::AerCidReused) >= before + 2);
    }
}
