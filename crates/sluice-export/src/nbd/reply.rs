//! What both NBD I/O paths share: a reply as it is sent, and the limits
//! on what one connection may have in flight.

/// Requests of one connection being served at once.
pub const REQUESTS_IN_FLIGHT_MAX: u32 = 128;
/// Payload bytes (read or write data) of one connection in flight at once.
pub const IN_FLIGHT_BYTES_MAX: u64 = 128 << 20;
/// One reply: its header (or all of it) and the read data that follows,
/// sent from the buffer the read filled.
#[derive(Debug, Default)]
pub(crate) struct Reply {
    pub(crate) head: Vec<u8>,
    pub(crate) data: Vec<u8>,
}

impl From<Vec<u8>> for Reply {
    fn from(head: Vec<u8>) -> Reply {
        Reply {
            head,
            data: Vec::new(),
        }
    }
}

impl Reply {
    pub(crate) fn len(&self) -> usize {
        self.head.len() + self.data.len()
    }
}

/// Tests' stand-in for a socket that takes at most `step` bytes of `bufs`
/// per call: appends them to `got` and returns how many it took.
#[cfg(test)]
pub(crate) fn take_at_most(got: &mut Vec<u8>, step: usize, bufs: &[std::io::IoSlice<'_>]) -> usize {
    let mut left = step;
    let mut n = 0;
    for b in bufs {
        let k = b.len().min(left);
        got.extend_from_slice(&b[..k]);
        (left, n) = (left - k, n + k);
        if left == 0 {
            break;
        }
    }
    n
}
