//! DUMP payloads: reading one, editing its body under a fresh CRC-64
//! (another token, a future record or type version), and building one
//! from a record's bytes.

use super::*;

/// CRC-64/Jones as used by DUMP payloads (reflected, init 0, no xor-out).
pub fn crc64(data: &[u8]) -> u64 {
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc = 0u64;
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

/// The DUMP payload of `key`.
pub fn dump_payload(c: &mut redis::Connection, key: &str) -> Vec<u8> {
    match ok(c, &["DUMP", key]) {
        Value::BulkString(b) => b,
        other => panic!("DUMP {key}: {other:?}"),
    }
}

/// Rewrites a DUMP payload's body with `edit` and recomputes its trailing
/// checksum, so the server's own checks pass and the module's loader sees
/// the edited bytes.
pub fn edit_payload(payload: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let n = payload.len();
    assert_eq!(
        u64::from_le_bytes(payload[n - 8..].try_into().unwrap()),
        crc64(&payload[..n - 8]),
        "DUMP checksum is not the CRC-64 computed here"
    );
    let mut body = payload[..n - 8].to_vec();
    edit(&mut body);
    let crc = crc64(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

/// A DUMP payload of the lease whose token is `old`, rewritten to carry
/// token `new` (the record stores it as 8 little-endian bytes), with the
/// checksum recomputed.
pub fn with_token(payload: &[u8], old: i64, new: i64) -> Vec<u8> {
    edit_payload(payload, |b| {
        let at = b
            .windows(8)
            .position(|w| w == (old as u64).to_le_bytes())
            .expect("token bytes in the DUMP payload");
        b[at..at + 8].copy_from_slice(&(new as u64).to_le_bytes());
    })
}

/// A DUMP payload holding the lease record `record` (its encoded bytes,
/// stored uncompressed), built on `template`, a DUMP payload of any lease
/// key of the same server: its type byte and module id, the module's
/// string opcode, the record, the module's EOF opcode, then the template's
/// RDB version and a fresh checksum.
pub fn module_payload(template: &[u8], record: &[u8]) -> Vec<u8> {
    assert_eq!(template[0], 7, "RDB_TYPE_MODULE_2");
    assert_eq!(template[1], 0x81, "64-bit module id");
    let n = template.len();
    let mut body = template[..10].to_vec();
    body.push(5); // RDB_MODULE_OPCODE_STRING
    let len = record.len();
    if len < 64 {
        body.push(len as u8);
    } else if len < 16384 {
        body.extend_from_slice(&[0x40 | (len >> 8) as u8, len as u8]);
    } else {
        body.push(0x80);
        body.extend_from_slice(&(len as u32).to_be_bytes());
    }
    body.extend_from_slice(record);
    body.push(0); // RDB_MODULE_OPCODE_EOF
    body.extend_from_slice(&template[n - 10..n - 8]);
    let crc = crc64(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

/// The record version 2 encoding (a counting or shared lease), written
/// here from its documented layout: version 2, mode (1 LIMIT, 2 SHARED),
/// limit (u32, 0 for SHARED), holder count (u32), then per holder sorted by
/// token: token (u64), deadline (i64, unix ms), owner length (u16), owner.
/// All integers little-endian.
pub fn holders_record(limit: u32, holders: &[(&[u8], u64, i64)]) -> Vec<u8> {
    let mut out = vec![2, if limit == 0 { 2 } else { 1 }];
    out.extend_from_slice(&limit.to_le_bytes());
    out.extend_from_slice(&(holders.len() as u32).to_le_bytes());
    for (owner, token, deadline) in holders {
        out.extend_from_slice(&token.to_le_bytes());
        out.extend_from_slice(&deadline.to_le_bytes());
        out.extend_from_slice(&(owner.len() as u16).to_le_bytes());
        out.extend_from_slice(owner);
    }
    out
}

/// The first record version this build does not read (1 is an exclusive
/// lease, 2 a counting or shared one).
pub const FUTURE_RECORD_VERSION: u8 = 3;

/// A DUMP payload of an exclusive lease held by `owner` whose record
/// version (the first byte of the stored string holding the encoded record,
/// found by the owner bytes that follow it) is raised from 1 to a version
/// from the future.
pub fn future_record(payload: &[u8], owner: &[u8]) -> Vec<u8> {
    edit_payload(payload, |b| {
        let owner_at = b.windows(owner.len()).position(|w| w == owner).unwrap();
        let version_at = owner_at - 2 - 8 - 8 - 1;
        assert_eq!(b[version_at], 1);
        b[version_at] = FUTURE_RECORD_VERSION;
    })
}

/// A DUMP payload whose type encoding version (the low 10 bits of the
/// 64-bit module id, stored after the RDB type byte as a 64-bit length:
/// 0x81 and 8 big-endian bytes) is raised from 1 to 2.
pub fn future_type(payload: &[u8]) -> Vec<u8> {
    edit_payload(payload, |b| {
        assert_eq!(b[1], 0x81, "64-bit length encoding of the module id");
        let mut id = u64::from_be_bytes(b[2..10].try_into().unwrap());
        assert_eq!(id & 1023, 1, "encoding version 1");
        id = (id & !1023) | 2;
        b[2..10].copy_from_slice(&id.to_be_bytes());
    })
}
