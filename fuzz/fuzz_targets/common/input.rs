//! The fuzz input as a stream of fields, read front to back; every field
//! reads as zero once the input is exhausted, so any input is a complete
//! sequence of steps. Shared by the targets that drive state machines
//! (`target_queue`, `host_queue`) through `#[path]`.

/// Bytes of the fuzz input, read front to back; zero once exhausted.
pub struct Input<'a>(pub &'a [u8]);

impl Input<'_> {
    pub fn done(&self) -> bool {
        self.0.is_empty()
    }
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a.to_vec()
    }
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
}
