//! The raw RESP2/RESP3 client: [`Conn`] and its parsed [`Reply`]. Raw on
//! purpose: tests send bytes no normal client would.

use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use super::*;

/// One RESP2 or RESP3 reply.
#[derive(Clone, PartialEq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// Null bulk, null array (RESP2) or null (RESP3).
    Nil,
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
    Set(Vec<Reply>),
    Push(Vec<Reply>),
    Double(String),
    Bool(bool),
    Verbatim(String, Vec<u8>),
    BigNumber(String),
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Status(s) => write!(f, "+{s}"),
            Reply::Error(s) => write!(f, "-{s}"),
            Reply::Int(i) => write!(f, "{i}"),
            Reply::Bulk(b) => write!(f, "{:?}", show(b)),
            Reply::Nil => write!(f, "nil"),
            Reply::Array(a) => f.debug_list().entries(a).finish(),
            Reply::Set(a) => write!(f, "set{:?}", a),
            Reply::Push(a) => write!(f, "push{:?}", a),
            Reply::Map(m) => f
                .debug_map()
                .entries(m.iter().map(|(k, v)| (k, v)))
                .finish(),
            Reply::Double(d) => write!(f, ",{d}"),
            Reply::Bool(b) => write!(f, "#{b}"),
            Reply::Verbatim(fmt_, b) => write!(f, "={fmt_}:{:?}", show(b)),
            Reply::BigNumber(n) => write!(f, "({n}"),
        }
    }
}

/// Bytes shown as text with escapes.
pub fn show(b: &[u8]) -> String {
    b.iter()
        .flat_map(|&c| std::ascii::escape_default(c))
        .map(char::from)
        .collect()
}

