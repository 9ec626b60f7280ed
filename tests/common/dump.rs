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
