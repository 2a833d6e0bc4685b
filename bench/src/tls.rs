//! `--tls-ca`: connections upgraded to TLS with IDENTIFY `tls_v1` (rustls client), as
//! nsqd clients do: magic, IDENTIFY, the JSON reply in clear, the handshake, then `OK`
//! over TLS. A producer's writer and ack-reader threads share one session
//! ([`Stream::try_clone`]); only the writer thread sends records.

use rustls::pki_types::ServerName;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A plain socket, or a TLS session shared by the threads of one connection.
pub enum Stream {
    Plain(TcpStream),
    Tls(Arc<Mutex<TlsState>>, TcpStream),
}

/// The session and the ciphertext read but not given to it yet (it takes a record at a
/// time, as its plaintext buffer drains).
pub struct TlsState {
    conn: rustls::ClientConnection,
    pending: Vec<u8>,
}

/// The client configuration trusting the CA certificates in `path` (PEM).
// A `String` error: CLI-only, printed once before the bench exits.
pub fn client_config(path: &std::path::Path) -> Result<Arc<rustls::ClientConfig>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut &pem[..]) {
        let c = c.map_err(|e| format!("{}: {e}", path.display()))?;
        roots
            .add(c)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(cfg))
}

fn read_frame(s: &mut impl Read) -> io::Result<(i32, Vec<u8>)> {
    let mut hdr = [0u8; 8];
    s.read_exact(&mut hdr)?;
    let size = i32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
    let ft = i32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
    if !(4..=(1 << 20)).contains(&size) {
        return Err(io::Error::other(format!("bad frame size {size}")));
    }
    let mut data = vec![0u8; size as usize - 4];
    s.read_exact(&mut data)?;
    Ok((ft, data))
}

/// Sends the magic and IDENTIFY (`identify`: a JSON object without the closing brace)
/// asking for TLS, and upgrades. `host` is the name the certificate must carry.
pub fn upgrade(
    mut sock: TcpStream,
    cfg: &Arc<rustls::ClientConfig>,
    host: &str,
    identify: &str,
) -> io::Result<Stream> {
    let json = format!(r#"{identify},"feature_negotiation":true,"tls_v1":true}}"#);
    let mut out = Vec::new();
    nsq_wire::client::encode_magic(&mut out);
    nsq_wire::client::encode_identify(&mut out, json.as_bytes());
    sock.write_all(&out)?;
    let (ft, reply) = read_frame(&mut sock)?;
    if ft != 0 || !reply.windows(13).any(|w| w == b"\"tls_v1\":true") {
        return Err(io::Error::other(format!(
            "the server did not grant tls_v1: {}",
            String::from_utf8_lossy(&reply)
        )));
    }
    let name = ServerName::try_from(host.to_string()).map_err(io::Error::other)?;
    let mut conn = rustls::ClientConnection::new(cfg.clone(), name).map_err(io::Error::other)?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)?;
    }
    let state = TlsState {
        conn,
        pending: Vec::new(),
    };
    let mut s = Stream::Tls(Arc::new(Mutex::new(state)), sock);
    let (ft, ok) = read_frame(&mut s)?;
    if (ft, ok.as_slice()) != (0, b"OK".as_slice()) {
        return Err(io::Error::other("no OK after the TLS handshake"));
    }
    Ok(s)
}

impl Stream {
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(..))
    }

    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Plain(s) => Stream::Plain(s.try_clone()?),
            Stream::Tls(c, s) => Stream::Tls(c.clone(), s.try_clone()?),
        })
    }

    fn sock(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) | Stream::Tls(_, s) => s,
        }
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.sock().shutdown(how)
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.sock().set_read_timeout(d)
    }
}

fn lock(c: &Mutex<TlsState>) -> std::sync::MutexGuard<'_, TlsState> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (c, mut s) = match self {
            Stream::Plain(s) => return s.read(buf),
            Stream::Tls(c, s) => (c.clone(), &*s),
        };
        let mut raw = vec![0u8; 64 * 1024];
        loop {
            {
                let mut st = lock(&c);
                match st.conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                    Err(e) => return Err(e),
                }
                if !st.pending.is_empty() {
                    let TlsState { conn, pending } = &mut *st;
                    let mut rd = &pending[..];
                    let r = conn.read_tls(&mut rd);
                    let used = pending.len() - rd.len();
                    pending.drain(..used);
                    if r? == 0 {
                        return Err(io::Error::other("TLS: data not accepted"));
                    }
                    conn.process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    continue;
                }
            }
            let n = s.read(&mut raw)?;
            let mut st = lock(&c);
            if n == 0 {
                let _ = st.conn.read_tls(&mut &[][..]);
                if st.conn.reader().read(buf).is_err() {
                    return Ok(0);
                }
                continue;
            }
            st.pending.extend_from_slice(&raw[..n]);
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let (c, mut s) = match self {
            Stream::Plain(s) => return s.write_all(buf),
            Stream::Tls(c, s) => (c.clone(), &*s),
        };
        let mut out = Vec::with_capacity(buf.len() + 1024);
        {
            let mut st = lock(&c);
            st.conn.writer().write_all(buf)?;
            while st.conn.wants_write() {
                st.conn.write_tls(&mut out)?;
            }
        }
        s.write_all(&out)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
