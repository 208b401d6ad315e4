//! TCP's congestion control, per socket (`TCP_CONGESTION`): the name
//! checks of a configured algorithm, setting and reading it on a socket, and
//! what the kernel offers (`/proc/sys/net/ipv4/tcp_*congestion_control`);
//! how much a socket's congestion window admits now (`TCP_INFO`); and its
//! receive low-water mark (`SO_RCVLOWAT`).
//!
//! Why a storage peer picks its own: on paths whose round trip is a few
//! microseconds (loopback, one switch), BBR sizes its congestion window
//! from a tiny bandwidth-delay product, so a burst of large reads waits for
//! acknowledgements that CUBIC would not wait for (docs/target.md,
//! *Congestion control*). A socket that is set keeps its choice whatever
//! the system default; a listening socket's choice passes to the sockets it
//! accepts.

use std::io;
use std::os::fd::AsFd;

/// Longest name the kernel takes (`TCP_CA_NAME_MAX` is 16 with the NUL).
pub const TCP_CONGESTION_NAME_BYTES_MAX: usize = 15;

/// Checks that `name` can be a congestion control algorithm's name: 1 to
/// [`TCP_CONGESTION_NAME_BYTES_MAX`] bytes of ASCII letters, digits, `_` and
/// `-`. Whether this kernel has it is known only when a socket is set.
pub fn check_tcp_congestion_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > TCP_CONGESTION_NAME_BYTES_MAX {
        return Err(format!(
            "`{name}` must be 1 to {TCP_CONGESTION_NAME_BYTES_MAX} bytes long"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "`{name}` holds {c:?}; a congestion control name is ASCII letters, digits, `_` and `-` (e.g. cubic)"
        ));
    }
    Ok(())
}

/// Sets the congestion control algorithm of `fd`. Fails with `ENOENT` when
/// the kernel has no such algorithm and `EPERM` when an unprivileged
/// process asks for one outside `tcp_allowed_congestion_control`.
pub fn set_tcp_congestion(fd: impl AsFd, name: &str) -> io::Result<()> {
    rustix::net::sockopt::set_tcp_congestion(fd, name).map_err(io::Error::from)
}

/// The congestion control algorithm `fd` uses.
pub fn tcp_congestion(fd: impl AsFd) -> io::Result<String> {
    rustix::net::sockopt::tcp_congestion(fd).map_err(io::Error::from)
}

/// How many bytes `fd`'s congestion window admits now: the window less the
/// segments in flight, times the MSS (`TCP_INFO`); 0 when it is full. What
/// a sender writes beyond this waits in the socket until acknowledgements
/// open the window, and is then sent by whichever CPU processes them.
pub fn tcp_send_window_room_bytes(fd: impl AsFd) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero tcp_info is valid.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::tcp_info>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid pointer to an owned tcp_info and its length; the
    // kernel writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut ti as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(window_room_bytes(
        ti.tcpi_snd_cwnd,
        ti.tcpi_unacked,
        ti.tcpi_snd_mss,
    ))
}

