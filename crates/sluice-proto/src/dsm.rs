//! Dataset Management (NVM command set opcode 09h): the command's fields
//! and its list of 16-byte ranges.
//!
//! The range list comes from the network, so [`ranges`] never panics: a
//! buffer shorter than the ranges the command announces is a [`DsmError`],
//! and bytes beyond them are ignored (as the SGL may be longer).

use crate::command::Sqe;

/// Bytes of one range in the data buffer.
pub const RANGE_LEN: usize = 16;
/// Most ranges one command carries (NR is 8 bits, 0's based).
pub const RANGES_MAX: u32 = 256;

/// CDW11 attributes.
pub mod attr {
    /// Integral Dataset for Read.
    pub const IDR: u32 = 1 << 0;
    /// Integral Dataset for Write.
    pub const IDW: u32 = 1 << 1;
    /// Deallocate.
    pub const AD: u32 = 1 << 2;
}

/// The fields of a Dataset Management command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmCommand {
    /// Number of ranges (1-based: CDW10 NR + 1, 1..=256).
    pub ranges: u32,
    /// Attribute - Deallocate: the ranges are to be deallocated.
    pub deallocate: bool,
}

impl DsmCommand {
    /// Reads the fields of `sqe` (any 64 bytes parse).
    pub fn parse(sqe: &Sqe) -> Self {
        DsmCommand {
            ranges: (sqe.cdw(10) & 0xff) + 1,
            deallocate: sqe.cdw(11) & attr::AD != 0,
        }
    }

    /// Bytes of the range list the command announces.
    pub fn data_len(&self) -> u32 {
        // RANGE_LEN is 16.
        #[allow(clippy::cast_possible_truncation)]
        let range_len = RANGE_LEN as u32;
        self.ranges * range_len
    }

    /// Writes the fields into `sqe` (other attributes cleared).
    pub fn write_to(&self, sqe: &mut Sqe) {
        debug_assert!((1..=RANGES_MAX).contains(&self.ranges));
        sqe.set_cdw(10, (self.ranges - 1) & 0xff);
        sqe.set_cdw(11, if self.deallocate { attr::AD } else { 0 });
    }
}

/// One range: context attributes, length in blocks, starting LBA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DsmRange {
    pub context_attributes: u32,
    /// Length in logical blocks (1-based as on the wire: 0 means none).
    pub nlb: u32,
    pub slba: u64,
}

impl DsmRange {
    pub fn decode(b: &[u8; RANGE_LEN]) -> Self {
        let [a0, a1, a2, a3, n0, n1, n2, n3, s0, s1, s2, s3, s4, s5, s6, s7] = *b;
        DsmRange {
            context_attributes: u32::from_le_bytes([a0, a1, a2, a3]),
            nlb: u32::from_le_bytes([n0, n1, n2, n3]),
            slba: u64::from_le_bytes([s0, s1, s2, s3, s4, s5, s6, s7]),
        }
    }

    pub fn encode(&self) -> [u8; RANGE_LEN] {
        let mut b = [0u8; RANGE_LEN];
        b[0..4].copy_from_slice(&self.context_attributes.to_le_bytes());
        b[4..8].copy_from_slice(&self.nlb.to_le_bytes());
        b[8..16].copy_from_slice(&self.slba.to_le_bytes());
        b
    }

    /// The first block after the range, or None when it wraps past 2^64.
    pub fn end(&self) -> Option<u64> {
        self.slba.checked_add(u64::from(self.nlb))
    }
}

/// A range list that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DsmError {
    #[error("Dataset Management: {ranges} ranges need {need} bytes, the data has {have}")]
    Truncated {
        ranges: u32,
        need: usize,
        have: usize,
    },
}

