//! What the end-to-end tests share: a Sluice target on a RAM namespace and
//! the minimal blocking NBD client they drive the server with.
#![allow(dead_code, clippy::unwrap_used)]

use sluice_export::nbd::proto::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A one-worker target on loopback exporting `size_bytes` of RAM as
/// namespace 1 of `subnqn`, open to any host.
pub fn ram_target(subnqn: &str, size_bytes: u64) -> sluice_target::TargetHandle {
    let ns = sluice_config::NamespaceConfig::ram(1, size_bytes);
    let cfg = one_namespace_config(subnqn, "127.0.0.1:0".parse().unwrap(), ns);
    sluice_target::Target::start(&cfg).unwrap()
}

/// A one-worker target on `listen` exporting the file `img` as namespace
/// 1 of `subnqn`; `None` while the address is still taken (a restart).
pub fn file_target(
    subnqn: &str,
    img: &std::path::Path,
    listen: std::net::SocketAddr,
) -> Option<sluice_target::TargetHandle> {
    let ns = sluice_config::NamespaceConfig::file(1, img);
    sluice_target::Target::start(&one_namespace_config(subnqn, listen, ns)).ok()
}

/// A one-worker target's configuration on `listen`: `ns` in `subnqn`, open
/// to any host, no discovery listener.
pub fn one_namespace_config(
    subnqn: &str,
    listen: std::net::SocketAddr,
    ns: sluice_config::NamespaceConfig,
) -> sluice_config::Config {
    use sluice_config::{Config, SubsystemConfig, TargetSettings};
    Config::default()
        .with_target(
            TargetSettings::default()
                .with_listen(listen)
                .with_discovery_listen(None)
                .with_workers(1),
        )
        .with_subsystem(
            SubsystemConfig::new(subnqn)
                .allow_any_host()
                .with_namespace(ns),
        )
        .validated()
        .unwrap()
}

pub struct Client {
    pub s: UnixStream,
    pub size: u64,
    pub flags: u16,
    /// The server acknowledged NBD_OPT_STRUCTURED_REPLY.
    pub structured: bool,
}

impl Client {
    pub fn connect(path: &std::path::Path, name: &str) -> Client {
        Client::connect_with(path, name, false)
    }

    /// Connects asking for structured replies first (then read replies
    /// come as chunks: [`Client::chunks`]).
    pub fn connect_structured(path: &std::path::Path, name: &str) -> Client {
        Client::connect_with(path, name, true)
    }

    fn connect_with(path: &std::path::Path, name: &str, structured: bool) -> Client {
        let mut s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        let mut acked = false;
        if structured {
            let mut o = IHAVEOPT.to_be_bytes().to_vec();
            o.extend_from_slice(&OPT_STRUCTURED_REPLY.to_be_bytes());
            o.extend_from_slice(&0u32.to_be_bytes());
            s.write_all(&o).unwrap();
            let mut h = [0u8; 20];
            s.read_exact(&mut h).unwrap();
            let mut msg = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
            s.read_exact(&mut msg).unwrap();
            // A server may refuse them (`--structured-replies false`).
            match u32::from_be_bytes(h[12..16].try_into().unwrap()) {
                REP_ACK => acked = true,
                REP_ERR_POLICY => {}
                other => panic!("NBD_OPT_STRUCTURED_REPLY answered {other:#x}"),
            }
        }
        // NBD_OPT_GO asking for the block size.
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        let mut o = IHAVEOPT.to_be_bytes().to_vec();
        o.extend_from_slice(&OPT_GO.to_be_bytes());
        o.extend_from_slice(&(d.len() as u32).to_be_bytes());
        o.extend_from_slice(&d);
        s.write_all(&o).unwrap();
        let (mut size, mut flags) = (0, 0);
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h).unwrap();
            assert_eq!(
                u64::from_be_bytes(h[..8].try_into().unwrap()),
                REPLY_MAGIC_OPT
            );
            let t = u32::from_be_bytes(h[12..16].try_into().unwrap());
            let mut data = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
            s.read_exact(&mut data).unwrap();
            match t {
                REP_ACK => break,
                REP_INFO if data[..2] == INFO_EXPORT.to_be_bytes() => {
                    size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                    flags = u16::from_be_bytes([data[10], data[11]]);
                }
                REP_INFO => {}
                other => panic!("option reply {other:#x}"),
            }
        }
        Client {
            s,
            size,
            flags,
            structured: acked,
        }
    }

    pub fn send(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        length: u32,
        data: &[u8],
    ) {
        let h = RequestHeader {
            flags,
            kind,
            cookie,
            offset,
            length,
        };
        let mut b = h.encode().to_vec();
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
    }

    /// Reads one simple reply; `read_len` bytes follow on success of a read.
    pub fn reply(&mut self, read_len: impl Fn(u64) -> usize) -> (u64, u32, Vec<u8>) {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).unwrap();
        let (errno, cookie) = decode_simple_reply(&h).unwrap();
        let mut data = vec![];
        if errno == 0 {
            data = vec![0u8; read_len(cookie)];
            self.s.read_exact(&mut data).unwrap();
        }
        (cookie, errno, data)
    }

    /// Reads the structured chunks of one reply, up to the final one: (type,
    /// flags, cookie, payload).
    pub fn chunks(&mut self) -> Vec<(u16, u16, u64, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let mut h = [0u8; STRUCTURED_REPLY_HEADER_BYTES];
            self.s.read_exact(&mut h).unwrap();
            assert_eq!(
                u32::from_be_bytes(h[0..4].try_into().unwrap()),
                STRUCTURED_REPLY_MAGIC
            );
            let flags = u16::from_be_bytes([h[4], h[5]]);
            let kind = u16::from_be_bytes([h[6], h[7]]);
            let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
            let mut payload = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
            self.s.read_exact(&mut payload).unwrap();
            out.push((kind, flags, cookie, payload));
            if flags & REPLY_FLAG_DONE != 0 {
                return out;
            }
        }
    }

    pub fn call(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        data: &[u8],
    ) -> (u32, Vec<u8>) {
        self.send(kind, flags, 7, offset, length, data);
        let n = if kind == CMD_READ { length as usize } else { 0 };
        let (c, e, d) = self.reply(|_| n);
        assert_eq!(c, 7);
        (e, d)
    }
}