/// Sets `fd`'s receive low-water mark (`SO_RCVLOWAT`): epoll reports the
/// socket readable, and the kernel wakes a sleeper, only once this many
/// bytes wait in it (a non-blocking read still returns whatever is there).
/// TCP caps it at half the largest receive buffer, and may grow the
/// buffer to hold twice it. 1 is the default.
pub fn set_recv_low_water(fd: impl AsFd, bytes: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let v = libc::c_int::try_from(bytes.max(1)).unwrap_or(libc::c_int::MAX);
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid pointer to an owned c_int and its length.
    let r = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `(cwnd − in flight) × mss`, 0 when the window is full (segments in
/// flight can exceed a window that just shrank).
pub fn window_room_bytes(cwnd_segments: u32, in_flight_segments: u32, mss_bytes: u32) -> usize {
    let segments = u64::from(cwnd_segments.saturating_sub(in_flight_segments));
    usize::try_from(segments * u64::from(mss_bytes)).unwrap_or(usize::MAX)
}

/// The system's default for new sockets (`None` where `/proc` does not
/// say).
pub fn system_tcp_congestion() -> Option<String> {
    proc_word_list("/proc/sys/net/ipv4/tcp_congestion_control").and_then(|v| v.into_iter().next())
}

/// The algorithms the kernel has loaded (what a privileged process may
/// set; others may set `tcp_allowed_congestion_control` only).
pub fn available_tcp_congestion() -> Vec<String> {
    proc_word_list("/proc/sys/net/ipv4/tcp_available_congestion_control").unwrap_or_default()
}

fn proc_word_list(path: &str) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(path).ok()?;
    Some(s.split_whitespace().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn window_room_is_what_the_window_has_left() {
        assert_eq!(window_room_bytes(10, 4, 1000), 6000);
        assert_eq!(window_room_bytes(10, 10, 1000), 0);
        assert_eq!(window_room_bytes(4, 10, 1000), 0, "a window that shrank");
        assert_eq!(
            window_room_bytes(u32::MAX, 0, u32::MAX),
            usize::try_from(u64::from(u32::MAX) * u64::from(u32::MAX)).unwrap()
        );
    }

    /// A connected idle socket has its whole initial window (10 segments
    /// by default) free; a listening one has no connection to ask about
    /// but answers (all zero).
    #[test]
    fn an_idle_connection_has_its_window_free() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_a, _) = l.accept().unwrap();
        let room = tcp_send_window_room_bytes(&c).unwrap();
        assert!(room >= 2 * 536, "{room}");
        assert!(tcp_send_window_room_bytes(&l).is_ok());
    }

    /// Under a low-water mark a socket is not readable (poll, as epoll
    /// asks) until that many bytes wait, and a read still takes fewer.
    #[test]
    fn a_low_water_mark_holds_readiness_until_enough_bytes_wait() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut rx, _) = l.accept().unwrap();
        let readable = |s: &TcpStream| {
            let mut p = libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, 200) };
            n == 1 && p.revents & libc::POLLIN != 0
        };
        set_recv_low_water(&rx, 1000).unwrap();
        tx.write_all(&[7; 10]).unwrap();
        assert!(!readable(&rx), "10 bytes under a mark of 1000");
        tx.write_all(&[7; 2000]).unwrap();
        assert!(readable(&rx));
        set_recv_low_water(&rx, 1).unwrap();
        rx.set_nonblocking(true).unwrap();
        let mut b = [0; 4096];
        assert_eq!(rx.read(&mut b).unwrap(), 2010);
        tx.write_all(&[7; 10]).unwrap();
        assert!(readable(&rx), "any byte under the default mark");
    }

    #[test]
    fn names_are_checked_before_any_socket() {
        assert!(check_tcp_congestion_name("cubic").is_ok());
        assert!(check_tcp_congestion_name("bbr").is_ok());
        assert!(check_tcp_congestion_name("x-y_2").is_ok());
        let e = check_tcp_congestion_name("").unwrap_err();
        assert!(e.contains("1 to 15 bytes"), "{e}");
        assert!(check_tcp_congestion_name("sixteen-bytes-xx").is_err());
        let e = check_tcp_congestion_name("cu bic").unwrap_err();
        assert!(e.contains("' '"), "{e}");
        assert!(check_tcp_congestion_name("cubic\0").is_err());
    }

    /// Reno is built into every Linux kernel, so it can be set whatever the
    /// system default; the listener's choice passes to accepted sockets.
    #[test]
    fn a_listener_choice_passes_to_the_sockets_it_accepts() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        set_tcp_congestion(&l, "reno").unwrap();
        assert_eq!(tcp_congestion(&l).unwrap(), "reno");
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(tcp_congestion(&s).unwrap(), "reno");
        // The connecting side keeps the system default.
        if let Some(sys) = system_tcp_congestion() {
            assert_eq!(tcp_congestion(&c).unwrap(), sys);
        }
    }

    #[test]
    fn an_unknown_algorithm_is_refused_by_the_kernel() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let before = tcp_congestion(&l).unwrap();
        let e = set_tcp_congestion(&l, "no-such-cc").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert_eq!(tcp_congestion(&l).unwrap(), before);
    }

    #[test]
    fn the_kernel_lists_what_it_offers() {
        let avail = available_tcp_congestion();
        assert!(avail.iter().any(|a| a == "reno"), "{avail:?}");
        let sys = system_tcp_congestion().unwrap();
        assert!(avail.contains(&sys), "{sys} not in {avail:?}");
    }
}