/// Decodes the first `count` ranges of `data` without allocating. Errors
/// (never panics) when `data` is shorter than `count` ranges; extra bytes
/// are ignored.
pub fn ranges(
    data: &[u8],
    count: u32,
) -> Result<impl ExactSizeIterator<Item = DsmRange> + '_, DsmError> {
    let need = (count as usize).saturating_mul(RANGE_LEN);
    let Some(list) = data.get(..need) else {
        return Err(DsmError::Truncated {
            ranges: count,
            need,
            have: data.len(),
        });
    };
    Ok(list.chunks_exact(RANGE_LEN).map(|c| {
        let mut b = [0u8; RANGE_LEN];
        b.copy_from_slice(c);
        DsmRange::decode(&b)
    }))
}

/// Encodes `list` as the data buffer of a Dataset Management command.
pub fn encode_ranges(list: &[DsmRange]) -> Vec<u8> {
    list.iter().flat_map(|r| r.encode()).collect()
}

#[cfg(test)]
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
mod tests {
    use super::*;
    use crate::command::io;
    use proptest::prelude::*;

    #[test]
    fn decodes_the_wire_layout() {
        let mut b = [0u8; RANGE_LEN];
        b[0] = 0x11;
        b[4..8].copy_from_slice(&8u32.to_le_bytes());
        b[8..16].copy_from_slice(&0x1_0000_0002u64.to_le_bytes());
        let r = DsmRange::decode(&b);
        assert_eq!(r.context_attributes, 0x11);
        assert_eq!(r.nlb, 8);
        assert_eq!(r.slba, 0x1_0000_0002);
        assert_eq!(r.end(), Some(0x1_0000_000a));
        assert_eq!(
            DsmRange {
                slba: u64::MAX,
                nlb: 1,
                ..r
            }
            .end(),
            None
        );
    }

    #[test]
    fn command_fields() {
        let mut s = Sqe::new(io::DATASET_MANAGEMENT, 1, 1);
        s.set_cdw(10, 0xffff_ff03);
        s.set_cdw(11, attr::AD | attr::IDW);
        let c = DsmCommand::parse(&s);
        assert_eq!(c.ranges, 4);
        assert!(c.deallocate);
        assert_eq!(c.data_len(), 64);
        s.set_cdw(10, 0xff);
        assert_eq!(DsmCommand::parse(&s).ranges, RANGES_MAX);
    }

    #[test]
    fn short_data_is_an_error_not_a_panic() {
        let data = [0u8; 47];
        assert_eq!(
            ranges(&data, 3).err(),
            Some(DsmError::Truncated {
                ranges: 3,
                need: 48,
                have: 47
            })
        );
        assert_eq!(ranges(&data, 2).map(|r| r.len()), Ok(2));
        assert_eq!(ranges(&[], 0).map(|r| r.len()), Ok(0));
        assert!(ranges(&[], u32::MAX).is_err());
    }

    proptest! {
        #[test]
        fn round_trip(list in proptest::collection::vec(
            (any::<u32>(), any::<u32>(), any::<u64>())
                .prop_map(|(context_attributes, nlb, slba)| DsmRange { context_attributes, nlb, slba }),
            1..=RANGES_MAX as usize,
        )) {
            let data = encode_ranges(&list);
            let back: Vec<DsmRange> = ranges(&data, list.len() as u32).unwrap().collect();
            prop_assert_eq!(back, list);
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600), count in 0u32..300) {
            match ranges(&data, count) {
                Ok(it) => {
                    prop_assert!(data.len() >= count as usize * RANGE_LEN);
                    prop_assert_eq!(it.count(), count as usize);
                }
                Err(DsmError::Truncated { need, have, .. }) => {
                    prop_assert!(have < need);
                    prop_assert_eq!(have, data.len());
                }
            }
        }

        #[test]
        fn command_round_trip(ranges in 1..=RANGES_MAX, deallocate: bool, cid: u16) {
            let c = DsmCommand { ranges, deallocate };
            let mut s = Sqe::new(io::DATASET_MANAGEMENT, cid, 1);
            c.write_to(&mut s);
            prop_assert_eq!(DsmCommand::parse(&s), c);
        }
    }
}
