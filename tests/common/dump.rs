//! DUMP payloads: the CRC-64 footer, splitting and re-signing a payload.

/// Redis's CRC-64 (Jones polynomial, reflected, init 0, no final xor), as used
/// in the footer of DUMP payloads.
pub fn crc64_redis(data: &[u8]) -> u64 {
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5; // 0xad93d23594c935a9 reflected
    let mut crc: u64 = 0;
    for &b in data {
        crc ^= b as u64;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// Splits a DUMP payload into (body, rdb version bytes); panics if too short.
pub fn dump_parts(payload: &[u8]) -> (&[u8], [u8; 2]) {
    assert!(
        payload.len() > 10,
        "a DUMP payload is longer than its footer"
    );
    let body_end = payload.len() - 10;
    let version = [payload[body_end], payload[body_end + 1]];
    (&payload[..body_end], version)
}

/// Builds a DUMP payload with a valid footer around `body`.
pub fn dump_with_footer(body: &[u8], version: [u8; 2]) -> Vec<u8> {
    let mut p = body.to_vec();
    p.extend_from_slice(&version);
    let crc = crc64_redis(&p);
    p.extend_from_slice(&crc.to_le_bytes());
    p
}

/// A length or unsigned number as the RDB writes it (`rdbSaveLen`).
pub fn rdb_len(n: u64) -> Vec<u8> {
    match n {
        0..=0x3f => vec![n as u8],
        0x40..=0x3fff => vec![0x40 | (n >> 8) as u8, n as u8],
        0x4000..=0xffff_ffff => {
            let mut v = vec![0x80];
            v.extend_from_slice(&(n as u32).to_be_bytes());
            v
        }
        _ => {
            let mut v = vec![0x81];
            v.extend_from_slice(&n.to_be_bytes());
            v
        }
    }
}

/// One holder of a lock value as encodings 1 and 2 write it.
pub struct OldHolder {
    pub owner: Vec<u8>,
    pub holds: u64,
    pub token: u64,
    pub deadline: u64,
}

/// The body of a DUMP payload of a lock value in encoding 1 or 2 (0.1 and
/// 0.2: field by field): `head` is the first 10 bytes of any lock's DUMP
/// payload (the value's type and the module type's id), relabelled here to
/// `encver`.
pub fn old_lock_body(
    head: &[u8],
    encver: u16,
    mode: u64,
    limit: Option<u64>,
    holders: &[OldHolder],
) -> Vec<u8> {
    assert_eq!(head[1], 0x81, "a module value");
    let mut body = head[..10].to_vec();
    body[8] = (body[8] & !0x03) | (encver >> 8) as u8;
    body[9] = encver as u8;
    // Module field opcodes: 2 an unsigned number, 5 a string, 0 the end.
    let uint = |body: &mut Vec<u8>, n: u64| {
        body.push(2);
        body.extend(rdb_len(n));
    };
    uint(&mut body, mode);
    if let Some(limit) = limit {
        uint(&mut body, limit);
    }
    uint(&mut body, holders.len() as u64);
    for h in holders {
        body.push(5);
        body.extend(rdb_len(h.owner.len() as u64));
        body.extend_from_slice(&h.owner);
        uint(&mut body, h.holds);
        uint(&mut body, h.token);
        uint(&mut body, h.deadline);
    }
    body.push(0);
    body
}

/// `signed` (a DUMP payload or an RDB file: both end in the CRC-64 of all
/// before it) with every occurrence of `from` replaced by `to` (same
/// length), and the CRC made right again: what Redis takes as well-formed.
/// Panics when `from` is not there.
pub fn with_bytes_replaced(signed: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len(), "a replacement of the same length");
    let mut body = signed[..signed.len() - 8].to_vec();
    let mut found = 0;
    let mut i = 0;
    while i + from.len() <= body.len() {
        if body[i..i + from.len()] == *from {
            body[i..i + from.len()].copy_from_slice(to);
            found += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    assert!(found > 0, "{from:02x?} not found");
    let crc = crc64_redis(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}