impl Reply {
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Nil)
    }

    pub fn is_err(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// The integer; panics otherwise.
    pub fn int(&self) -> i64 {
        match self {
            Reply::Int(i) => *i,
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }

    /// The error text; panics otherwise.
    pub fn err(&self) -> &str {
        match self {
            Reply::Error(e) => e,
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    /// The bytes of a bulk, status or verbatim string; panics otherwise.
    pub fn bulk(&self) -> &[u8] {
        match self {
            Reply::Bulk(b) | Reply::Verbatim(_, b) => b,
            Reply::Status(s) => s.as_bytes(),
            other => panic!("expected a string reply, got {other:?}"),
        }
    }

    /// A string reply as UTF-8 (lossy).
    pub fn str(&self) -> String {
        String::from_utf8_lossy(self.bulk()).into_owned()
    }

    /// The elements of an array, set or push; panics otherwise.
    pub fn array(&self) -> &[Reply] {
        match self {
            Reply::Array(a) | Reply::Set(a) | Reply::Push(a) => a,
            other => panic!("expected an array reply, got {other:?}"),
        }
    }

    /// Panics unless the reply is `+OK`.
    pub fn ok(&self) -> &Self {
        match self {
            Reply::Status(s) if s == "OK" => self,
            other => panic!("expected +OK, got {other:?}"),
        }
    }

    /// A RESP3 map, or a RESP2 flat array of key/value pairs, as pairs with
    /// string keys; panics otherwise.
    pub fn pairs(&self) -> Vec<(String, Reply)> {
        match self {
            Reply::Map(m) => m.iter().map(|(k, v)| (k.str(), v.clone())).collect(),
            Reply::Array(a) => {
                assert!(a.len() % 2 == 0, "odd-length array is not a map: {self:?}");
                a.chunks(2).map(|p| (p[0].str(), p[1].clone())).collect()
            }
            other => panic!("expected a map reply, got {other:?}"),
        }
    }

    /// The value for `key` in [`Reply::pairs`].
    pub fn get(&self, key: &str) -> Option<Reply> {
        self.pairs()
            .into_iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    }

    /// The integer, if it is one (the bench checks without panicking).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// A status or bulk string equal to `s`.
    pub fn is(&self, s: &str) -> bool {
        match self {
            Reply::Status(x) => x == s,
            Reply::Bulk(b) => b == s.as_bytes(),
            _ => false,
        }
    }

    /// A string reply as text; anything else as it prints.
    pub fn text(&self) -> String {
        match self {
            Reply::Status(s) => s.clone(),
            Reply::Bulk(b) | Reply::Verbatim(_, b) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        }
    }

    /// The reply as it prints, cut at 200 characters (error messages).
    pub fn show(&self) -> String {
        format!("{self:?}").chars().take(200).collect()
    }
}

// ---------------------------------------------------------------------------
// Encoding (pipelines build commands without allocating per argument)
// ---------------------------------------------------------------------------

/// One argument: bytes, or a key made of a prefix and a number.
pub enum Arg<'a> {
    B(&'a [u8]),
    K(&'a [u8], usize),
}

fn push_decimal(buf: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[i..]);
}

fn decimal_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// Appends one command in RESP to `buf`.
pub fn encode(buf: &mut Vec<u8>, args: &[Arg]) {
    buf.push(b'*');
    push_decimal(buf, args.len());
    buf.extend_from_slice(b"\r\n");
    for arg in args {
        match arg {
            Arg::B(b) => {
                buf.push(b'$');
                push_decimal(buf, b.len());
                buf.extend_from_slice(b"\r\n");
                buf.extend_from_slice(b);
            }
            Arg::K(prefix, n) => {
                buf.push(b'$');
                push_decimal(buf, prefix.len() + decimal_len(*n));
                buf.extend_from_slice(b"\r\n");
                buf.extend_from_slice(prefix);
                push_decimal(buf, *n);
            }
        }
        buf.extend_from_slice(b"\r\n");
    }
}

/// [`encode`] for plain byte arguments.
pub fn encode_strs<A: AsRef<[u8]>>(buf: &mut Vec<u8>, args: &[A]) {
    let args: Vec<Arg> = args.iter().map(|a| Arg::B(a.as_ref())).collect();
    encode(buf, &args);
}

// ---------------------------------------------------------------------------
// Connection
// ---------------------------------------------------------------------------

/// One client connection to a test server (127.0.0.1 only).
pub struct Conn {
    reader: BufReader<TcpStream>,
    pub port: u16,
    /// Commands queued by [`Conn::push`] until [`Conn::flush`] (pipelining).
    out: Vec<u8>,
}

impl Conn {
    /// A connection over an open stream to `port`.
    pub fn from_stream(stream: TcpStream, port: u16) -> Conn {
        Conn {
            reader: BufReader::with_capacity(64 * 1024, stream),
            port,
            out: Vec::new(),
        }
    }

    pub fn connect(port: u16) -> Conn {
        Conn::try_connect(port).unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"))
    }

    pub fn try_connect(port: u16) -> std::io::Result<Conn> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(DEFAULT_TIMEOUT))?;
        stream.set_write_timeout(Some(DEFAULT_TIMEOUT))?;
        Ok(Conn::from_stream(stream, port))
    }

    /// Sets the read timeout, without panicking.
    pub fn set_read_timeout(&self, t: Duration) -> std::io::Result<()> {
        self.reader.get_ref().set_read_timeout(Some(t))
    }

    /// The pipeline's buffer: [`encode`] commands into it, then [`Conn::flush`].
    pub fn out(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    /// Queues one command (sent by [`Conn::flush`]).
    pub fn push(&mut self, args: &[&[u8]]) {
        encode_strs(&mut self.out, args);
    }

    /// Sends every queued command in one write.
    pub fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            let out = std::mem::take(&mut self.out);
            self.reader.get_mut().write_all(&out)?;
            self.out = out;
            self.out.clear();
        }
        Ok(())
    }

    /// One command, without panicking (byte-string arguments of any length).
    pub fn call(&mut self, args: &[&[u8]]) -> std::io::Result<Reply> {
        self.try_cmd(args)
    }

    /// One command; an error reply is an `Err` naming the command.
    pub fn ok(&mut self, args: &[&[u8]]) -> std::io::Result<Reply> {
        match self.try_cmd(args)? {
            Reply::Error(e) => Err(std::io::Error::other(format!(
                "{}: {e}",
                args.first().map(|a| show(a)).unwrap_or_default()
            ))),
            r => Ok(r),
        }
    }

    /// One field of `INFO <section>`, without panicking.
    pub fn try_info_field(&mut self, section: &str, field: &str) -> std::io::Result<String> {
        let text = self.ok(&[b"INFO", section.as_bytes()])?.text();
        info_get(&text, field)
            .ok_or_else(|| std::io::Error::other(format!("INFO {section} has no {field}")))
    }

    /// Sets the read timeout for the following replies.
    pub fn set_timeout(&mut self, t: Duration) {
        self.reader
            .get_ref()
            .set_read_timeout(Some(t))
            .expect("set_read_timeout");
    }

    /// Sends one command and reads its reply; panics on I/O errors or timeout.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        match self.try_cmd(args) {
            Ok(r) => r,
            Err(e) => panic!(
                "command {:?} to 127.0.0.1:{}: {e}",
                args.iter().map(|a| show(a.as_ref())).collect::<Vec<_>>(),
                self.port
            ),
        }
    }

    /// Like [`Conn::cmd`] with owned arguments.
    pub fn cmdv(&mut self, args: &[Vec<u8>]) -> Reply {
        self.cmd(args)
    }

    /// A command written as words separated by spaces (no empty or spaced args).
    pub fn line(&mut self, line: &str) -> Reply {
        let args: Vec<&str> = line.split_whitespace().collect();
        self.cmd(&args)
    }

    pub fn try_cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<Reply> {
        self.send(args)?;
        self.read_reply()
    }

    /// Writes one command without reading its reply.
    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<()> {
        let mut buf = Vec::new();
        buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            let a = a.as_ref();
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&buf)?;
        self.reader.get_mut().flush()
    }

    /// Reads one reply (skipping RESP3 attributes).
    pub fn read_reply(&mut self) -> std::io::Result<Reply> {
        loop {
            let (prefix, line) = self.read_line()?;
            if prefix == b'|' {
                // An attribute: a map to skip, then the real reply follows.
                let n = parse_int(&line)?;
                for _ in 0..n * 2 {
                    self.read_reply()?;
                }
                continue;
            }
            return self.parse(prefix, line);
        }
    }

    fn read_line(&mut self) -> std::io::Result<(u8, String)> {
        let mut line = Vec::new();
        let n = self.reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed by the server",
            ));
        }
        if !line.ends_with(b"\r\n") {
            return Err(bad_data(format!("line without CRLF: {:?}", show(&line))));
        }
        line.truncate(line.len() - 2);
        let prefix = line[0];
        Ok((prefix, String::from_utf8_lossy(&line[1..]).into_owned()))
    }

    fn read_exact_crlf(&mut self, len: usize) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len + 2];
        self.reader.read_exact(&mut buf)?;
        if &buf[len..] != b"\r\n" {
            return Err(bad_data("bulk not followed by CRLF".into()));
        }
        buf.truncate(len);
        Ok(buf)
    }

    fn read_n(&mut self, n: i64) -> std::io::Result<Vec<Reply>> {
        (0..n).map(|_| self.read_reply()).collect()
    }

    fn parse(&mut self, prefix: u8, line: String) -> std::io::Result<Reply> {
        Ok(match prefix {
            b'+' => Reply::Status(line),
            b'-' => Reply::Error(line),
            b':' => Reply::Int(parse_int(&line)?),
            b'$' => {
                let n = parse_int(&line)?;
                if n < 0 {
                    Reply::Nil
                } else {
                    Reply::Bulk(self.read_exact_crlf(n as usize)?)
                }
            }
            b'*' => {
                let n = parse_int(&line)?;
                if n < 0 {
                    Reply::Nil
                } else {
                    Reply::Array(self.read_n(n)?)
                }
            }
            b'~' => Reply::Set(self.read_n(parse_int(&line)?)?),
            b'>' => Reply::Push(self.read_n(parse_int(&line)?)?),
            b'%' => {
                let n = parse_int(&line)?;
                let mut m = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let k = self.read_reply()?;
                    let v = self.read_reply()?;
                    m.push((k, v));
                }
                Reply::Map(m)
            }
            b'_' => Reply::Nil,
            b',' => Reply::Double(line),
            b'#' => match line.as_str() {
                "t" => Reply::Bool(true),
                "f" => Reply::Bool(false),
                other => return Err(bad_data(format!("bad boolean {other:?}"))),
            },
            b'(' => Reply::BigNumber(line),
            b'!' => {
                // RESP3 blob error.
                let n = parse_int(&line)?;
                let b = self.read_exact_crlf(n as usize)?;
                Reply::Error(String::from_utf8_lossy(&b).into_owned())
            }
            b'=' => {
                let n = parse_int(&line)?;
                let b = self.read_exact_crlf(n as usize)?;
                if b.len() >= 4 && b[3] == b':' {
                    Reply::Verbatim(
                        String::from_utf8_lossy(&b[..3]).into_owned(),
                        b[4..].to_vec(),
                    )
                } else {
                    Reply::Verbatim(String::new(), b)
                }
            }
            other => return Err(bad_data(format!("unknown reply type {:?}", other as char))),
        })
    }

    /// Switches to RESP3 (`HELLO 3`); returns the server's hello map.
    pub fn hello3(&mut self) -> Reply {
        let r = self.cmd(&["HELLO", "3"]);
        assert!(matches!(r, Reply::Map(_)), "HELLO 3 replied {r:?}");
        r
    }

    /// `INFO <section>` as text.
    pub fn info(&mut self, section: &str) -> String {
        self.cmd(&["INFO", section]).str()
    }

    pub fn info_field(&mut self, section: &str, field: &str) -> String {
        let info = self.info(section);
        info_get(&info, field).unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{info}"))
    }

    /// `LOCK.INFO key`, parsed (either protocol); None when nil.
    pub fn lock_info(&mut self, key: impl AsRef<[u8]>) -> Option<LockInfo> {
        let r = self.cmd(&[b"LOCK.INFO".as_slice(), key.as_ref()]);
        LockInfo::parse(&r)
    }

    /// `PTTL key`.
    pub fn pttl(&mut self, key: impl AsRef<[u8]>) -> i64 {
        self.cmd(&[b"PTTL".as_slice(), key.as_ref()]).int()
    }

    /// `TYPE key` as a string.
    pub fn type_of(&mut self, key: impl AsRef<[u8]>) -> String {
        self.cmd(&[b"TYPE".as_slice(), key.as_ref()]).str()
    }

    /// `LOCK.ACQUIRE key owner ttl`.
    pub fn acquire(&mut self, key: &str, owner: &str, ttl: i64) -> Reply {
        self.cmd(&["LOCK.ACQUIRE", key, owner, &ttl.to_string()])
    }

    /// `LOCK.RACQUIRE key owner ttl`.
    pub fn racquire(&mut self, key: &str, owner: &str, ttl: i64) -> Reply {
        self.cmd(&["LOCK.RACQUIRE", key, owner, &ttl.to_string()])
    }

    /// `LOCK.READ key owner ttl`.
    pub fn read(&mut self, key: &str, owner: &str, ttl: i64) -> Reply {
        self.cmd(&["LOCK.READ", key, owner, &ttl.to_string()])
    }

    /// `LOCK.RELEASE key owner`.
    pub fn release(&mut self, key: &str, owner: &str) -> Reply {
        self.cmd(&["LOCK.RELEASE", key, owner])
    }

    /// `LOCK.RENEW key owner ttl`.
    pub fn renew(&mut self, key: &str, owner: &str, ttl: i64) -> Reply {
        self.cmd(&["LOCK.RENEW", key, owner, &ttl.to_string()])
    }

    pub fn ping(&mut self) {
        let r = self.cmd(&["PING"]);
        assert_eq!(r, Reply::Status("PONG".into()), "PING");
    }
}

fn bad_data(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

fn parse_int(s: &str) -> std::io::Result<i64> {
    s.parse()
        .map_err(|_| bad_data(format!("bad integer in reply: {s:?}")))
}
