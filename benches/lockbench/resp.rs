//! A tiny RESP2 client over TCP: encode commands into a buffer (so many can be
//! pipelined with one write), read replies one by one. Enough for the bench,
//! and cheap enough that the client is not what limits the server.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

/// One reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    /// A simple string (`+OK`) or a bulk string.
    Str(Vec<u8>),
    Err(String),
    Array(Vec<Reply>),
}

impl Reply {
    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            _ => None,
        }
    }

    pub fn is(&self, s: &str) -> bool {
        matches!(self, Reply::Str(v) if v == s.as_bytes())
    }

    pub fn text(&self) -> String {
        match self {
            Reply::Str(v) => String::from_utf8_lossy(v).into_owned(),
            other => format!("{other:?}"),
        }
    }

    /// A short description for error messages.
    pub fn show(&self) -> String {
        let s = format!("{self:?}");
        s.chars().take(200).collect()
    }
}

/// One argument of a command: bytes, or a key made of a prefix and a number
/// (written without allocating: the bench encodes millions of them).
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

/// Appends one command made of plain strings.
pub fn encode_strs(buf: &mut Vec<u8>, args: &[&[u8]]) {
    let args: Vec<Arg> = args.iter().map(|a| Arg::B(a)).collect();
    encode(buf, &args);
}

/// One connection to 127.0.0.1.
pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    out: Vec<u8>,
    line: Vec<u8>,
}

impl Conn {
    pub fn connect(port: u16) -> io::Result<Conn> {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let writer = stream.try_clone()?;
        Ok(Conn {
            reader: BufReader::with_capacity(64 * 1024, stream),
            writer,
            out: Vec::with_capacity(64 * 1024),
            line: Vec::with_capacity(128),
        })
    }

    pub fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        self.writer.set_read_timeout(Some(t))
    }

    /// The buffer of commands not yet sent.
    pub fn out(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    pub fn push(&mut self, args: &[&[u8]]) {
        encode_strs(&mut self.out, args);
    }

    /// Sends every pushed command.
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.writer.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    fn read_line(&mut self) -> io::Result<()> {
        self.line.clear();
        let n = self.reader.read_until(b'\n', &mut self.line)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed the connection",
            ));
        }
        if self.line.len() < 3 || !self.line.ends_with(b"\r\n") {
            return Err(bad("a reply line without CRLF"));
        }
        self.line.truncate(self.line.len() - 2);
        Ok(())
    }

    /// Reads one reply.
    pub fn read(&mut self) -> io::Result<Reply> {
        self.read_line()?;
        let kind = self.line[0];
        let rest = &self.line[1..];
        match kind {
            b'+' => Ok(Reply::Str(rest.to_vec())),
            b'-' => Ok(Reply::Err(String::from_utf8_lossy(rest).into_owned())),
            b':' => parse_int(rest).map(Reply::Int),
            b'$' => {
                let len = parse_int(rest)?;
                if len < 0 {
                    return Ok(Reply::Nil);
                }
                let mut data = vec![0u8; len as usize + 2];
                self.reader.read_exact(&mut data)?;
                data.truncate(len as usize);
                Ok(Reply::Str(data))
            }
            b'*' => {
                let len = parse_int(rest)?;
                if len < 0 {
                    return Ok(Reply::Nil);
                }
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.read()?);
                }
                Ok(Reply::Array(items))
            }
            _ => Err(bad("an unknown reply type")),
        }
    }

    /// Sends one command and reads its reply.
    pub fn cmd(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        self.push(args);
        self.flush()?;
        self.read()
    }

    /// As `cmd`, but an error reply is an error.
    pub fn ok(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        match self.cmd(args)? {
            Reply::Err(e) => Err(io::Error::other(format!(
                "{}: {e}",
                String::from_utf8_lossy(args[0])
            ))),
            r => Ok(r),
        }
    }

    /// One field of `INFO <section>`.
    pub fn info_field(&mut self, section: &str, field: &str) -> io::Result<String> {
        let text = self.ok(&[b"INFO", section.as_bytes()])?.text();
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
            .ok_or_else(|| io::Error::other(format!("INFO has no {field}")))
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("RESP: {what}"))
}

fn parse_int(s: &[u8]) -> io::Result<i64> {
    let (neg, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() {
        return Err(bad("an empty integer"));
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(bad("a malformed integer"));
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(i64::from(d - b'0')))
            .ok_or_else(|| bad("an integer out of range"))?;
    }
    Ok(if neg { -n } else { n })
}
